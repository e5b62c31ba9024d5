"""The A/B runner: FIFO, ByteScheduler (default and tuned credit) and Prophet, interleaved, on real
training in the local cluster. See docs/AB.md.

One *run* = one cluster job: every worker runs the framework's benchmark (``ab.workloads.benches``) with the
same arguments and one scheduler, and worker-0 prints one JSON line with ``samples_per_s``. Runs are
interleaved: each round runs every variant once, in an order rotated from round to round, on the same
cluster (same namespaces and links), so slow drift of the machine hits all variants alike. Before the
rounds, one tuning run finds ByteScheduler's best credit with ``CreditTuner`` (Bayesian optimisation
over short probes inside one job, on rank 0, at the starting bandwidth).

Opt-in variants that are not schedules but what a torch user runs instead (``BASELINES``): ``ddp``
(torch DistributedDataParallel with its default 25 MB bucket, gloo) and ``ddp_tuned`` (the bucket a
sweep found fastest: one tuning run before the rounds, as for the credit, ``--bucket-sweep``);
``byteps_stock`` (BytePS's own DistributedOptimizer: each worker pushes every gradient as its hook
fires, BytePS cuts and queues them, no cross-worker order; the ``fifo`` variant on BytePS is not that:
it is byteps_prophet's optimizer with FIFO order, rank 0's order followed by the others, and the
layer-wise update and overlap).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from byteps_prophet.ab.stats import LEVEL, paired_ratios, speedup
from byteps_prophet.ab.workloads.benches import BENCHES
from byteps_prophet.cluster.compose import GLOO_COMPOSE
from byteps_prophet.errors import UserError

VARIANTS = ("fifo", "bytescheduler", "bytescheduler_tuned", "prophet")
# Not schedules, opt-in references (docs/ALGORITHMS.md, "4. The limit"): every worker trains alone with
# no communication at all, all at once on the same machine (a bound on every schedule); or every
# worker only synchronises the model's gradients as the engine does unscheduled, with no compute (not
# for BytePS-MXNet; a reference, not a bound: a schedule that cuts tensors can pass it).
COMPUTE_ONLY, COMM_ONLY = "compute_only", "comm_only"
DDP, DDP_TUNED, BYTEPS_STOCK = "ddp", "ddp_tuned", "byteps_stock"
BASELINES = (DDP, DDP_TUNED, BYTEPS_STOCK)
BASELINE_BACKENDS = {DDP: ("torch", "gloo"), DDP_TUNED: ("torch", "gloo"), BYTEPS_STOCK: ("torch", "byteps")}
BUCKET_SWEEP_MB = "0.5,1,2,5,10,25,50"
# Opt-in: Prophet with its fused collectives forced on or off (BYTEPS_PROPHET_FUSE=1 / 0 for that run
# only), so that fusion can be decided in one interleaved A/B (docs/DESIGN.md, "Fused collectives").
PROPHET_FUSE = {"prophet_fused": "1", "prophet_unfused": "0"}
# Opt-in: a scheduler with layer-wise overlap on (BYTEPS_PROPHET_OVERLAP=1 for that run only), so that
# the default, stock step() semantics, can be weighed against it in one interleaved A/B (docs/DESIGN.md,
# "Stock step() semantics by default").
OVERLAP = {"bytescheduler_overlap": "bytescheduler", "prophet_overlap": "prophet"}
CHOICES = VARIANTS + tuple(PROPHET_FUSE) + tuple(OVERLAP) + BASELINES + (COMPUTE_ONLY, COMM_ONLY)
REFERENCES = (COMPUTE_ONLY, COMM_ONLY)
BACKENDS = {"torch": ("gloo", "byteps"), "mxnet": ("kvstore", "byteps")}
MXNET_SCALABLE = ("vgg", "transformer", "mlp")  # = mxnet.models.SCALABLE, without importing mxnet
# Besides the scheduling knobs the cluster passes through, the caller's variables that set the
# frameworks' threads (MXNet's engine workers, OpenMP, MKL): each can move one schedule more than
# another, so the results name them.
RECORDED_PREFIXES = ("MXNET_", "OMP_", "MKL_", "KMP_")


@dataclass
class ABConfig:
    framework: str = "torch"
    backend: str = "gloo"
    model: str = "vgg"
    workers: int = 2
    bandwidth: str = "1gbit"
    steps: int = 20
    rounds: int = 3
    warmup: int = 5
    batch: int = 16
    width: float = 1.0
    threads: int = 1
    bandwidth_schedule: list[str] = field(default_factory=list)  # e.g. ["200mbit", "1gbit"]: at 1/3, 2/3
    tune: bool = True
    tune_probe_steps: int = 3
    tune_probes: str = "6,3"
    timeout: float = 900.0
    netns: bool | None = None
    variants: tuple[str, ...] = VARIANTS
    record: str | None = None  # directory: each run's profile and rank-0 trace (<variant>_r<round>.*.json)
    bucket_sweep: str = BUCKET_SWEEP_MB  # ddp_tuned: DDP's bucket_cap_mb values tried, MB
    tcp_congestion: str | None = None  # the cluster hosts' TCP congestion control; None: this machine's

    def validate(self) -> None:
        if self.framework not in BACKENDS:
            raise UserError(f"--framework {self.framework!r} is invalid; valid: {', '.join(BACKENDS)}")
        if self.backend not in BACKENDS[self.framework]:
            raise UserError(f"--backend {self.backend!r} does not go with --framework {self.framework}; "
                            f"valid: {', '.join(BACKENDS[self.framework])}")
        for name in ("workers", "steps", "rounds", "batch"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name} {getattr(self, name)} is invalid; valid: an integer >= 1")
        if self.warmup < 0:
            raise UserError(f"--warmup {self.warmup} is invalid; valid: an integer >= 0")
        if not self.width > 0:
            raise UserError(f"--width {self.width:g} is invalid; valid: a number > 0")
        if self.framework == "mxnet" and self.width != 1.0 and self.model not in MXNET_SCALABLE:
            raise UserError(f"--width {self.width:g} with --framework mxnet --model {self.model}: its width is "
                            f"fixed; valid: --width 1.0, or --model {', '.join(MXNET_SCALABLE)}")
        if self.workers < 2:
            raise UserError(f"--workers {self.workers} is invalid; valid: an integer >= 2 (A/B needs communication)")
        try:
            from byteps_prophet.units import parse_bandwidth
        except ImportError:  # older layout
            from byteps_prophet.cluster.units import parse_bandwidth

        for rate in [self.bandwidth, *self.bandwidth_schedule]:
            parse_bandwidth(rate)  # raises a one-line error naming the value
        for name in BASELINES:
            if name in self.variants and (self.framework, self.backend) != BASELINE_BACKENDS[name]:
                framework, backend = BASELINE_BACKENDS[name]
                raise UserError(f"--variants {name} needs --framework {framework} --backend {backend}; valid here: "
                                f"{', '.join(v for v in CHOICES if BASELINE_BACKENDS.get(v, (self.framework, self.backend)) == (self.framework, self.backend))}")
        if DDP_TUNED in self.variants:
            try:
                sweep = [float(v) for v in self.bucket_sweep.split(",") if v.strip()]
            except ValueError:
                sweep = []
            if not sweep or min(sweep) <= 0:
                raise UserError(f"--bucket-sweep {self.bucket_sweep!r} is invalid; valid: positive sizes in MB, "
                                f"comma-separated, e.g. {BUCKET_SWEEP_MB}")
        if COMM_ONLY in self.variants and self.framework == "mxnet" and self.backend != "kvstore":
            raise UserError(f"--variants {COMM_ONLY} needs --backend kvstore with --framework mxnet; valid here: "
                            f"{', '.join(v for v in CHOICES if v != COMM_ONLY)}")


def bench_command(cfg: ABConfig, *, progress: bool = False, tune: bool = False, variant: str = "",
                  tune_bucket: bool = False, bucket_mb: float | None = None) -> list[str]:
    backend = "local" if variant == COMPUTE_ONLY else cfg.backend
    argv = [sys.executable, "-m", BENCHES[cfg.framework].__name__, "--model", cfg.model,
            "--batch", str(cfg.batch), "--steps", str(cfg.steps), "--warmup", str(cfg.warmup),
            "--backend", backend, "--workers", str(cfg.workers), "--width", str(cfg.width)]
    if cfg.framework == "torch":
        argv += ["--threads", str(cfg.threads)]
    if progress:
        argv.append("--progress")
    if tune:
        argv += ["--tune-credit", str(cfg.tune_probe_steps), "--tune-probes", cfg.tune_probes]
    if variant == COMM_ONLY:
        argv.append("--comm-only")
    if tune_bucket:
        argv += ["--tune-bucket", str(cfg.tune_probe_steps), "--bucket-sweep", cfg.bucket_sweep]
    elif variant in (DDP, DDP_TUNED):
        argv.append("--ddp")
        if variant == DDP_TUNED:
            if bucket_mb is None:
                raise UserError("ddp_tuned needs a tuned bucket; run with its tuning run")
            argv += ["--bucket-mb", f"{bucket_mb:g}"]
    if variant == BYTEPS_STOCK:
        argv.append("--stock-byteps")
    return argv


def variant_env(variant: str, tuned_credit: int | None) -> dict[str, str]:
    if variant in REFERENCES or variant in BASELINES:
        return {"BYTEPS_SCHEDULER": "fifo"}
    if variant in PROPHET_FUSE:
        return {"BYTEPS_SCHEDULER": "prophet", "BYTEPS_PROPHET_FUSE": PROPHET_FUSE[variant]}
    if variant in OVERLAP:
        return {"BYTEPS_SCHEDULER": OVERLAP[variant], "BYTEPS_PROPHET_OVERLAP": "1"}
    env = {"BYTEPS_SCHEDULER": "bytescheduler" if variant.startswith("bytescheduler") else variant}
    if variant == "bytescheduler_tuned":
        if tuned_credit is None:
            raise UserError("bytescheduler_tuned needs a tuned credit; run with tuning on")
        env["BYTESCHEDULER_CREDIT"] = str(int(tuned_credit))
    return env


def parse_result(lines: list[str]) -> dict | None:
    for line in reversed(lines):
        line = line.strip()
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if "samples_per_s" in data or "best_credit" in data or "best_bucket_mb" in data:
                return data
    return None


class ABRunner:
    def __init__(self, cfg: ABConfig, progress=None, log=None) -> None:
        cfg.validate()
        self.cfg = cfg
        self.progress = progress
        self.log = log or (lambda msg: print(msg, file=sys.stderr))
        self.runs: list[dict] = []
        self.tuning: dict | None = None
        self.ddp_tuning: dict | None = None
        self.warnings: list[str] = []
        self.environment = run_environment()
        self._check_warmup()

    def _check_warmup(self) -> None:
        """Prophet schedules by its profile only after profiling; a shorter warm-up measures it partly
        under ByteScheduler's credit (its fallback), which is not its steady state."""
        if not {"prophet", "prophet_overlap", *PROPHET_FUSE} & set(self.cfg.variants):
            return
        from byteps_prophet.core import Settings

        profiling = Settings.from_env().profile_iterations
        if self.cfg.warmup < profiling:
            self._warn(f"--warmup {self.cfg.warmup} is shorter than Prophet's profiling ({profiling} iterations, "
                       f"PROPHET_PROFILE_ITERATIONS): its first {profiling - self.cfg.warmup} measured step(s) "
                       f"run under ByteScheduler's credit; use --warmup {profiling} or more")

    # -- cluster ---------------------------------------------------------------------------------------
    def _cluster(self):
        from byteps_prophet.cluster import Cluster, ClusterSpec

        cfg = self.cfg
        engine = {"gloo": "mxnet", "kvstore": "mxnet", "byteps": "byteps"}[cfg.backend]
        compose = GLOO_COMPOSE if cfg.backend == "gloo" else None
        spec = ClusterSpec(workers=cfg.workers, servers=1, bandwidth=cfg.bandwidth, engine=engine,
                           compose=compose, netns=cfg.netns, grace=1.0, tcp_congestion=cfg.tcp_congestion)
        return Cluster(spec, output=False, warn=self._warn)

    def _warn(self, message: str) -> None:
        self.warnings.append(message)
        self.log(message if message.startswith("warning") else f"warning: {message}")

    def _env(self, variant: str) -> dict[str, str]:
        # MASTER_ADDR/MASTER_PORT (worker 0's store, which gloo and the scheduled BytePS path use) come
        # from the cluster, as for any script run on it.
        env = variant_env(variant, self.tuning and self.tuning.get("best_credit"))
        env["BYTEPS_PROPHET_TIMEOUT"] = str(int(min(self.cfg.timeout, 600)))
        return env

    def _one(self, cluster, variant: str, tune: bool = False, tag: str = "", tune_bucket: bool = False) -> dict:
        cfg = self.cfg
        reference = variant in REFERENCES  # measured at the starting bandwidth, as the limit's link
        tune = tune or tune_bucket
        schedule = list(cfg.bandwidth_schedule) if not tune and not reference else []
        changes: list[tuple[float, str]] = []
        if schedule and cluster.use_netns:
            cluster.set_bandwidth(cfg.bandwidth)
        thresholds = [max(1, round(cfg.steps * (k + 1) / (len(schedule) + 1))) for k in range(len(schedule))]
        lock = threading.Lock()
        started = time.monotonic()

        def sink(role: str, line: str) -> None:
            if not schedule or role != "worker-0" or not line.startswith("#progress"):
                return
            step = int(line.split()[1])
            with lock:
                while schedule and thresholds and step >= thresholds[0]:
                    rate = schedule.pop(0)
                    thresholds.pop(0)
                    if cluster.use_netns:
                        cluster.set_bandwidth(rate)
                    changes.append((round(time.monotonic() - started, 3), rate))

        command = bench_command(cfg, progress=bool(schedule), tune=tune and not tune_bucket, variant=variant,
                                tune_bucket=tune_bucket,
                                bucket_mb=self.ddp_tuning and self.ddp_tuning.get("best_bucket_mb"))
        env = self._env(variant)
        recorded = {}
        if cfg.record and not tune and not reference and variant not in BASELINES:
            base = os.path.join(os.path.abspath(cfg.record), f"{variant}{tag}")
            recorded = {"profile": base + ".profile.json", "trace": base + ".trace.json"}
            env["BYTEPS_PROPHET_PROFILE"] = recorded["profile"]
            env["BYTEPS_PROPHET_TRACE"] = recorded["trace"]  # both frameworks' (docs/PYTORCH.md, docs/MXNET.md)
        read_counters = getattr(cluster, "network_counters", dict)  # a stand-in cluster has none
        counters = read_counters()
        result = cluster.run(command, env=env, timeout=cfg.timeout, output=sink)
        network = network_summary(counters, read_counters())
        if cfg.bandwidth_schedule and cluster.use_netns:
            cluster.set_bandwidth(cfg.bandwidth)
        data = parse_result(result.output.get("worker-0", []))
        if not result.ok or data is None:
            tail = " | ".join(line for line in result.output.get(result.failed or "worker-0", [])[-3:])
            raise UserError(f"{variant} run failed: {result.reason}; last output: {tail[-400:]}")
        if variant == COMPUTE_ONLY:  # worker 0 reports its own rate; the others trained alongside it
            data["samples_per_s"] *= cfg.workers
        data.update(variant=variant, elapsed_s=result.elapsed, bandwidth_changes=changes)
        if network:
            data["network"] = network
        if recorded:
            data["recorded"] = recorded
        return data

    # -- the experiment ---------------------------------------------------------------------------------------
    def run(self) -> dict:
        cfg = self.cfg
        variants = [v for v in cfg.variants if v != "bytescheduler_tuned" or cfg.tune]
        tune_ddp = DDP_TUNED in variants
        total = len(variants) * cfg.rounds + (1 if cfg.tune else 0) + (1 if tune_ddp else 0)
        bar = self.progress(total=total, desc="ab", unit="run") if self.progress else None
        if cfg.record:
            os.makedirs(cfg.record, exist_ok=True)
        with self._cluster() as cluster:
            self.netns = bool(cluster.use_netns)
            self.tcp_congestion = cluster.tcp_congestion()
            if not cluster.use_netns:
                self._warn("network namespaces unavailable: plain loopback processes, bandwidth NOT applied")
            if cfg.tune:
                if bar:
                    bar.set_postfix_str("tuning credit")
                self.tuning = self._one(cluster, "bytescheduler", tune=True)
                if bar:
                    bar.update()
            if tune_ddp:
                if bar:
                    bar.set_postfix_str("sweeping DDP's bucket")
                self.ddp_tuning = self._one(cluster, DDP, tune_bucket=True)
                if bar:
                    bar.update()
            for r in range(cfg.rounds):
                order = variants[r % len(variants):] + variants[:r % len(variants)]
                for variant in order:
                    if bar:
                        bar.set_postfix_str(f"round {r + 1}/{cfg.rounds}: {variant}")
                    data = self._one(cluster, variant, tag=f"_r{r}")
                    data["round"] = r
                    self.runs.append(data)
                    if bar:
                        bar.update()
        if bar:
            bar.close()
        return self.summary()

    def summary(self) -> dict:
        return summarize(self.cfg, self.runs, netns=getattr(self, "netns", None), environment=self.environment,
                         tuning=self.tuning, warnings=self.warnings, ddp_tuning=getattr(self, "ddp_tuning", None),
                         tcp_congestion=getattr(self, "tcp_congestion", None))


