"""``byteps-prophet simulate``: the schedulers side by side on a simulated cluster."""
from __future__ import annotations

import argparse
import json
import sys

from byteps_prophet.core import Settings
from byteps_prophet.core.settings import settings_help
from byteps_prophet.errors import UserError
from byteps_prophet.units import parse_bandwidth, parse_latency

# The settings the simulated schedulers read (the scheduler itself is --scheduler).
SIMULATED_SETTINGS = ("partition", "credit", "credit_tuning", "prophet_mode", "boundary_factor",
                      "profile_iterations", "drift_tolerance", "min_chunk_bytes", "max_chunk_bytes", "fuse")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "simulate", help="simulate FIFO, ByteScheduler and Prophet (on all-reduce DDP and Horovod too) on a model and cluster",
        description="Run the real scheduler classes in a discrete-event simulation of data-parallel "
                    "training and compare their iteration times with the lower bound. "
                    + settings_help(SIMULATED_SETTINGS))
    p.add_argument("--model", help="resnet50, vgg16, alexnet, inception_v3 or bert_base (or use --profile)")
    p.add_argument("--profile", metavar="FILE", help="replay a recorded profile (docs/PROFILE.md) instead of the zoo")
    p.add_argument("--compute", choices=("recorded", "median"),
                   help="with --profile: replay each recorded iteration's compute in turn (recorded, the "
                        "default) or the median iteration every time (median)")
    p.add_argument("--engine", metavar="FILE",
                   help="an engine profile written by `byteps-prophet calibrate` (docs/ENGINE.md), or a preset: "
                        "ideal, ideal-ps, gloo, byteps, kvstore; sets the architecture, per-message cost, "
                        "start-up latency, atoms, servers and compute slowdown")
    p.add_argument("--workers", type=_positive_int, default=8, help="data-parallel workers (default 8)")
    p.add_argument("--servers", type=_positive_int,
                   help="parameter servers (default: the engine's, else as many as workers)")
    p.add_argument("--arch", choices=("ps", "allreduce"),
                   help="parameter server or ring all-reduce (default: the engine's, else ps)")
    p.add_argument("--bandwidth", help="per-link bandwidth, tc units (default: the engine's measured rate, else 10gbit)")
    p.add_argument("--overhead", help="per-message cost on each link (default: the engine's, else 50us)")
    p.add_argument("--latency", default="0us", help="one-way propagation latency (default 0)")
    p.add_argument("--batch", type=_positive_int, help="per-worker batch (default: the model's, 32)")
    p.add_argument("--device", default="v100", help="compute device of the cost model (v100, a100, h100, cpu)")
    p.add_argument("--scheduler", default="all",
                   help="comma-separated: fifo, bytescheduler, prophet, and the all-reduce baselines ddp (DDP's "
                        "buckets: the default and the best bucket of a sweep) and horovod (tensor fusion: the "
                        "defaults and the best cycle time and fusion threshold of a sweep); or all (default): "
                        "the three schedulers, and on all-reduce ddp and horovod too")
    p.add_argument("--iterations", type=_positive_int,
                   help="simulated iterations; the step time is the mean steady-state iteration (default 30)")
    p.add_argument("--steps", type=_positive_int,
                   help="time as the benchmarks (ab) do instead: --warmup untimed iterations, then STEPS timed "
                        "steps from a synchronised start until every byte of the last is synchronised; a "
                        "profile's recorded iterations replay from the first timed step")
    p.add_argument("--warmup", type=_non_negative_int,
                   help="untimed iterations before the measurement (default: 5 with --steps, as ab; else a "
                        "third of --iterations, at most 10)")
    p.add_argument("--jitter", type=float, default=0.0,
                   help="per-worker compute jitter per iteration, as a fraction (0.05 = 5%%; default 0)")
    p.add_argument("--skew", type=float, metavar="SECONDS",
                   help="simulate every worker of a parameter server on its own, each with its own scheduler, "
                        "worker w starting w x SECONDS after worker 0 (workers out of step share the servers' "
                        "links unlike one representative worker; default: one representative worker)")
    p.add_argument("--hold-skew", action="store_true",
                   help="with --skew and 2 workers: hold the late worker at its skew, giving it the share of the "
                        "servers' ingress that keeps it there (which worker TCP favours differs from cluster to "
                        "cluster; equal shares drift workers apart), as a replay takes a recording's skew "
                        "(default: start apart, then drift)")
    p.add_argument("--slow-worker", type=float, default=1.0, metavar="FACTOR",
                   help="one worker computes FACTOR times slower (default 1: none)")
    p.add_argument("--bandwidth-at", action="append", default=[], metavar="TIME=RATE",
                   help="change the bandwidth at a simulated time, e.g. 2s=3gbit (repeatable)")
    p.add_argument("--compute-at", action="append", default=[], metavar="TIME=FACTOR",
                   help="scale compute times from a simulated time on, e.g. 3s=1.3 (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--plot", metavar="PNG", help="write a bar chart of iteration times")
    p.add_argument("--trace", metavar="JSON", help="write a Chrome trace of one iteration (chrome://tracing)")
    p.set_defaults(func=run)


