"""``byteps-prophet calibrate``: measure an engine's traits on the local cluster, write an engine profile."""
from __future__ import annotations

import json
import os
import sys
import time

from byteps_prophet.errors import UserError

BACKENDS = ("byteps", "kvstore", "gloo")
# Which cluster engine serves each backend (gloo: the workers talk directly; the scheduler and server
# hosts of the A/B's gloo compose file only idle).
CLUSTER_ENGINE = {"byteps": "byteps", "kvstore": "mxnet", "gloo": "mxnet"}


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "calibrate", help="measure an engine's traits on the local cluster and write an engine profile",
        description="Start the local cluster (namespaces, tc-shaped links), run short micro-benchmarks on "
                    "the real engine on every worker (back-to-back ops of several sizes, ops alone, a small "
                    "op before a large one, compute while bytes move), and write the engine profile "
                    "(`simulate --engine FILE`). About a minute. See docs/ENGINE.md.")
    p.add_argument("--backend", default=None, metavar="BACKEND",
                   help="byteps (torch BytePS push_pull), kvstore (MXNet dist_sync) or gloo (torch.distributed)")
    p.add_argument("--workers", type=int, default=2, metavar="N", help="worker hosts (default 2)")
    p.add_argument("--servers", type=int, default=1, metavar="S",
                   help="parameter-server hosts (default 1; gloo has none, its idle server host is ignored)")
    p.add_argument("--bandwidth", default="1gbit", metavar="RATE",
                   help="each link, each direction, tc units (default 1gbit; none = unshaped)")
    p.add_argument("--out", default=None, metavar="FILE", help="engine profile to write (default engine_<backend>.json)")
    p.add_argument("--json", action="store_true", help="print the engine profile as JSON instead of the table")
    p.add_argument("--timeout", type=float, default=300.0, metavar="SEC", help="stop the probe after SEC seconds")
    p.add_argument("--no-netns", action="store_true", help="plain loopback (no shaping)")
    p.add_argument("--tcp-congestion", default=None, metavar="ALGO",
                   help="TCP congestion control of the cluster's hosts, e.g. cubic, bbr (default: this machine's; "
                        "the one used is recorded in the profile's measured.setup)")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="calibrate N times, each on a fresh cluster, and keep each trait's median (yes/no: "
                        "what most read); the spread is printed and kept in measured.derived (default 1)")
    p.add_argument("--refit", default=None, metavar="FILE",
                   help="no cluster: fit the traits again from the raw timings an engine profile keeps "
                        "(measured.raw), with this version's rules; written to --out (default: FILE itself)")
    p.set_defaults(func=run)


def _check(args) -> tuple[str, float | None]:
    from byteps_prophet.units import parse_bandwidth

    backend = (args.backend or "").strip().lower()
    if backend not in BACKENDS:
        raise UserError(f"--backend {args.backend!r} is not a backend; valid: {', '.join(BACKENDS)}")
    if args.workers < 2:
        raise UserError(f"--workers {args.workers} is invalid; valid: an integer >= 2 (calibration needs communication)")
    if args.servers < 1:
        raise UserError(f"--servers {args.servers} is invalid; valid: an integer >= 1")
    if args.repeat < 1:
        raise UserError(f"--repeat {args.repeat} is invalid; valid: an integer >= 1")
    if not args.timeout > 0:
        raise UserError(f"--timeout {args.timeout:g} is invalid; valid: a positive number of seconds")
    bits = parse_bandwidth(args.bandwidth, "--bandwidth")
    out = args.out or f"engine_{backend}.json"
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise UserError(f"--out {out!r}: folder {folder!r} does not exist or is not writable; valid: a file "
                        f"in a writable folder")
    args.out = out
    return backend, (bits / 8 if bits else None)


def probe_command(backend: str, nominal: float | None) -> list[str]:
    return [sys.executable, "-m", "byteps_prophet.calibrate.probe", "--backend", backend,
            "--rate", f"{nominal or 0:.0f}"]


def parse_probe(lines: list[str]) -> dict | None:
    for line in reversed(lines):
        line = line.strip()
        if line.startswith("{") and '"calibration"' in line:
            try:
                return json.loads(line)["calibration"]
            except (ValueError, KeyError):
                continue
    return None