def network_summary(before: dict, after: dict) -> dict:
    """What one run did to the links (``Cluster.network_counters`` before and after): per host its
    uplink's and downlink's qdisc bytes, drops and overlimits and its TCP segments, retransmissions
    and timeouts. Empty on loopback."""
    from byteps_prophet.cluster.netns import counter_delta

    delta = counter_delta(before, after)
    out = {}
    for host, parts in delta.items():
        row = {f"{side}_{key}": parts.get(side, {}).get(key, 0) for side in ("up", "down")
               for key in ("bytes", "drops", "overlimits")}
        row.update({f"tcp_{key}": parts.get("tcp", {}).get(key, 0)
                    for key in ("out_segs", "retrans_segs", "timeouts", "loss_probes", "fast_retrans")})
        out[host] = row
    return out


PAIRS = (("prophet", "fifo"), ("prophet", "bytescheduler"), ("prophet", "bytescheduler_tuned"),
         ("bytescheduler", "fifo"), ("bytescheduler_tuned", "fifo"),
         # against what a torch user runs instead (BASELINES)
         ("prophet", DDP), ("prophet", DDP_TUNED), ("fifo", DDP), ("bytescheduler", DDP),
         ("bytescheduler_tuned", DDP), (DDP_TUNED, DDP), ("prophet", BYTEPS_STOCK), ("fifo", BYTEPS_STOCK),
         ("bytescheduler", BYTEPS_STOCK),
         ("prophet_fused", "prophet_unfused"), ("prophet_fused", "prophet"), ("prophet_fused", DDP),
         ("prophet_unfused", DDP), ("prophet_fused", DDP_TUNED), ("prophet_unfused", DDP_TUNED),
         ("prophet_overlap", "prophet"), ("bytescheduler_overlap", "bytescheduler"),
         ("prophet_overlap", "bytescheduler_overlap"))


