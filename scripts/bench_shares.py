#!/usr/bin/env python3
"""Two BytePS workers bursting together: do they get equal shares of the server's link, and what does
a lead buy the worker ahead?

The simulator shares each direction of a server's link equally between the workers' connections
(``SharedServerNetwork``, processor sharing), so two workers that push the same bytes at the same
moment finish together. This benchmark asks the real engine: on the one-machine cluster (two workers,
one server, 200 Mbit/s links), both workers issue the same burst of BytePS push_pulls (nine of 2 MiB,
about a BytePS-MXNet transformer's gradients), worker 1 ``--leads`` seconds after worker 0 (0: at
the same moment), ``--reps`` times per lead after a barrier and a ``--pause`` (with ``--chain N``, N
bursts back to back each time, as a worker that computes nothing would train, or ``--compute`` seconds
apart, computing between them; with ``--gaps``, each burst's ops handed over one by one, as a
backward pass hands over gradients), under each TCP
congestion control asked for, on ``--clusters`` fresh clusters each; each worker records when each of its
push_pulls completed (and with ``--rates`` the bytes its link sent, every 5 ms). Per burst, on the
clock both workers share and from worker 0's start: each worker's first and last answer, beside the
simulator's (the calibrated engine, ``bursts_done_s``), and worker 1's share of the bytes sent in each
0.1 s after it started.
Results: docs/replay/shares.json (``--out``) and a table; the runs docs/ENGINE.md cites are kept as
docs/replay/shares-*.json, each with its commit and command.

    scripts/bench_shares.py                        # BBR and CUBIC, two clusters of 10 bursts each (4 minutes, root)
    scripts/bench_shares.py --tcp bbr --leads 0,0.1,0.2,0.3,0.45 --clusters 1
    scripts/bench_shares.py --tcp bbr --leads 0.2,0.6 --chain 6 --reps 3   # do the workers stay that far apart?
    scripts/bench_shares.py --tcp bbr --leads 0,0.2,0.45 --rates       # what share does the later worker take?
    scripts/bench_shares.py --tcp bbr --leads 0.2 --pause 1 --gaps 0.1   # after 1 s idle, ops 0.1 s apart
    scripts/bench_shares.py --tcp bbr --leads 0.6 --chain 6 --compute 0.33  # computing between bursts
    scripts/bench_shares.py --leads 0.2,0.6 --chain 6 --reps 3 --gaps 0.02 --compute 0.18 --rates  # as training
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]
import bench_replay  # noqa: E402  (the runner, the lock and the engines: one of each)

OUT = bench_replay.OUT / "shares.json"
OPS, OP_ELEMENTS = 9, 512 * 1024  # nine float32 push_pulls of 2 MiB each
BANDWIDTH = "200mbit"
PAUSE_S = 0.3  # default idle between bursts, so that each starts on an idle link
ENGINES = {"bbr": "engine_byteps.json", "cubic": "engine_byteps_cubic.json"}  # calibrated under each


# -- on each worker (``--worker``, started by ``cluster run``) -------------------------------------------
def tcp_segments() -> tuple[int, int]:
    """This host's TCP segments sent and retransmitted so far (``/proc/net/snmp``, its namespace's)."""
    from byteps_prophet.cluster.netns import parse_proc_net

    counters = parse_proc_net(Path("/proc/net/snmp").read_text())
    return counters["out_segs"], counters["retrans_segs"]


class LinkSampler:
    """This host's bytes sent and received (``/proc/net/dev``, its namespace's ``eth0``), sampled every
    ``period`` seconds on a thread while in use: ``series`` holds (monotonic time, sent, received);
    ``segments``, the TCP segments it sent and retransmitted meanwhile."""

    def __init__(self, device: str = "eth0", period: float = 0.005) -> None:
        self.device, self.period, self.series = device, period, []
        self._stop = None

    def counters(self) -> tuple[int, int]:
        for line in Path("/proc/net/dev").read_text().splitlines():
            name, _, fields = line.partition(":")
            if name.strip() == self.device:
                values = fields.split()
                return int(values[8]), int(values[0])
        raise RuntimeError(f"no {self.device} in /proc/net/dev")

    def __enter__(self) -> "LinkSampler":
        import threading

        self.series, self._stop = [], threading.Event()
        self._segments = tcp_segments()

        def sample() -> None:
            while not self._stop.is_set():
                self.series.append((time.monotonic(), *self.counters()))
                self._stop.wait(self.period)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.series.append((time.monotonic(), *self.counters()))
        self.segments = [after - before for before, after in zip(self._segments, tcp_segments())]

    def relative(self, start: float) -> list[list[float]]:
        """The series from ``start``: [seconds after it, bytes sent, bytes received since the first sample]."""
        t0, sent0, received0 = self.series[0]
        return [[round(t - start, 4), sent - sent0, received - received0] for t, sent, received in self.series]


def worker(reps: int, leads: list[float], chain: int, pause: float, gaps: list[float], out_prefix: str,
           rates: bool = False, compute: float = 0.0) -> None:
    """Burst ``reps`` times per lead (worker 1 that much after worker 0), each time ``chain`` bursts back
    to back (the next as the last answer of the one before comes), each time after ``pause`` seconds of
    idle, its ops issued ``gaps[rank]`` seconds apart (0: at once); write each burst's lead, its place
    in the chain, its start (the machine's monotonic clock, which both workers share) and its
    push_pulls' completions (seconds after it) to ``out_prefix``.rankR.json; with ``rates``, the bytes
    its link sent and received, every 5 ms from just before the burst to its last answer. Between
    chained bursts each worker computes ``compute`` seconds (1-thread matrix products, as a forward and
    backward pass would) before sending the next."""
    import torch
    import byteps.torch as bps
    import byteps.torch.ops as ops

    torch.set_num_threads(1)
    bps.init()
    gap = gaps[bps.rank()]
    bufs = [torch.zeros(OP_ELEMENTS) for _ in range(OPS)]
    names = [f"shares.{i}" for i in range(OPS)]
    for name in [*names, "shares.barrier"]:
        ops.declare(name)  # the same order on every worker: the keys agree
    token = torch.zeros(1)

    def barrier() -> None:
        ops.synchronize(ops.push_pull_async_inplace(token, average=True, name="shares.barrier"))

    def burst() -> tuple[float, list[float]]:
        if gap:
            return dribble()
        start = time.monotonic()
        handles = [ops.push_pull_async_inplace(b, average=True, name=n) for b, n in zip(bufs, names)]
        done = []
        for handle in handles:
            ops.synchronize(handle)
            done.append(round(time.monotonic() - start, 6))
        return start, done

    def dribble() -> tuple[float, list[float]]:
        """Op i issued ``i x gap`` after the start; each answer read as it comes (polled, not waited for
        in order, which would read none before the last op is issued)."""
        start = time.monotonic()
        handles, done = [], [None] * OPS
        while None in done:
            now = time.monotonic()
            if len(handles) < OPS and now >= start + len(handles) * gap:
                handles.append(ops.push_pull_async_inplace(bufs[len(handles)], average=True, name=names[len(handles)]))
                continue
            for i, handle in enumerate(handles):
                if done[i] is None and ops.poll(handle):
                    done[i] = round(now - start, 6)
            time.sleep(0.0005)
        for handle in handles:
            ops.synchronize(handle)
        return start, done

    def busy(seconds: float) -> None:
        a = torch.rand(256, 256)
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            a = (a @ a).clamp_(-1, 1)

    burst()  # warm-up: every key initialised on the server
    bursts = []
    for lead in leads:
        for _ in range(reps):
            barrier()
            time.sleep(pause)
            barrier()
            if bps.rank() == 1:
                time.sleep(lead)
            for k in range(chain):
                if k:
                    busy(compute)
                with LinkSampler() if rates else contextlib.nullcontext() as link:
                    start, done = burst()
                bursts.append({"lead": lead, "k": k, "start": round(start, 6), "done_s": done})
                if link:
                    bursts[-1].update(link=link.relative(start), segments=link.segments)
    Path(f"{out_prefix}.rank{bps.rank()}.json").write_text(json.dumps(bursts))
    bps.shutdown()


# -- the summary --------------------------------------------------------------------------------------
def answers_s(first: list[dict], second: list[dict]) -> list[dict]:
    """Per burst, on the clock both workers share and from worker 0's start: worker 1's lead (when it
    started), each worker's first and last answer, and how much later worker 1's last came; with its
    place in its chain and both workers' starts (the clock's own), and each worker's answer to each op
    (``done_s``, in the order the ops were issued); where the links were sampled, worker
    1's share of what they sent in each 0.1 s after it started (``sent_shares``), and the TCP segments
    each sent and retransmitted meanwhile."""
    rows = []
    for a, b in zip(first, second):
        done = [[w["start"] - a["start"] + t for t in w["done_s"]] for w in (a, b)]
        rows.append({"lead": a.get("lead", 0.0), "k": a.get("k", 0), "starts": [a["start"], b["start"]],
                     "lead_s": round(b["start"] - a["start"], 4),
                     "first_s": [round(min(d), 4) for d in done], "last_s": [round(max(d), 4) for d in done],
                     "last_later_s": round(max(done[1]) - max(done[0]), 4),
                     "done_s": [[round(t, 4) for t in d] for d in done]})
        if "link" in a and "link" in b:
            rows[-1]["sent_shares"] = sent_shares(a, b)
        if "segments" in a and "segments" in b:
            rows[-1]["segments"] = [a["segments"], b["segments"]]  # each worker's TCP segments: sent, retransmitted
    return rows


SHARE_BIN_S, SHARE_BINS = 0.1, 10  # worker 1's share of the bytes sent, per 0.1 s for 1 s after it starts


def sent_shares(a: dict, b: dict) -> list[float | None]:
    """Of the bytes both workers' links sent in each ``SHARE_BIN_S`` after worker 1 started, worker 1's
    share (None where neither sent anything), from their sampled links (``LinkSampler``)."""
    import numpy as np

    edges = b["start"] + SHARE_BIN_S * np.arange(SHARE_BINS + 1)
    sent = [np.diff(np.interp(edges, [w["start"] + t for t, _, _ in w["link"]], [x for _, x, _ in w["link"]]))
            for w in (a, b)]
    return [round(float(s1 / (s0 + s1)), 3) if s0 + s1 > 10_000 else None for s0, s1 in zip(*sent)]


def median_share(shares: list[float | None]) -> float | None:
    """The median of the bursts' shares in one bin, over those where a worker sent anything."""
    sent = [x for x in shares if x is not None]
    return round(statistics.median(sent), 3) if sent else None