def measure(backend: str, *, workers: int, servers: int, bandwidth: str, nominal: float | None,
            timeout: float, netns: bool | None, log=None, tcp_congestion: str | None = None) -> tuple[dict, dict]:
    """Run the probe on a fresh cluster; ``(raw probe output, setup)``. Torn down on any failure."""
    from byteps_prophet.cluster.compose import GLOO_COMPOSE
    from byteps_prophet.cluster import Cluster, ClusterSpec

    log = log or (lambda message: print(message, file=sys.stderr, flush=True))
    spec = ClusterSpec(workers=workers, servers=servers, bandwidth=bandwidth, engine=CLUSTER_ENGINE[backend],
                       compose=GLOO_COMPOSE if backend == "gloo" else None, netns=netns, grace=1.0,
                       tcp_congestion=tcp_congestion)

    def sink(role: str, line: str) -> None:
        if role == "worker-0" and line.startswith("#calib"):
            log(f"calibrate: {line[len('#calib'):].strip()}")

    started = time.monotonic()
    with Cluster(spec, output=sink, warn=log) as cluster:
        shaped = bool(cluster.use_netns) and nominal is not None
        tcp = cluster.tcp_congestion()
        log(f"calibrate: cluster up ({workers} workers, {cluster.num_servers} servers, "
            f"{bandwidth if shaped else 'unshaped loopback'}); probing {backend}")
        env = {"BYTEPS_PROPHET_TIMEOUT": str(int(min(timeout, 600)))}
        result = cluster.run(probe_command(backend, nominal if shaped else None), env=env, timeout=timeout)
    raw = parse_probe(result.output.get("worker-0", []))
    if not result.ok or raw is None:
        role = result.failed or "worker-0"
        tail = " | ".join(result.output.get(role, [])[-3:])
        raise UserError(f"calibration failed: {role}: {result.reason}; last output: {tail[-300:]}")
    setup = {"backend": backend, "workers": workers, "servers": servers if backend != "gloo" else 0,
             "bandwidth": bandwidth if shaped else "none", "netns": bool(shaped),
             "nominal_bytes_per_s": nominal if shaped else None, "tcp_congestion_control": tcp,
             "wall_s": round(time.monotonic() - started, 2)}
    return raw, setup


def refit(args) -> int:
    """``--refit FILE``: the traits again from the profile's own raw timings (no cluster)."""
    from byteps_prophet.core.traits import ConfigError, load_engine

    path = args.refit
    load_engine(path)  # one line on a missing or malformed file
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    measured = doc.get("measured") if isinstance(doc.get("measured"), dict) else {}
    raws = measured.get("raws") if "raws" in measured else [measured.get("raw")]
    if not isinstance(raws, list) or not raws or not all(isinstance(raw, dict) for raw in raws):
        raise ConfigError(f"--refit {path!r}: the profile keeps no raw timings (measured.raw or measured.raws); "
                          f"valid: a profile written by `byteps-prophet calibrate`")
    if args.backend and args.backend.strip().lower() != raws[0].get("backend"):
        raise UserError(f"--backend {args.backend!r} does not match the profile's {raws[0].get('backend')!r}; "
                        f"valid: {raws[0].get('backend')!r} or no --backend")
    nominal = (measured.get("setup") or {}).get("nominal_bytes_per_s")
    traits, derived = fit(raws, nominal)
    kept = {k: v for k, v in measured.items() if k not in ("derived", "raw", "raws")}
    out = args.out or path
    return _write(out, traits, {**kept, "derived": derived, **_raw_record(raws)}, nominal,
                  args.json, f"re-fitted from {path}")


def fit(raws: list[dict], nominal: float | None):
    """The traits of one calibration, or the median of several (``--repeat``)."""
    from byteps_prophet.calibrate.fit import traits_from, traits_from_repeats

    if len(raws) == 1:
        return traits_from(raws[0], nominal_bytes_per_s=nominal)
    return traits_from_repeats(raws, nominal_bytes_per_s=nominal)


def _raw_record(raws: list[dict]) -> dict:
    """The probe outputs as the profile keeps them: ``raw``, or ``raws`` for several."""
    return {"raw": raws[0]} if len(raws) == 1 else {"raws": raws}


def _write(out: str, traits, measured: dict, nominal: float | None, as_json: bool, how: str) -> int:
    from byteps_prophet.calibrate.fit import format_table, repeat_spread
    from byteps_prophet.core.traits import engine_document, save_engine

    save_engine(out, traits, measured)
    if as_json:
        print(json.dumps(engine_document(traits, measured)))
        return 0
    print(format_table(traits, measured["derived"], nominal))
    repeats = measured["derived"].get("repeats")
    if repeats:
        spread = repeat_spread(measured["derived"])
        print(f"  the median of {len(repeats)} calibrations" + (f"; they read {', '.join(spread)}" if spread else ""))
    print(f"engine profile: {out} ({how})")
    return 0


def run(args) -> int:
    if args.refit:
        return refit(args)
    if not args.backend:
        raise UserError(f"--backend is required; valid: {', '.join(BACKENDS)} (or --refit FILE)")
    backend, nominal = _check(args)
    raws, started = [], time.monotonic()
    for n in range(args.repeat):
        if args.repeat > 1:
            print(f"calibrate: calibration {n + 1} of {args.repeat}", file=sys.stderr, flush=True)
        raw, setup = measure(backend, workers=args.workers, servers=args.servers, bandwidth=args.bandwidth,
                             nominal=nominal, timeout=args.timeout, netns=False if args.no_netns else None,
                             tcp_congestion=args.tcp_congestion)
        raws.append(raw)
    setup = {**setup, "repeat": args.repeat, "wall_s": round(time.monotonic() - started, 2)}
    traits, derived = fit(raws, setup["nominal_bytes_per_s"])
    measured = {"setup": setup, "derived": derived, **_raw_record(raws)}
    return _write(args.out, traits, measured, setup["nominal_bytes_per_s"], args.json,
                  f"calibrated in {setup['wall_s']:.0f}s")