def summarize(cfg: ABConfig, runs: list[dict], *, netns: bool | None, environment: dict, tuning: dict | None,
              warnings: list[str], ddp_tuning: dict | None = None, tcp_congestion: str | None = None) -> dict:
    """The A/B's JSON object: per variant its median samples/s and spread, per pair of variants the
    median of their per-round ratios with its interval (stats.py), and the limit."""
    results = {}
    for variant in dict.fromkeys(run["variant"] for run in runs):
        rates = [run["samples_per_s"] for run in runs if run["variant"] == variant]
        results[variant] = {"samples_per_s": statistics.median(rates), "spread": max(rates) - min(rates),
                            "min": min(rates), "max": max(rates), "runs": rates}
    speedups = {}
    for a, b in PAIRS:
        ratios = paired_ratios(runs, a, b)
        if ratios:
            speedups[f"{a}/{b}"] = speedup(ratios, results[a]["samples_per_s"] / results[b]["samples_per_s"])
    config = asdict(cfg)
    config["variants"] = list(config["variants"])
    bound, defects = limit(cfg, runs, results, netns)
    warnings = list(dict.fromkeys([*warnings, *defects]))  # a pooled output's defects are found again
    out = {"config": config, "environment": environment, "netns": netns, "tcp_congestion_control": tcp_congestion,
           "results": results, "speedups": speedups, "limit": bound,
           "tuning": tuning, "warnings": warnings, "runs": runs}
    if ddp_tuning is not None:
        out["ddp_tuning"] = ddp_tuning
    return out