def summary(rows: list[dict]) -> dict:
    """Per lead, over the first burst of each chain (after a pause): the medians of each worker's first
    and last answer, and how much later worker 1's last answer came than worker 0's (median, mean,
    spread). Where bursts were chained: each worker's period (the median time from one burst of a
    chain to the next) and worker 1's lead at each place in the chain (median)."""
    out = {}
    for lead in dict.fromkeys(r["lead"] for r in rows):
        chained = [r for r in rows if r["lead"] == lead]
        mine = [r for r in chained if r["k"] == 0]
        later = [r["last_later_s"] for r in mine]

        def median(key: str, w: int) -> float:
            return round(statistics.median(r[key][w] for r in mine), 4)

        out[f"{lead:g}"] = {"bursts": len(mine), "first_s": [median("first_s", 0), median("first_s", 1)],
                            "last_s": [median("last_s", 0), median("last_s", 1)],
                            "last_later_median_s": round(statistics.median(later), 4),
                            "last_later_mean_s": round(statistics.mean(later), 4),
                            "last_later_sd_s": round(statistics.pstdev(later), 4)}
        if any(r["k"] for r in chained):
            out[f"{lead:g}"]["chain"] = chain_summary(chained)
        if all("sent_shares" in r for r in mine):
            out[f"{lead:g}"]["sent_shares"] = [median_share([r["sent_shares"][i] for r in mine])
                                               for i in range(SHARE_BINS)]
    return out


