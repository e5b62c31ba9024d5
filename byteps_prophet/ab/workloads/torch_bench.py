"""Worker side of the A/B runner: train a real model on synthetic data, print one JSON line.

    python -m byteps_prophet.ab.workloads.torch_bench --model vgg --batch 16 --steps 20 [--warmup 5]
        [--backend gloo|byteps|local] [--threads 1] [--width 1.0] [--lr 0.01]
        [--profile PATH] [--progress] [--tune-credit PROBE_STEPS] [--dump PATH] [--comm-only]
        [--ddp [--bucket-mb MB] | --tune-bucket PROBE_STEPS [--bucket-sweep MB,MB,...]] [--stock-byteps]

Scheduler and knobs come from the environment (``BYTEPS_SCHEDULER``, ``BYTESCHEDULER_*``,
``PROPHET_*``); rank and world size from ``RANK``/``WORLD_SIZE`` or ``DMLC_WORKER_ID``/
``DMLC_NUM_WORKER``. Output (stdout, one line per worker)::

    {"samples_per_s": ..., "iter_s": ..., "iter_s_spread": ..., "rank": 0, "world_size": 2,
     "scheduler": "prophet", "backend": "gloo", "model": "vgg", "batch": 16, "steps": 20}

``samples_per_s`` is the global rate: world_size x batch x steps / time of the timed steps (after
``--warmup`` untimed ones, ending when every update is applied). With ``--progress`` a line
``#progress STEP`` goes to stdout after each timed step (the A/B runner changes bandwidth on it).
With ``--tune-credit P`` the run instead tunes ByteScheduler's credit on rank 0 with
``CreditTuner`` (each probe: P steps at one credit, first step discarded) and the JSON line carries
``best_credit`` and ``probes``. With ``--comm-only`` a step is only the synchronisation of every
gradient (model-shaped buffers, all issued at once in backward order, then waited for): no compute,
no scheduler; the A/B runner's ``comm_only`` reference. Invalid settings exit 2 with one line on stderr.

What a torch user runs instead, on the same model, batches, threads and timing, with the user's
optimizer stepped after the whole backward (no scheduler, no layer-wise update or overlap):
``--ddp`` wraps the model in ``torch.nn.parallel.DistributedDataParallel`` on the gloo (or NCCL)
group, with its default bucket or ``--bucket-mb MB``; ``--tune-bucket P`` instead runs every bucket
of ``--bucket-sweep`` (a fresh DDP each: one step not scored, then P steps) and the JSON line carries
``best_bucket_mb`` and ``probes``; ``--stock-byteps`` (BytePS backend, ``BYTEPS_SCHEDULER=fifo``)
uses BytePS's own ``byteps.torch.DistributedOptimizer``: every gradient pushed and pulled as its
hook fires, cut and queued by BytePS itself, each worker on its own (no cross-worker order).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m byteps_prophet.ab.workloads.torch_bench")
    p.add_argument("--model", default="vgg")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--backend", default=None)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--width", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--optimizer", default="sgd", choices=("sgd", "adam", "adamw"))
    p.add_argument("--profile", default=None)
    p.add_argument("--progress", action="store_true")
    p.add_argument("--tune-credit", type=int, default=0, metavar="PROBE_STEPS")
    p.add_argument("--tune-probes", default="6,3", help="random,guided probes for --tune-credit")
    p.add_argument("--dump", default=None, help="torch.save the final parameters (rank 0) here")
    p.add_argument("--workers", type=int, default=None, help="accepted for symmetry with the runner")
    p.add_argument("--comm-only", action="store_true",
                   help="time only the synchronisation of the model's gradients (no compute, no scheduler)")
    p.add_argument("--ddp", action="store_true", help="torch DistributedDataParallel instead of a scheduler")
    p.add_argument("--bucket-mb", type=float, default=None, help="DDP's bucket_cap_mb (default: DDP's own, 25)")
    p.add_argument("--tune-bucket", type=int, default=0, metavar="PROBE_STEPS",
                   help="time DDP with every bucket of --bucket-sweep, PROBE_STEPS steps each")
    p.add_argument("--bucket-sweep", default=",".join(map(str, BUCKET_SWEEP_MB)), help="MB, comma-separated")
    p.add_argument("--stock-byteps", action="store_true",
                   help="BytePS's own DistributedOptimizer (backend byteps, BYTEPS_SCHEDULER=fifo)")
    return p.parse_args(argv)


BUCKET_SWEEP_MB = (0.5, 1, 2, 5, 10, 25, 50)


def _bucket_sweep(text: str) -> list[float]:
    from byteps_prophet.errors import UserError

    try:
        sweep = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        sweep = []
    if not sweep or min(sweep) <= 0:
        raise UserError(f"--bucket-sweep {text!r} is invalid; valid: positive sizes in MB, comma-separated")
    return sweep


def main(argv=None) -> int:
    args = parse(argv)
    from byteps_prophet.errors import UserError

    try:
        return run(args)
    except UserError as err:
        print(f"bench: error: {err}", file=sys.stderr)
        return 2


def run(args) -> int:
    from byteps_prophet.core import Settings
    from byteps_prophet.errors import UserError

    settings = Settings.from_env()  # validate first: a bad value stops the job before any work
    ddp = args.ddp or bool(args.tune_bucket)
    sweep = _bucket_sweep(args.bucket_sweep) if args.tune_bucket else []
    if args.bucket_mb is not None and not args.bucket_mb > 0:
        raise UserError(f"--bucket-mb {args.bucket_mb:g} is invalid; valid: a size in MB > 0")
    import torch

    torch.set_num_threads(max(1, args.threads))
    from byteps_prophet.backends import make_backend
    from byteps_prophet.torch import DistributedOptimizer, broadcast_parameters
    from byteps_prophet.ab.workloads.torch_models import build, synthetic_batch
    from byteps_prophet.torch.optimizer import default_backend_name

    backend = make_backend(args.backend or default_backend_name(settings))
    if ddp and backend.name not in ("gloo", "nccl"):
        raise UserError(f"--ddp needs a torch.distributed backend; valid: --backend gloo (got {backend.name})")
    if args.stock_byteps and (backend.name != "byteps" or settings.scheduler != "fifo"):
        raise UserError("--stock-byteps needs --backend byteps and BYTEPS_SCHEDULER=fifo (BytePS's own optimizer)")
    torch.manual_seed(0)
    model = build(args.model, args.width)
    if backend.name in ("gloo", "nccl"):
        broadcast_parameters(model.state_dict(), root_rank=0)
    elif backend.name == "byteps":
        import byteps.torch as bps

        bps.broadcast_parameters(model.state_dict(), root_rank=0)
        bps.push_pull(torch.zeros(1), name="bpp.bench.barrier")  # every worker is up before timing
    if args.comm_only:
        out = comm_only(model, backend, args)
        print(json.dumps(out), flush=True)
        backend.close()
        if backend.name == "byteps":
            import byteps.torch as bps

            bps.shutdown()
        return 0
    x, y, loss_fn = synthetic_batch(args.model, model, args.batch, seed=1000 + backend.rank)
    make = {"sgd": lambda ps: torch.optim.SGD(ps, lr=args.lr, momentum=0.9),
            "adam": lambda ps: torch.optim.Adam(ps, lr=args.lr),
            "adamw": lambda ps: torch.optim.AdamW(ps, lr=args.lr)}[args.optimizer]
    if args.tune_bucket:
        out = tune_bucket(args, sweep, backend, make)
        print(json.dumps(out), flush=True)
        _leave_ddp(backend)
        return 0
    if ddp:
        model = _ddp(model, args.bucket_mb)
        opt = _Plain(make(model.parameters()))
    elif args.stock_byteps:
        import byteps.torch as bps

        opt = _Plain(bps.DistributedOptimizer(make(model.parameters()), named_parameters=model.named_parameters()))
    else:
        opt = DistributedOptimizer(make(model.parameters()), model.named_parameters(), settings=settings,
                                   backend=backend, profile=args.profile, model_name=args.model,
                                   batch_size=args.batch)

    def one_step():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(args.warmup):
        one_step()
    opt.synchronize()
    scheduler = "ddp" if ddp else "byteps_stock" if args.stock_byteps else settings.scheduler
    out = {"rank": backend.rank, "world_size": backend.size, "scheduler": scheduler,
           "backend": backend.name, "model": args.model, "batch": args.batch,
           "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)}
    if args.tune_credit:
        out.update(tune(opt, one_step, args, backend))
    else:
        marks = [time.monotonic()]
        for step in range(args.steps):
            one_step()
            marks.append(time.monotonic())
            if args.progress and backend.rank == 0:
                print(f"#progress {step + 1}", flush=True)
        opt.synchronize()
        marks[-1] = time.monotonic()
        elapsed = marks[-1] - marks[0]
        iters = [b - a for a, b in zip(marks, marks[1:])]
        q = statistics.quantiles(iters, n=4) if len(iters) >= 2 else [iters[0]] * 3
        out.update(samples_per_s=backend.size * args.batch * args.steps / elapsed, iter_s=elapsed / args.steps,
                   iter_s_median=statistics.median(iters), iter_s_spread=q[2] - q[0], steps=args.steps)
        if opt.scheduler is not None and opt.scheduler.bandwidth.known:
            out["bandwidth_Bps"] = opt.scheduler.bandwidth.bytes_per_s
        if ddp:
            out["bucket_mb"] = args.bucket_mb if args.bucket_mb is not None else DDP_DEFAULT_BUCKET_MB
    if isinstance(opt, _Plain):  # which optimizer class ran, so a result says it was the stock one
        out["optimizer"] = f"{type(opt.opt).__module__}.{type(opt.opt).__name__}"
    opt.close()
    if args.dump and backend.rank == 0:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.dump)
    if ddp:
        del model, opt, one_step
        _leave_ddp(backend)
    elif args.stock_byteps:
        backend.close()
    print(json.dumps(out), flush=True)
    if backend.name == "byteps":
        import byteps.torch as bps

        bps.shutdown()  # leave ps-lite together with the others, before interpreter teardown
    return 0


DDP_DEFAULT_BUCKET_MB = 25.0  # DistributedDataParallel's bucket_cap_mb default


class _Plain:
    """A torch optimizer (or BytePS's) with the few calls the bench makes on ours."""

    scheduler = None

    def __init__(self, opt) -> None:
        self.opt = opt

    def zero_grad(self) -> None:
        self.opt.zero_grad()

    def step(self) -> None:
        self.opt.step()

    def synchronize(self) -> None:  # DDP's backward and BytePS's step return synchronised
        pass

    def close(self) -> None:
        pass


def _leave_ddp(backend) -> None:
    """Free DDP's reducer, then leave the group together: a reducer outliving its process group,
    or a rank destroying the group while its peer is still in a collective, aborts the process at
    exit ("terminate called without an active exception")."""
    import gc

    gc.collect()
    backend.close()  # after a barrier: every rank leaves together


def _ddp(model, bucket_mb: float | None):
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model) if bucket_mb is None else DistributedDataParallel(model, bucket_cap_mb=bucket_mb)