def _int_at_least(minimum: int):
    """An argparse type: an integer >= ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} must be >= {minimum}")
        return value
    return parse


_positive_int, _non_negative_int = _int_at_least(1), _int_at_least(0)


def _measurement(args) -> dict:
    """``compare``'s iterations, warm-up, traced iteration and whether the run is timed as the
    benchmarks do."""
    if args.steps is not None:
        if args.iterations is not None:
            raise UserError("give --iterations (steady state) or --steps (timed as the benchmarks), not both")
        warmup = 5 if args.warmup is None else args.warmup
        return {"iterations": warmup + args.steps, "warmup": warmup, "synchronised": True,
                "trace_iteration": warmup + args.steps // 2}
    iterations = args.iterations or 30
    warmup = min(10, iterations // 3) if args.warmup is None else args.warmup
    if args.warmup is not None and warmup > iterations - 2:
        raise UserError(f"--warmup {warmup} leaves too few of --iterations {iterations} to measure; "
                        f"valid: at most {max(0, iterations - 2)}")
    return {"iterations": iterations, "warmup": warmup, "synchronised": False, "trace_iteration": iterations // 2}


def _steps(items: list[str], parse_value, what: str) -> tuple[tuple[float, float], ...]:
    steps = []
    for item in items:
        when, sep, value = item.partition("=")
        if not sep:
            raise UserError(f"--{what} {item!r} is not TIME=VALUE, e.g. 2s=3gbit")
        steps.append((parse_latency(when, f"--{what} time") / 1e6, parse_value(value)))
    return tuple(steps)


def _factor(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UserError(f"--compute-at factor {text!r} is invalid; valid: a number > 0 (1.3 = 30% slower)")
    return value


def _bytes_per_s(text: str) -> float:
    bits = parse_bandwidth(text)
    if bits is None:
        raise UserError(f"bandwidth {text!r} must be a finite rate, e.g. 10gbit")
    return bits / 8


def _load_model(args):
    from byteps_prophet.profile import load_profile
    from byteps_prophet.sim.costmodel import compute_times
    from byteps_prophet.sim.recorded import iteration_times, model_and_times
    from byteps_prophet.sim.simulation import layers_from
    from byteps_prophet.sim.zoo import get_model

    if args.profile:
        if args.model:
            raise UserError("give --model or --profile, not both (a profile names its own model)")
        profile = load_profile(args.profile)
        model, times = model_and_times(profile)
        recorded = iteration_times(profile) if args.compute != "median" else ()
        return model, layers_from(model, times, recorded)
    if args.compute:
        raise UserError(f"--compute {args.compute} needs --profile (the zoo's models have no recorded iterations)")
    if not args.model:
        raise UserError("--model is required (resnet50, vgg16, alexnet, inception_v3, bert_base) unless --profile is given")
    model = get_model(args.model)
    return model, layers_from(model, compute_times(model, args.batch or model.default_batch, args.device))


def run(args) -> int:
    from byteps_prophet.sim.simulation import SimulatedCluster
    from byteps_prophet.sim.runner import compare, parse_schedulers, plot, report, write_trace

    settings = Settings.from_env()
    engine = _engine(args)
    bandwidth = args.bandwidth or ("10gbit" if engine is None or not engine.bandwidth_bytes_per_s
                                   else f"{engine.bandwidth_bytes_per_s:.0f}bps")
    args.bandwidth = bandwidth
    args.arch = args.arch or ("ps" if engine is None or engine.is_parameter_server else "allreduce")
    schedulers = parse_schedulers(args.scheduler, args.arch)
    if args.hold_skew and args.skew is None:
        raise UserError("--hold-skew holds the workers at their --skew; valid: --skew SECONDS with it, or no "
                        "--hold-skew")
    if args.hold_skew and args.workers != 2:
        raise UserError(f"--hold-skew with --workers {args.workers}: a skew is held between two workers (the favour "
                        f"TCP gives one of two, as measured); valid: --workers 2, or no --hold-skew")
    cluster = SimulatedCluster(
        workers=args.workers, servers=args.servers, arch=args.arch, bandwidth=_bytes_per_s(bandwidth),
        overhead=parse_latency(args.overhead or "50us", "--overhead") / 1e6,
        latency=parse_latency(args.latency, "--latency") / 1e6,
        bandwidth_steps=_steps(args.bandwidth_at, _bytes_per_s, "bandwidth-at"),
        compute_steps=_steps(args.compute_at, _factor, "compute-at"),
        engine=engine, jitter=args.jitter, slow_worker=args.slow_worker, skew=args.skew, hold_skew=args.hold_skew,
    )
    if args.skew is not None and ({"ddp", "horovod"} & set(schedulers)):
        raise UserError("--skew simulates FIFO, ByteScheduler and Prophet on every worker; valid: "
                        "--scheduler without ddp and horovod, or no --skew")
    model, layers = _load_model(args)
    progress = None
    if not args.json and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=sum(len(v) for k, v in _variants(schedulers)), desc="simulating", leave=False)
        progress = lambda name: (bar.set_postfix_str(name), bar.update(1))  # noqa: E731
    measurement = _measurement(args)
    comparison = compare(layers, cluster, schedulers, settings, **measurement, progress=progress)
    if progress is not None:
        bar.close()
    out = report(comparison, model=model.name, tensors=len(layers), params=model.params,
                 batch=args.batch or model.default_batch, workers=args.workers,
                 servers=cluster.traits.servers or args.workers, arch=args.arch, bandwidth=args.bandwidth,
                 engine=cluster.traits.to_dict(),
                 measure=({"timed_steps": args.steps, "warmup": measurement["warmup"]} if args.steps
                          else {"iterations": measurement["iterations"], "warmup": measurement["warmup"]}))
    if args.trace:
        write_trace(comparison, args.trace)
    if args.plot:
        plot(comparison, args.plot, f"{model.name}, {args.workers} workers, {args.arch}, {args.bandwidth}")
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        _print_table(out)
    return 0


def _engine(args):
    """The engine profile named by ``--engine``, with ``--overhead`` over its message cost; None
    without one (an ideal engine)."""
    from byteps_prophet.core.traits import load_engine

    if not args.engine:
        return None
    engine = load_engine(args.engine)
    if args.overhead:
        engine = engine.replace(message_cost_s=parse_latency(args.overhead, "--overhead") / 1e6)
    return engine


def _variants(schedulers):
    from byteps_prophet.sim.runner import VARIANTS

    return [(s, VARIANTS[s]) for s in schedulers]


def _print_table(out: dict) -> None:
    print(f"{out['model']}: {out['tensors']} tensors, {out['params']:,} params, batch {out['batch']}, "
          f"{out['workers']} workers, {out['arch']}, {out['bandwidth']}")
    print(f"compute {out['compute_ms']:.2f} ms, lower bound {out['lower_bound_ms']:.2f} ms")
    fifo = out["results"].get("fifo", {}).get("iter_ms")
    print(f"{'scheduler':<34}{'iter ms':>10}{'/ bound':>9}{'speedup vs fifo':>17}")
    for name, r in out["results"].items():
        speedup = f"{fifo / r['iter_ms']:.3f}x" if fifo else "-"
        label = f"{name} (credit {r['credit']:,})" if "credit" in r else name
        if "bucket_bytes" in r:
            label = f"{name} (bucket {r['bucket_bytes'] / 2**20:g} MiB)"
        if "fusion_bytes" in r:
            label = f"{name} ({r['cycle_s'] * 1e3:g} ms, {r['fusion_bytes'] / 2**20:g} MiB)"
        print(f"{label:<34}{r['iter_ms']:>10.2f}{r['ratio_to_lower_bound']:>9.3f}{speedup:>17}")