def chain_summary(rows: list[dict]) -> dict:
    """Of chained bursts (in order, each chain from k = 0): each worker's median period, and worker 1's
    median lead at each place in the chain."""
    periods: list[list[float]] = [[], []]
    for before, after in zip(rows, rows[1:]):
        if after["k"] == before["k"] + 1:
            for w in (0, 1):
                periods[w].append(after["starts"][w] - before["starts"][w])
    places = sorted({r["k"] for r in rows})
    return {"period_s": [round(statistics.median(p), 4) for p in periods],
            "lead_s": [round(statistics.median(r["lead_s"] for r in rows if r["k"] == k), 4) for k in places]}


def simulated(engine_file: Path, leads: list[float], chain: int = 1, gaps: tuple[float, float] = (0.0, 0.0),
              compute: float = 0.0) -> dict:
    """The same bursts (and chains) in the simulator, with the engine calibrated under that TCP."""
    from byteps_prophet.core.engine import load_engine
    from byteps_prophet.sim.engine import bursts_done_s

    traits = load_engine(str(engine_file))
    out = {"engine": os.path.relpath(engine_file, ROOT)}
    for lead in leads:
        runs = bursts_done_s(traits, traits.bandwidth_bytes_per_s, 2, OP_ELEMENTS * 4, OPS, chain, starts=(0.0, lead),
                             gaps_s=gaps, compute_s=compute)
        first = [r[0][1] for r in runs]
        out[f"{lead:g}"] = {"first_s": [round(min(d), 4) for d in first], "last_s": [round(max(d), 4) for d in first]}
        if chain > 1:
            rows = [{"k": k, "starts": [runs[0][k][0], runs[1][k][0]], "lead_s": runs[1][k][0] - runs[0][k][0]}
                    for k in range(chain)]
            out[f"{lead:g}"]["chain"] = chain_summary(rows)
    return out