def limit(cfg: ABConfig, runs: list[dict], results: dict, netns: bool | None) -> tuple[dict | None, list[str]]:
    """The most samples/s any schedule can reach here (docs/ALGORITHMS.md, "4. The limit"), and the
    defects it shows. The limit is the least of the true upper bounds measured: compute alone (the
    compute_only runs' median; no schedule computes faster than with no communication) and the
    busiest link's bytes per step at the link's shaped rate (no protocol overhead; left out under a
    bandwidth schedule or without shaping). comm_only is no bound: it is the engine's unscheduled
    synchronisation, which a schedule that cuts tensors and overlaps push and pull can pass; it is a
    reference among the results. A variant above the limit means a bound was wrong: a defect of the
    tool, said in the warnings, never a share."""
    found: dict = {}
    if COMPUTE_ONLY in results:
        found["compute_samples_per_s"] = results[COMPUTE_ONLY]["samples_per_s"]
    model_bytes = next((run["param_bytes"] for run in runs if run.get("param_bytes")), None)
    if model_bytes and not cfg.bandwidth_schedule and netns:
        from byteps_prophet.units import parse_bandwidth

        found["link_bytes_per_step"] = link_bytes_per_step(cfg, model_bytes)
        step_s = found["link_bytes_per_step"] * 8 / parse_bandwidth(cfg.bandwidth)
        found["link_samples_per_s"] = cfg.workers * cfg.batch / step_s
    if not found:
        return None, []
    found["samples_per_s"] = min(found[key] for key in BOUNDS if key in found)
    shares = {name: res["samples_per_s"] / found["samples_per_s"]
              for name, res in results.items() if name not in REFERENCES}
    found["share"] = {name: share for name, share in shares.items() if share <= 1.0}
    defects = [f"{LIMIT_DEFECT} {name} ran {results[name]['samples_per_s']:.2f} samples/s, {share:.0%} of the "
               f"limit {found['samples_per_s']:.2f} ({describe_bounds(found)}): a bound it passes is not a bound, "
               f"so this limit is wrong here and no share of it is reported"
               for name, share in shares.items() if share > 1.0]
    return found, defects


