"""MXNet worker benchmark: K training steps of a real Gluon model on CPU with synthetic data.

Run it as every worker of a ps-lite job (the role environment comes from the cluster)::

    byteps-prophet cluster run --engine mxnet --workers 2 -- \\
        python -m byteps_prophet.mxnet.bench --model vgg --steps 20 --batch 8
    python -m byteps_prophet.mxnet.launch -w 2 -- python -m byteps_prophet.mxnet.bench --model resnet18

The scheduler comes from BYTEPS_SCHEDULER (fifo|bytescheduler|prophet) and its BYTESCHEDULER_* /
PROPHET_* knobs. Worker 0 prints ONE JSON line on stdout (other output goes to stderr)::

    {"framework": "mxnet", "backend": "kvstore", "scheduler": "prophet", "model": "vgg", "batch": 8,
     "workers": 2, "steps": 20, "warmup": 3, "samples_per_s": 41.7, "step_s": [...], ...}

``samples_per_s`` = batch x workers / mean(step_s) over the steps after the warm-up; ``step_s`` are
those steps' times (one step ends when its loss is computed, which needs the previous step's
parameters, so synchronisation that overlaps the next forward is counted where it delays it).
Exit status 2 with a one-line message on bad arguments or settings.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from byteps_prophet.errors import UserError

BACKENDS = ("kvstore", "byteps")


MODELS = ("resnet18", "resnet50", "vgg", "vgg16", "transformer")  # = models.MODELS, without importing mxnet
ALIASES = {"resnet": "resnet18"}  # the A/B runner's model names


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m byteps_prophet.mxnet.bench",
                                     description="MXNet worker benchmark (prints one JSON line on worker 0).")
    parser.add_argument("--model", default="resnet18", choices=MODELS + tuple(ALIASES),
                        help="model (default resnet18; 'resnet' = resnet18)")
    parser.add_argument("--steps", type=int, default=20, help="measured steps after the warm-up (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="steps not measured (default 3)")
    parser.add_argument("--batch", type=int, default=8, help="per-worker batch size (default 8)")
    parser.add_argument("--backend", default="kvstore", choices=BACKENDS,
                        help="kvstore: scheduled mx.kv dist_sync (default); byteps: scheduled byteps.mxnet")
    parser.add_argument("--kvstore", default="dist_sync", help="MXNet kvstore type (default dist_sync)")
    parser.add_argument("--input-size", type=int, default=None,
                        help="image side / sequence length (default per model: resnet 64, vgg 32, vgg16 224, transformer 16)")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--json-out", default=None, help="also write the JSON line to this file (worker 0)")
    parser.add_argument("--workers", type=int, default=None,
                        help="expected number of workers (checked against DMLC_NUM_WORKER's job)")
    parser.add_argument("--progress", action="store_true",
                        help="print '#progress STEP' on stdout after each timed step (worker 0)")
    parser.add_argument("--tune-credit", type=int, default=None, help="not supported for MXNet (exits 2)")
    parser.add_argument("--tune-probes", default=None, help="not supported for MXNet (exits 2)")
    args = parser.parse_args(argv)
    args.model = ALIASES.get(args.model, args.model)
    for name in ("steps", "batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    return args


def run(args: argparse.Namespace) -> dict | None:
    from byteps_prophet.core import Settings

    settings = Settings.from_env()  # invalid BYTEPS_SCHEDULER etc. fail here, before any connection
    if args.tune_credit is not None or args.tune_probes is not None:
        raise UserError("--tune-credit/--tune-probes are not supported by the MXNet bench yet; "
                        "run the A/B with --no-tune (or a swept BYTESCHEDULER_CREDIT)")
    if "DMLC_ROLE" not in os.environ and args.kvstore.startswith("dist"):
        raise UserError("no DMLC_ROLE: run under `byteps-prophet cluster run --engine mxnet` or "
                        "`python -m byteps_prophet.mxnet.launch`")
    import mxnet as mx
    import numpy as np
    from mxnet import autograd, gluon

    from byteps_prophet.mxnet import models

    if args.backend == "byteps":
        from byteps_prophet.mxnet.byteps_backend import create_byteps_kvstore
        kv = create_byteps_kvstore(settings)
    else:
        from byteps_prophet.mxnet.kvstore import ScheduledKVStore
        kv = ScheduledKVStore(mx.kv.create(args.kvstore), settings=settings)

    mx.random.seed(1)
    net = models.build(args.model)
    net.initialize(mx.init.Xavier(magnitude=2.0), ctx=mx.cpu())
    if os.environ.get("BPP_BENCH_HYBRIDIZE", "0") == "1":
        net.hybridize(static_alloc=True, static_shape=True)
    shape = models.input_shape(args.model, args.batch, args.input_size)
    rng = np.random.RandomState(kv.rank)
    data = mx.nd.array(rng.uniform(-1, 1, shape))
    label = mx.nd.array(rng.randint(0, 10, args.batch))
    # No inference forward before training: with MXNet 1.9's oneDNN build it can leave the dist_sync
    # server aborting with "init K first" (seen with the unwrapped store too). Deferred shapes are
    # completed by the first training forward; the trainer initialises the store in its first step.
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": args.lr, "momentum": 0.9}, kvstore=kv)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    if args.workers is not None and args.workers != kv.num_workers:
        raise UserError(f"--workers {args.workers} but the job has {kv.num_workers} workers")
    # ps-lite numbers ranks by connection order, not DMLC_WORKER_ID; the cluster's "worker-0" is the
    # host with DMLC_WORKER_ID=0, and that is where the A/B runner looks for progress lines.
    reporter = os.environ.get("DMLC_WORKER_ID", str(kv.rank)) == "0"
    ends = []
    for step in range(args.warmup + args.steps):
        with autograd.record():
            loss = loss_fn(net(data), label)
        loss.backward()
        trainer.step(args.batch)
        loss.wait_to_read()
        ends.append(time.monotonic())
        if args.progress and reporter and step >= args.warmup:
            print(f"#progress {step - args.warmup + 1}", flush=True)
    if hasattr(kv, "flush"):
        kv.flush()
    mx.nd.waitall()
    total = time.monotonic()
    starts = ends[args.warmup - 1] if args.warmup > 0 else None
    step_s = [b - a for a, b in zip(ends, ends[1:])][max(0, args.warmup - 1):]
    params = [p for p in net.collect_params().values() if p.grad_req != "null"]
    mean = statistics.mean(step_s) if step_s else float("nan")
    result = {
        "framework": "mxnet", "backend": args.backend,
        "scheduler": settings.scheduler,
        "model": args.model, "batch": args.batch, "workers": kv.num_workers, "rank": kv.rank,
        "steps": len(step_s), "warmup": args.warmup,
        "samples_per_s": args.batch * kv.num_workers / mean if step_s else None,
        "step_s": [round(s, 6) for s in step_s],
        "step_s_median": statistics.median(step_s) if step_s else None,
        "tensors": len(params), "param_bytes": int(sum(p.data().size * 4 for p in params)),
        "partition": settings.partition, "credit": settings.credit,
        "prophet_mode": settings.prophet_mode,
        "flush_s": round(total - ends[-1], 6),
    }
    if starts is None:
        result["note"] = "--warmup 0: the first step (start-up) is not measured"
    if hasattr(kv, "stats"):
        result.update(kv.stats())
    if hasattr(kv, "close"):
        kv.close()
    return result


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        result = run(args)
    except UserError as err:
        print(f"bench: error: {err}", file=sys.stderr)
        return 2
    if result is not None and result["rank"] == 0:
        line = json.dumps(result)
        print(line, flush=True)
        if args.json_out:
            with open(args.json_out, "w") as f:
                f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