# -- the driver ---------------------------------------------------------------------------------------------
def measure(tcp: str, args: argparse.Namespace, folder: Path) -> list[dict]:
    """One fresh cluster under ``tcp`` running the bursts ``args`` ask for: its rows (``answers_s``)."""
    folder.mkdir(parents=True, exist_ok=True)
    prefix, bursts = folder / tcp, args.reps * len(args.leads) * args.chain
    argv = bench_replay.cli("cluster", "run", "--workers", "2", "--servers", "1", "--bandwidth", BANDWIDTH,
                            "--engine", "byteps", "--tcp-congestion", tcp, "--timeout", str(120 + 5 * bursts),
                            "--", sys.executable, str(Path(__file__).resolve()), "--worker", str(prefix),
                            "--reps", str(args.reps), "--leads", ",".join(f"{lead:g}" for lead in args.leads),
                            "--chain", str(args.chain), "--pause", f"{args.pause:g}",
                            "--gaps", ",".join(f"{g:g}" for g in args.gaps), "--compute", f"{args.compute:g}",
                            *(["--rates"] if args.rates else []))
    bench_replay.run(argv, locked=True, timeout=180 + 5 * bursts)
    first, second = (json.loads(Path(f"{prefix}.rank{r}.json").read_text()) for r in (0, 1))
    return answers_s(first, second)