# The limit's true upper bounds, by their keys in the limit's JSON.
BOUNDS = ("compute_samples_per_s", "link_samples_per_s")
# How a warning that a variant passed the limit begins (the table prints those after the limit).
LIMIT_DEFECT = "limit defect:"


def describe_bounds(limit: dict) -> str:
    parts = []
    if "compute_samples_per_s" in limit:
        parts.append(f"compute alone {limit['compute_samples_per_s']:.2f}")
    if "link_samples_per_s" in limit:
        parts.append(f"link {limit['link_samples_per_s']:.2f} ({limit['link_bytes_per_step'] / 1e6:.3g} MB per step "
                     f"on the busiest link)")
    return "; ".join(parts)


# What must agree for rounds of several A/Bs to be pooled: the experiment, not how many steps it timed.
POOLED_CONFIG = ("framework", "backend", "model", "workers", "bandwidth", "bandwidth_schedule", "warmup",
                 "batch", "width", "threads")


def pool(paths: list[str]) -> dict:
    """One summary of the rounds of several ``ab --json`` outputs of the same configuration and
    environment (each file's rounds stay paired within themselves)."""
    loaded = []
    for path in paths:
        try:
            with open(path) as f:
                summary = json.load(f)
            config, runs = summary["config"], summary["runs"]
        except OSError as err:
            raise UserError(f"--pool {path}: cannot read it ({err.strerror})") from None
        except (ValueError, KeyError, TypeError):
            raise UserError(f"--pool {path}: not the JSON of `byteps-prophet ab --json`") from None
        loaded.append((path, summary, config, runs))
    first_path, first, first_config, _ = loaded[0]
    for path, summary, config, _ in loaded[1:]:
        for key in POOLED_CONFIG:
            if config.get(key) != first_config.get(key):
                raise UserError(f"--pool {path}: {key} {config.get(key)!r} differs from {first_path}'s "
                                f"{first_config.get(key)!r}; valid: outputs of the same configuration")
        if summary.get("environment") != first.get("environment"):
            raise UserError(f"--pool {path}: its environment {summary.get('environment')} differs from "
                            f"{first_path}'s {first.get('environment')}; valid: outputs run with the same knobs")
    runs, offset, sources = [], 0, []
    for path, summary, _, file_runs in loaded:
        rounds = sorted({run["round"] for run in file_runs})
        renumber = {r: offset + k for k, r in enumerate(rounds)}
        runs += [dict(run, round=renumber[run["round"]]) for run in file_runs]
        offset += len(rounds)
        sources.append({"path": path, "rounds": len(rounds), "steps": summary["config"].get("steps"),
                        "tuning": summary.get("tuning"), "ddp_tuning": summary.get("ddp_tuning")})
    fields = ABConfig.__dataclass_fields__
    cfg = ABConfig(**{k: v for k, v in first_config.items() if k in fields})
    cfg.variants = tuple(dict.fromkeys(run["variant"] for run in runs))
    cfg.rounds = offset
    netns = all(summary.get("netns") for _, summary, _, _ in loaded)
    warnings = list(dict.fromkeys(w for _, summary, _, _ in loaded for w in summary.get("warnings", [])))
    used = {summary.get("tcp_congestion_control") for _, summary, _, _ in loaded}
    if len(used) > 1:
        raise UserError(f"--pool: the outputs ran under different TCP congestion controls "
                        f"({', '.join(sorted(u or 'unknown' for u in used))}); valid: outputs of one")
    out = summarize(cfg, runs, netns=netns, environment=first.get("environment", {}), tuning=None,
                    warnings=warnings, tcp_congestion=used.pop())
    out["pooled_from"] = sources  # each output's tuned credit is its own
    return out


