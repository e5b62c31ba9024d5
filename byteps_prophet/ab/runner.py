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

This module is what runs: the variants, the configuration and each run's command and environment,
and the rounds. What the runs say (summary, limit, table, plot, pooling) is ``ab/report.py``.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field

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
        from byteps_prophet.ab.report import summarize  # the report reads this module's variants

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


def run_environment(environ=None) -> dict[str, str]:
    """What of the caller's environment every run inherits and that changes how it trains or
    schedules (``BYTEPS_SCHEDULER`` is each variant's own)."""
    from byteps_prophet.cluster.roles import is_passthrough

    env = os.environ if environ is None else environ
    return {k: env[k] for k in sorted(env)
            if k != "BYTEPS_SCHEDULER" and (is_passthrough(k) or k.startswith(RECORDED_PREFIXES))}