def table(results: dict) -> str:
    lines = ["| TCP | cluster | worker 1's lead | bursts | first answers (0, 1) | last answers (0, 1) | "
             "worker 1's last later (median, sd) | simulated: first, last answers |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    pair = lambda v: f"{v[0]:.2f}, {v[1]:.2f} s"  # noqa: E731
    for tcp, r in results["tcp"].items():
        sim = r["simulated"]
        for k, cluster in enumerate(r["clusters"]):
            for n, (lead, s) in enumerate(cluster["summary"].items()):
                label = tcp if k == 0 and n == 0 else ""
                lines.append(f"| {label} | {k if n == 0 else ''} | {lead} s | {s['bursts']} | {pair(s['first_s'])} | "
                             f"{pair(s['last_s'])} | {s['last_later_median_s']:+.3f} s ({s['last_later_sd_s']:.3f}) | "
                             f"{pair(sim[lead]['first_s'])}; {pair(sim[lead]['last_s'])} |")
    chains = [(tcp, k, lead, s["chain"], r["simulated"][lead]["chain"]) for tcp, r in results["tcp"].items()
              for k, cluster in enumerate(r["clusters"]) for lead, s in cluster["summary"].items() if "chain" in s]
    if chains:
        lines += ["", "| TCP | cluster | worker 1's lead | periods (0, 1) | simulated | worker 1's lead, burst by burst | simulated |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {tcp} | {k} | {lead} s | {pair(c['period_s'])} | {pair(sim['period_s'])} | "
                  f"{' '.join(f'{x:.2f}' for x in c['lead_s'])} | {' '.join(f'{x:.2f}' for x in sim['lead_s'])} |"
                  for tcp, k, lead, c, sim in chains]
    shares = [(tcp, k, lead, s["sent_shares"]) for tcp, r in results["tcp"].items()
              for k, cluster in enumerate(r["clusters"]) for lead, s in cluster["summary"].items() if "sent_shares" in s]
    if shares:
        lines += ["", "| TCP | cluster | worker 1's lead | worker 1's share of the bytes sent, per 0.1 s after it starts (median) |",
                  "| --- | --- | --- | --- |"]
        lines += [f"| {tcp} | {k} | {lead} s | {' '.join('-' if x is None else f'{x:.2f}' for x in row)} |"
                  for tcp, k, lead, row in shares]
    return "\n".join(lines)


def parse_leads(text: str) -> list[float]:
    try:
        leads = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        leads = []
    if not leads or not all(0 <= lead < 10 for lead in leads):
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; valid: comma-separated seconds in [0, 10), e.g. 0,0.2")
    return leads


def parse_gaps(text: str) -> list[float]:
    try:
        gaps = [float(x) for x in text.split(",")]
    except ValueError:
        gaps = []
    if len(gaps) == 1:
        gaps *= 2
    if len(gaps) != 2 or not all(0 <= gap < 1 for gap in gaps):
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; valid: seconds in [0, 1), one for both workers or "
                                         f"two (worker 0's,worker 1's), e.g. 0,0.3")
    return gaps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tcp", default="bbr,cubic",
                        help="comma-separated TCP congestion controls (default bbr,cubic)")
    parser.add_argument("--reps", type=int, default=10, help="bursts per lead and cluster (default 10)")
    parser.add_argument("--leads", type=parse_leads, default=[0.0],
                        help="comma-separated seconds worker 1 starts its burst after worker 0 (default 0)")
    parser.add_argument("--chain", type=int, default=1,
                        help="bursts back to back after each pause, each as the last answer of the one before "
                             "comes (default 1)")
    parser.add_argument("--pause", type=float, default=PAUSE_S,
                        help=f"seconds of idle link before each lead's bursts (default {PAUSE_S:g})")
    parser.add_argument("--gaps", type=parse_gaps, default=[0.0, 0.0],
                        help="seconds between a burst's ops, as a backward pass hands gradients over one by one: "
                             "one for both workers or worker 0's,worker 1's (default 0: all at once)")
    parser.add_argument("--compute", type=float, default=0.0,
                        help="with --chain: seconds each worker computes between its bursts (1-thread matrix "
                             "products), as training computes between its steps (default 0)")
    parser.add_argument("--rates", action="store_true",
                        help="sample each worker's link every 5 ms and report worker 1's share of the bytes sent "
                             "in each 0.1 s after it starts")
    parser.add_argument("--clusters", type=int, default=2,
                        help="fresh clusters per TCP, one after the other (default 2)")
    parser.add_argument("--out", default=str(OUT), help=f"results file (default {os.path.relpath(OUT, ROOT)})")
    parser.add_argument("--worker", metavar="PREFIX", help=argparse.SUPPRESS)  # on each worker of the cluster
    args = parser.parse_args(argv)
    for name in ("reps", "clusters", "chain"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)} is invalid; valid: an integer >= 1")
    if not 0 <= args.pause < 60:
        parser.error(f"--pause {args.pause:g} is invalid; valid: seconds in [0, 60)")
    if not 0 <= args.compute < 10:
        parser.error(f"--compute {args.compute:g} is invalid; valid: seconds in [0, 10)")
    if args.worker:
        worker(args.reps, args.leads, args.chain, args.pause, args.gaps, args.worker, args.rates, args.compute)
        return 0
    tcps = [t.strip() for t in args.tcp.split(",") if t.strip()]
    if not tcps:
        parser.error(f"--tcp {args.tcp!r} names no TCP congestion control; valid: e.g. bbr,cubic")
    results = {"commit": bench_replay.git_commit(), "command": "scripts/bench_shares.py " + " ".join(argv or sys.argv[1:]),
               "bandwidth": BANDWIDTH, "pause_s": args.pause, "gaps_s": args.gaps, "rates": args.rates,
               "compute_s": args.compute, "ops": OPS, "op_bytes": OP_ELEMENTS * 4, "tcp": {}}
    with tempfile.TemporaryDirectory(prefix="bpp-shares-") as folder:
        for tcp in tcps:
            clusters = []
            for k in range(args.clusters):
                rows = measure(tcp, args, Path(folder) / str(k))
                clusters.append({"bursts": rows, "summary": summary(rows)})
                bench_replay.log(f"{tcp}, cluster {k}: {clusters[-1]['summary']}")
            engine = bench_replay.OUT / ENGINES.get(tcp, "engine_byteps.json")
            sim = simulated(engine, args.leads, args.chain, args.gaps, args.compute)
            results["tcp"][tcp] = {"clusters": clusters, "simulated": sim}
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