def run_environment(environ=None) -> dict[str, str]:
    """What of the caller's environment every run inherits and that changes how it trains or
    schedules (``BYTEPS_SCHEDULER`` is each variant's own)."""
    from byteps_prophet.cluster.roles import is_passthrough

    env = os.environ if environ is None else environ
    return {k: env[k] for k in sorted(env)
            if k != "BYTEPS_SCHEDULER" and (is_passthrough(k) or k.startswith(RECORDED_PREFIXES))}


def link_bytes_per_step(cfg: ABConfig, model_bytes: int) -> float:
    """Bytes the busiest link carries in each direction per step: a ring all-reduce moves
    2(n-1)/n of the model over every worker's link; the one parameter server's link carries every
    worker's push in and every pull out."""
    if cfg.backend == "gloo":
        return 2 * (cfg.workers - 1) / cfg.workers * model_bytes
    return cfg.workers * model_bytes


def format_table(summary: dict) -> str:
    cfg = summary["config"]
    head = (f"A/B {cfg['framework']}/{cfg['backend']} {cfg['model']} x{cfg['workers']} workers, batch {cfg['batch']}, "
            f"{cfg['bandwidth']}" + (f" -> {' -> '.join(cfg['bandwidth_schedule'])}" if cfg["bandwidth_schedule"] else "")
            + f", {cfg['steps']} steps x {cfg['rounds']} rounds" + ("" if summary.get("netns") else " (LOOPBACK, unshaped)")
            + (f", TCP {summary['tcp_congestion_control']}" if summary.get("tcp_congestion_control") else ""))
    lines = [head]
    if summary.get("pooled_from"):
        lines.append("pooled: " + ", ".join(f"{src['path']} ({src['rounds']} rounds of {src['steps']} steps)"
                                            for src in summary["pooled_from"]))
    if summary.get("environment"):
        lines.append("environment: " + " ".join(f"{k}={v}" for k, v in summary["environment"].items()))
    lines += [f"{'scheduler':<22}{'samples/s (median)':>20}{'spread (max-min)':>18}{'vs fifo':>9}"]
    fifo = summary["results"].get("fifo", {}).get("samples_per_s")
    for name, res in summary["results"].items():
        ratio = f"{res['samples_per_s'] / fifo:.3f}x" if fifo else "-"
        lines.append(f"{name:<22}{res['samples_per_s']:>20.2f}{res['spread']:>18.2f}{ratio:>9}")
    if summary.get("tuning"):
        t = summary["tuning"]
        lines.append(f"tuned credit: {t.get('best_credit')} elements ({len(t.get('probes', []))} probes, "
                     f"bounds {t.get('credit_bounds')})")
    if summary.get("ddp_tuning"):
        t = summary["ddp_tuning"]
        sweep = ", ".join(f"{mb:g} MB {s:.3f} s" for mb, s in t.get("probes", []))
        lines.append(f"ddp_tuned bucket: {t.get('best_bucket_mb'):g} MB, the fastest of the sweep "
                     f"(s per step: {sweep}); ddp: DDP's default 25 MB")
    limit = summary.get("limit")
    if limit:
        share = ", ".join(f"{name} {value:.0%}" for name, value in limit["share"].items())
        lines.append(f"limit: {limit['samples_per_s']:.2f} samples/s ({describe_bounds(limit)}); reached: {share or '-'}")
        lines += [f"warning: {w}" for w in summary.get("warnings", []) if w.startswith(LIMIT_DEFECT)]
    for key, s in summary["speedups"].items():
        lines.append(f"speedup {key:<34} median of per-round ratios {s['median']:.3f}x "
                     f"(min {s['min']:.3f}, max {s['max']:.3f}; {describe_interval(s)})")
    return "\n".join(lines)