def tune_bucket(args, sweep: list[float], backend, make) -> dict:
    """Every rank times a fresh DDP per bucket of ``sweep`` (one step not scored: DDP rebuilds its
    buckets in the gradients' order after its first), the same steps on every rank; worker 0's line
    names the fastest."""
    import torch

    from byteps_prophet.ab.workloads.torch_models import build, synthetic_batch

    probes = []
    for mb in sweep:
        torch.manual_seed(0)
        model = _ddp(build(args.model, args.width), mb)
        x, y, loss_fn = synthetic_batch(args.model, model.module, args.batch, seed=1000 + backend.rank)
        opt = make(model.parameters())

        def one_step():
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()

        one_step()
        t0 = time.monotonic()
        for _ in range(args.tune_bucket):
            one_step()
        probes.append([mb, (time.monotonic() - t0) / args.tune_bucket])
        del model, opt
    best = min(probes, key=lambda probe: probe[1])[0]
    return {"rank": backend.rank, "world_size": backend.size, "scheduler": "ddp", "backend": backend.name,
            "model": args.model, "batch": args.batch, "best_bucket_mb": best, "probes": probes}


def comm_only(model, backend, args) -> dict:
    """Steps that only synchronise: every gradient-shaped buffer issued at once in backward order,
    then waited for, as FIFO does with no compute to wait on. The time of the link and the engine alone."""
    import torch

    from byteps_prophet.backends import Op

    params = [(name, p) for name, p in model.named_parameters() if p.requires_grad][::-1]
    buffers = [(name, torch.ones_like(p).reshape(p.shape[0] if p.dim() else 1, -1)) for name, p in params]

    def one_step(iteration: int) -> None:
        handles = [backend.issue(Op(name, iteration, 0, buf.shape[0], tensor=buf)) for name, buf in buffers]
        for handle in handles:
            backend.wait(handle)

    for it in range(args.warmup):
        one_step(it)
    start = time.monotonic()
    for step in range(args.steps):
        one_step(args.warmup + step)
    elapsed = time.monotonic() - start
    return {"rank": backend.rank, "world_size": backend.size, "backend": backend.name, "model": args.model,
            "batch": args.batch, "steps": args.steps, "comm_only": True, "iter_s": elapsed / args.steps,
            "samples_per_s": backend.size * args.batch * args.steps / elapsed,
            "param_bytes": sum(buf.numel() * buf.element_size() for _, buf in buffers)}


def tune(opt, one_step, args, backend) -> dict:
    """Rank 0 tunes the credit (``core.tuning.tune_credit``); every rank runs the same steps."""
    from byteps_prophet.core.tuning import credit_bounds, tune_credit

    def set_credit(credit: int) -> None:
        if backend.rank == 0:
            with opt._engine.lock:
                opt.scheduler.set_credit(credit)

    total = sum(p.numel() for g in opt.param_groups for p in g["params"])
    probes = tuple(int(v) for v in args.tune_probes.split(","))
    return tune_credit(credit_bounds(opt._engine.settings.partition, total), probes, args.tune_credit,
                       set_credit, one_step, opt.synchronize)


if __name__ == "__main__":
    sys.exit(main())
