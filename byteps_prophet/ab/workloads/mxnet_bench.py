"""MXNet worker benchmark: K training steps of a real Gluon model on CPU with synthetic data.

Run it as every worker of a ps-lite job (the role environment comes from the cluster)::

    byteps-prophet cluster run --engine mxnet --workers 2 -- \\
        python -m byteps_prophet.ab.workloads.mxnet_bench --model vgg --steps 20 --batch 8
    python -m byteps_prophet.cluster.loopback_mxnet -w 2 -- python -m byteps_prophet.ab.workloads.mxnet_bench --model resnet18

The scheduler comes from BYTEPS_SCHEDULER (fifo|bytescheduler|prophet) and its BYTESCHEDULER_* /
PROPHET_* knobs. The scheduling leader (the worker with DMLC_WORKER_ID=0, the cluster's worker-0)
prints ONE JSON line on stdout (other output goes to stderr)::

    {"framework": "mxnet", "backend": "kvstore", "scheduler": "prophet", "model": "vgg", "batch": 8,
     "workers": 2, "steps": 20, "warmup": 3, "samples_per_s": 41.7, "step_s": [...], ...}

``samples_per_s`` = batch x workers x steps / time of the timed steps (after ``--warmup`` untimed
steps and a flush, ending when every update is applied), as the torch bench; ``step_s`` are the
timed steps' times (one step ends when its loss is computed, which needs the previous step's
parameters, so synchronisation that delays the next forward is counted). With ``--tune-credit P``
(BYTEPS_SCHEDULER=bytescheduler) the leader tunes the credit with ``CreditTuner`` instead (each
probe: one transition step, then P scored steps) and the line carries ``best_credit`` and ``probes``.
Exit status 2 with a one-line message on bad arguments or settings.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from byteps_prophet.backends.rendezvous import rendezvous
from byteps_prophet.errors import UserError

BACKENDS = ("kvstore", "byteps", "local")


MODELS = ("resnet18", "resnet50", "vgg", "vgg16", "transformer", "mlp")  # = models.MODELS, without importing mxnet
ALIASES = {"resnet": "resnet18"}  # the A/B runner's model names


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m byteps_prophet.ab.workloads.mxnet_bench",
                                     description="MXNet worker benchmark (prints one JSON line on worker 0).")
    parser.add_argument("--model", default="resnet18", choices=MODELS + tuple(ALIASES),
                        help="model (default resnet18; 'resnet' = resnet18)")
    parser.add_argument("--steps", type=int, default=20, help="measured steps after the warm-up (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="steps not measured (default 3)")
    parser.add_argument("--batch", type=int, default=8, help="per-worker batch size (default 8)")
    parser.add_argument("--backend", default="kvstore", choices=BACKENDS,
                        help="kvstore: scheduled mx.kv dist_sync (default); byteps: scheduled byteps.mxnet; "
                             "local: this worker trains alone, no store (the A/B runner's compute_only limit)")
    parser.add_argument("--kvstore", default="dist_sync", help="MXNet kvstore type (default dist_sync)")
    parser.add_argument("--input-size", type=int, default=None,
                        help="image side / sequence length (default per model: resnet 64, vgg 32, vgg16 224, transformer 16)")
    parser.add_argument("--width", type=float, default=1.0,
                        help="width multiplier of vgg, transformer and mlp (default 1.0)")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--json-out", default=None, help="also write the JSON line to this file (worker 0)")
    parser.add_argument("--workers", type=int, default=None,
                        help="expected number of workers (checked against DMLC_NUM_WORKER's job)")
    parser.add_argument("--progress", action="store_true",
                        help="print '#progress STEP' on stdout after each timed step (worker 0)")
    parser.add_argument("--hybridize", action="store_true",
                        help="hybridize the model (static_alloc, static_shape) before training")
    parser.add_argument("--comm-only", action="store_true",
                        help="time only the synchronisation of the model's gradients over the unwrapped store "
                             "(push then pull of every gradient-shaped buffer, no compute, no scheduler; kvstore)")
    parser.add_argument("--tune-credit", type=int, default=None, metavar="PROBE_STEPS",
                        help="tune ByteScheduler's credit instead of timing (needs BYTEPS_SCHEDULER=bytescheduler): "
                             "each probe runs PROBE_STEPS scored steps; the JSON line carries best_credit and probes")
    parser.add_argument("--tune-probes", default=None, metavar="RANDOM,GUIDED",
                        help="random and expected-improvement probes for --tune-credit (default 6,3)")
    args = parser.parse_args(argv)
    args.model = ALIASES.get(args.model, args.model)
    for name in ("steps", "batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    if not args.width > 0:
        parser.error("--width must be > 0")
    return args


def parse_probes(text: str) -> tuple[int, int]:
    try:
        random_probes, guided = (int(v) for v in text.split(","))
    except ValueError:
        raise UserError(f"--tune-probes {text!r} is invalid; valid: RANDOM,GUIDED (two integers, e.g. 6,3)") from None
    if random_probes < 1 or guided < 0:
        raise UserError(f"--tune-probes {text!r} is invalid; valid: RANDOM >= 1, GUIDED >= 0")
    return random_probes, guided


def run(args: argparse.Namespace) -> dict | None:
    from byteps_prophet.core import Settings

    settings = Settings.from_env()  # invalid BYTEPS_SCHEDULER etc. fail here, before any connection
    if args.tune_credit is not None:
        if args.tune_credit < 1:
            raise UserError(f"--tune-credit {args.tune_credit} is invalid; valid: an integer >= 1 (steps per probe)")
        if args.backend == "local":
            raise UserError("--tune-credit needs a store to schedule; valid: --backend kvstore or byteps")
        if settings.scheduler != "bytescheduler":
            raise UserError(f"--tune-credit tunes ByteScheduler's credit but BYTEPS_SCHEDULER={settings.scheduler}; "
                            f"valid: BYTEPS_SCHEDULER=bytescheduler")
        probes = parse_probes(args.tune_probes or "6,3")
    if not rendezvous().role and args.kvstore.startswith("dist") and args.backend != "local":
        raise UserError("no DMLC_ROLE: run under `byteps-prophet cluster run --engine mxnet` or "
                        "`python -m byteps_prophet.cluster.loopback_mxnet`")
    import mxnet as mx
    import numpy as np
    from mxnet import autograd, gluon

    from byteps_prophet.ab.workloads import mxnet_models as models

    if args.comm_only:
        if args.backend != "kvstore":
            raise UserError(f"--comm-only with --backend {args.backend}; valid: --backend kvstore")
        return comm_only(args, mx.kv.create(args.kvstore))
    profile_path = settings.profile or None
    if profile_path and args.backend != "local" and not settings.trace:
        # the store's trace holds when each gradient was staged: the profile's ready times
        settings = settings.replace(trace=profile_path + ".trace.json")
    if args.backend == "local":
        kv = _Alone()
    elif args.backend == "byteps":
        from byteps_prophet.mxnet.byteps_backend import create_byteps_kvstore
        kv = create_byteps_kvstore(settings)
    else:
        from byteps_prophet.mxnet.kvstore import ScheduledKVStore
        kv = ScheduledKVStore(mx.kv.create(args.kvstore), settings=settings)

    mx.random.seed(1)
    net = models.build(args.model, width=args.width)
    net.initialize(mx.init.Xavier(magnitude=2.0), ctx=mx.cpu())
    if args.hybridize:
        net.hybridize(static_alloc=True, static_shape=True)
    shape = models.input_shape(args.model, args.batch, args.input_size)
    rng = np.random.RandomState(kv.rank)
    data = mx.nd.array(rng.uniform(-1, 1, shape))
    label = mx.nd.array(rng.randint(0, 10, args.batch))
    # No inference forward before training: with MXNet 1.9's oneDNN build it can leave the dist_sync
    # server aborting with "init K first" (seen with the unwrapped store too). Deferred shapes are
    # completed by the first training forward; the trainer initialises the store in its first step.
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": args.lr, "momentum": 0.9},
                            kvstore=None if isinstance(kv, _Alone) else kv)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    if args.workers is not None and args.workers != kv.num_workers and not isinstance(kv, _Alone):
        raise UserError(f"--workers {args.workers} but the job has {kv.num_workers} workers")
    # The reporting worker is the scheduling leader: the host with DMLC_WORKER_ID=0 (the cluster's
    # worker-0, where the A/B runner reads progress and the JSON line), not necessarily ps-lite rank 0.
    leader = getattr(kv, "leader", kv.rank == 0)

    marks: list[float] | None = [] if profile_path and leader and not isinstance(kv, _Alone) else None

    def one_step():
        with autograd.record():
            loss = loss_fn(net(data), label)
        if marks is not None:  # recording: backward starts once the loss is computed
            loss.wait_to_read()
            marks.append(time.monotonic())
        loss.backward()
        trainer.step(args.batch)
        loss.wait_to_read()

    def sync():
        if hasattr(kv, "flush"):
            kv.flush()
        mx.nd.waitall()

    ends = []
    for _ in range(args.warmup):
        one_step()
        ends.append(time.monotonic())
    params = [p for p in net.collect_params().values() if p.grad_req != "null"]
    result = {
        "framework": "mxnet", "backend": args.backend, "scheduler": settings.scheduler,
        "model": args.model, "width": args.width, "batch": args.batch, "workers": kv.num_workers, "rank": kv.rank,
        "leader": leader, "warmup": args.warmup, "tensors": len(params),
        "param_bytes": int(sum(p.data().size * 4 for p in params)),
        "partition": settings.partition, "credit": settings.credit, "prophet_mode": settings.prophet_mode,
    }
    if args.tune_credit is not None:
        result.update(tune(kv, one_step, sync, args.tune_credit, probes, settings,
                           sum(p.data().size for p in params), leader))
    else:
        sync()
        start = time.monotonic()
        cpu_start = time.process_time()
        ends = [start]
        for step in range(args.steps):
            one_step()
            ends.append(time.monotonic())
            if args.progress and leader:
                print(f"#progress {step + 1}", flush=True)
        sync()
        total = time.monotonic()
        cpu_s = time.process_time() - cpu_start
        step_s = [b - a for a, b in zip(ends, ends[1:])]
        result.update({
            "steps": args.steps,
            # global rate: every worker's samples over the timed steps, ending when all is synchronised
            "samples_per_s": args.batch * kv.num_workers * args.steps / (total - start),
            "step_s": [round(s, 6) for s in step_s],
            "step_s_median": statistics.median(step_s),
            "flush_s": round(total - ends[-1], 6),
            # this worker's CPU seconds (all its threads: compute, engine, store) per timed step: on a
            # machine where workers and servers share cores, store overhead shows here first
            "cpu_s_per_step": round(cpu_s / args.steps, 6),
        })
    if marks is not None and args.tune_credit is None:
        forward_s = forward_time(lambda: loss_fn(net(data), label))
        result["profile"] = write_profile(profile_path, kv, trainer, marks[args.warmup:], total, args, forward_s)
    if hasattr(kv, "stats"):
        result.update(kv.stats())
    if hasattr(kv, "close"):
        kv.close()
    return result


def comm_only(args, kv) -> dict:
    """Steps that only synchronise: every gradient-shaped buffer pushed in backward order, every
    parameter pulled, then wait: the store's and the link's time alone (the A/B runner's comm_only)."""
    import mxnet as mx

    from byteps_prophet.ab.workloads import mxnet_models as models

    mx.random.seed(1)
    net = models.build(args.model, width=args.width)
    net.initialize(mx.init.Xavier(magnitude=2.0), ctx=mx.cpu())
    net(mx.nd.zeros(models.input_shape(args.model, args.batch, args.input_size)))  # complete deferred shapes
    params = [p for p in net.collect_params().values() if p.grad_req != "null"]
    grads = [mx.nd.ones(p.shape) for p in params]
    outs = [mx.nd.zeros(p.shape) for p in params]
    keys = list(range(len(params)))
    kv.init(keys, outs)
    mx.nd.waitall()
    worker_id = rendezvous().worker_id
    leader = (kv.rank if worker_id is None else worker_id) == 0

    def one_step() -> None:
        for key in reversed(keys):
            kv.push(key, grads[key], priority=-key)
        for key in reversed(keys):
            kv.pull(key, out=outs[key], priority=-key)
        mx.nd.waitall()

    for _ in range(args.warmup):
        one_step()
    start = time.monotonic()
    for _ in range(args.steps):
        one_step()
    elapsed = time.monotonic() - start
    result = {"framework": "mxnet", "backend": args.backend, "model": args.model, "width": args.width,
              "batch": args.batch, "workers": kv.num_workers, "rank": kv.rank, "leader": leader,
              "steps": args.steps, "comm_only": True,
              "tensors": len(params), "param_bytes": int(sum(g.size * 4 for g in grads)),
              "samples_per_s": args.batch * kv.num_workers * args.steps / elapsed,
              "step_s_median": elapsed / args.steps}
    return result


def forward_time(forward, repeats: int = 3) -> float:
    """Median seconds of a training-mode forward pass (``forward()`` returns the loss) with nothing
    else in flight: after the timed steps, every update applied."""
    from mxnet import autograd

    times = []
    for _ in range(repeats):
        start = time.monotonic()
        with autograd.record():
            loss = forward()
        loss.wait_to_read()
        times.append(time.monotonic() - start)
    return statistics.median(times)


def write_profile(path: str, kv, trainer, marks: list[float], end: float, args,
                  forward_s: float | None = None) -> str | None:
    """The timed steps' profile (docs/PROFILE.md) from the store's trace: each gradient's ready time is
    when the store staged it, relative to the step's backward start (its loss computed). MXNet's engine
    runs the forward asynchronously, so no layer's forward is timed: ``forward_s``, a whole forward
    timed alone (``forward_time``), is spread over the tensors as their backward times are (without
    it the simulator guesses half of each backward time, which misreads a forward-heavy model).
    Parameters are named by their
    store key, the Trainer's index (it numbers them by sorted name), and listed in forward order, as the
    store learned it from the backward pass (``ScheduledKVStore.forward_index``)."""
    from byteps_prophet.profile import ProfileRecorder

    from byteps_prophet.core.trace import events, seconds

    log = getattr(kv, "trace", None)
    if log is None or not len(log) or not marks:
        print("bench: profile not written: the store kept no trace", file=sys.stderr)
        return None
    place = getattr(kv, "forward_index", {})
    keys = sorted((i for i, p in enumerate(trainer._params) if p.grad_req != "null"),
                  key=lambda i: (place.get(i, len(place) + i), i))
    tensors = [(str(i), trainer._params[i].shape) for i in keys]
    recorder = ProfileRecorder(tensors, model=args.model, framework="mxnet", batch=args.batch, device="cpu",
                               world_size=kv.num_workers, meta={"backend": args.backend, "width": args.width})
    names = {name for name, _ in tensors}
    bounds = marks + [end]
    ready = [(seconds(e["ts"]), e["name"]) for e in events(log.document(), "ready") if e["name"] in names]
    for k, start in enumerate(marks):
        recorder.begin_iteration(start)
        for t, name in ready:
            if start <= t < bounds[k + 1]:
                recorder.gradient_ready(name, t)
        recorder.end_iteration(bounds[k + 1])
    try:
        profile = recorder.profile()
        if forward_s:
            profile = profile.with_forward_total(forward_s)
        profile.save(path)
    except UserError as err:  # a profile problem must not fail the benchmark
        print(f"bench: profile not written: {err}", file=sys.stderr)
        return None
    return path


class _Alone:
    """``--backend local``: this worker trains by itself (no store, no communication); every worker
    of the job does so at the same time, so their compute competes for the machine as in training."""

    num_workers = 1

    def __init__(self) -> None:
        self.rank = rendezvous().worker_id or 0
        self.leader = self.rank == 0


def tune(kv, one_step, sync, probe_steps: int, probes: tuple[int, int], settings, total_elements: int,
         leader: bool) -> dict:
    """The leader tunes ByteScheduler's credit (``core.tuning.tune_credit``, bounds as the torch
    bench's); every worker runs the same steps."""
    from byteps_prophet.core.tuning import credit_bounds, tune_credit

    def set_credit(credit: int) -> None:
        if leader:
            with kv._lock:
                kv.scheduler.set_credit(credit)

    return tune_credit(credit_bounds(settings.partition, total_elements), probes, probe_steps, set_credit,
                       one_step, sync)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        result = run(args)
    except UserError as err:
        print(f"bench: error: {err}", file=sys.stderr)
        return 2
    if result is not None and result["leader"]:
        line = json.dumps(result)
        print(line, flush=True)
        if args.json_out:
            with open(args.json_out, "w") as f:
                f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