def describe_interval(pair: dict) -> str:
    """How sure a speedup's median is, in words (stats.py): its interval, and too few rounds said as such."""
    interval, rounds = pair["interval"], pair["rounds"]
    span = f"{interval['low']:.3f}-{interval['high']:.3f}"
    if interval["confidence"] >= LEVEL:
        return f"{LEVEL:.0%} interval {span} over {rounds} rounds"
    return f"the {rounds} rounds' range {span} holds the median with {interval['confidence']:.0%}; 6 rounds give {LEVEL:.0%}"


def plot(summary: dict, path: str) -> None:
    import matplotlib.pyplot as plt

    fig = figure(summary)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def figure(summary: dict):
    """The A/B's bar chart: each variant's median samples/s with its min-max, and the limit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary["results"])
    med = [summary["results"][n]["samples_per_s"] for n in names]
    lo = [m - summary["results"][n]["min"] for n, m in zip(names, med)]
    hi = [summary["results"][n]["max"] - m for n, m in zip(names, med)]
    fig, ax = plt.subplots(figsize=(max(7.0, 1.25 * len(names)), 4))
    colors = {"fifo": "#888", "bytescheduler": "#59c", "bytescheduler_tuned": "#37a", "prophet": "#d62",
              COMPUTE_ONLY: "#ccc", COMM_ONLY: "#ccc", DDP: "#6a6", DDP_TUNED: "#383", BYTEPS_STOCK: "#aaa"}
    ax.bar(range(len(names)), med, yerr=[lo, hi], capsize=6, color=[colors.get(n, "#888") for n in names])
    ax.set_xticks(range(len(names)), [n.replace("_", "\n") for n in names])  # long names on two lines
    limit = summary.get("limit")
    if limit:
        ax.axhline(limit["samples_per_s"], color="k", linestyle="--", linewidth=1)
        ax.annotate("limit", (len(names) - 0.5, limit["samples_per_s"]), ha="right", va="bottom", fontsize=8)
    cfg = summary["config"]
    ax.set_ylabel("samples/s (median, min-max)")
    ax.set_title(f"{cfg['model']} {cfg['framework']}/{cfg['backend']} x{cfg['workers']} @ {cfg['bandwidth']}"
                 + (" -> " + " -> ".join(cfg["bandwidth_schedule"]) if cfg["bandwidth_schedule"] else ""))
    fig.tight_layout()
    return fig
