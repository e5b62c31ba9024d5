"""``byteps-prophet ab``: the interleaved A/B of FIFO, ByteScheduler (default and tuned) and Prophet."""
from __future__ import annotations

import json


def register(subparsers) -> None:
    p = subparsers.add_parser("ab", help="real-training A/B of the schedulers on the local cluster",
                              description="Run FIFO, ByteScheduler (default and tuned credit) and Prophet "
                                          "interleaved on real training in the local cluster; see docs/AB.md.")
    p.add_argument("--framework", default="torch", help="torch or mxnet (default torch)")
    p.add_argument("--backend", default=None, help="torch: gloo|byteps; mxnet: kvstore|byteps (default gloo / kvstore)")
    p.add_argument("--model", default="vgg", help="resnet, vgg, transformer (default vgg)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--bandwidth", default="1gbit", help="per link and direction, tc units (default 1gbit)")
    p.add_argument("--bandwidth-schedule", default="",
                   help="comma-separated rates applied by tc during each run, evenly spaced in steps, e.g. "
                        "'200mbit,1gbit' with --bandwidth 1gbit gives 1gbit -> 200mbit -> 1gbit")
    p.add_argument("--steps", type=int, default=20, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--width", type=float, default=1.0,
                   help="model width multiplier (default 1.0; MXNet: vgg and transformer only)")
    p.add_argument("--threads", type=int, default=1, help="compute threads per worker (torch)")
    p.add_argument("--no-tune", action="store_true", help="skip the tuned-credit ByteScheduler variant")
    p.add_argument("--tune-steps", type=int, default=3, help="steps per tuning probe")
    p.add_argument("--tune-probes", default="6,3", help="random,guided tuning probes")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    p.add_argument("--no-netns", action="store_true", help="plain loopback (no shaping)")
    p.add_argument("--tcp-congestion", default=None, metavar="ALGO",
                   help="TCP congestion control of the cluster's hosts, e.g. cubic, bbr (default: this machine's; "
                        "the one used is in the output either way)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--plot", default=None, metavar="PNG")
    p.add_argument("--variants", default=",".join(("fifo", "bytescheduler", "bytescheduler_tuned", "prophet")),
                   help="comma-separated subset of fifo, bytescheduler, bytescheduler_tuned, prophet; and the "
                        "references, not run by default: compute_only (every worker trains alone, no "
                        "communication; a bound of the limit), comm_only (only the gradients' synchronisation, no "
                        "compute, not for mxnet/byteps; shown beside the limit, not a bound); "
                        "and what a torch user runs instead: ddp, ddp_tuned (torch DistributedDataParallel, default "
                        "bucket and the best of --bucket-sweep; torch/gloo), byteps_stock (BytePS's own optimizer; torch/byteps); "
                        "prophet_fused, prophet_unfused (Prophet with BYTEPS_PROPHET_FUSE=1 / 0 for that run); "
                        "bytescheduler_overlap, prophet_overlap (layer-wise overlap on, BYTEPS_PROPHET_OVERLAP=1)")
    p.add_argument("--bucket-sweep", default="0.5,1,2,5,10,25,50", metavar="MB,MB,...",
                   help="DDP bucket sizes the ddp_tuned variant's tuning run tries, --tune-steps steps each")
    p.add_argument("--record", default=None, metavar="DIR",
                   help="write each run's profile (for `simulate --profile`) and event traces (Chrome trace JSON, "
                        "for ui.perfetto.dev) into DIR")
    p.add_argument("--pool", nargs="+", default=None, metavar="JSON",
                   help="run nothing: summarise together the rounds of earlier `ab --json` outputs of the same "
                        "configuration (table, --json, --plot as for a run)")
    p.set_defaults(func=run)


def run(args) -> int:
    from byteps_prophet.ab.report import pool
    from byteps_prophet.ab.runner import CHOICES, ABConfig, ABRunner
    from byteps_prophet.errors import UserError

    if args.pool:
        return report(pool(args.pool), args)

    variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    bad = [v for v in variants if v not in CHOICES]
    if bad or not variants:
        raise UserError(f"--variants {args.variants!r} is invalid; valid: a comma-separated subset of {', '.join(CHOICES)}")

    backend = args.backend or ("gloo" if args.framework == "torch" else "kvstore")
    cfg = ABConfig(framework=args.framework, backend=backend, model=args.model, workers=args.workers,
                   bandwidth=args.bandwidth, steps=args.steps, rounds=args.rounds, warmup=args.warmup,
                   batch=args.batch, width=args.width, threads=args.threads,
                   bandwidth_schedule=[s.strip() for s in args.bandwidth_schedule.split(",") if s.strip()],
                   tune=not args.no_tune and "bytescheduler_tuned" in variants, tune_probe_steps=args.tune_steps, tune_probes=args.tune_probes,
                   timeout=args.timeout, netns=False if args.no_netns else None, record=args.record,
                   variants=variants, bucket_sweep=args.bucket_sweep, tcp_congestion=args.tcp_congestion)
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        tqdm = None
    return report(ABRunner(cfg, progress=tqdm).run(), args)


def report(summary: dict, args) -> int:
    from byteps_prophet.ab.report import format_table, plot

    if args.plot:
        plot(summary, args.plot)
    if args.json:
        print(json.dumps(summary))
    else:
        print(format_table(summary))
        if args.plot:
            print(f"plot: {args.plot}")
    return 0
