"""The MXNet side of the stress test (scripts/stress_pushpull.py --path byteps-mxnet|kvstore): a Gluon
script that checks every step against the single-process reference, so a lost or stale update shows
at the step it happens.

STRESS_STORE=byteps: an unmodified BytePS script (``bps.init()``, ``bps.DistributedTrainer``), which
BYTEPS_SCHEDULER alone switches to a scheduler (patch 91). STRESS_STORE=kvstore: Gluon's
``Trainer(kvstore=...)`` over MXNet's own parameter server: the ``dist_sync`` store as created, or
wrapped in byteps_prophet's ScheduledKVStore when BYTEPS_SCHEDULER names a scheduler.

Prints ``rank R steps S mismatch_step M max_diff D sum X`` per rank, as tests/byteps/stress_worker.py.
Knobs: STRESS_STEPS (default 200).
"""
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

STEPS = int(os.environ.get("STRESS_STEPS", "200"))
STORE = os.environ.get("STRESS_STORE", "byteps")
BATCH = 32
OPTIMIZER = ("sgd", {"learning_rate": 0.05, "momentum": 0.9})
TOLERANCE = 1e-6


def make_net():
    mx.random.seed(7)
    net = gluon.nn.HybridSequential()
    with net.name_scope():
        net.add(gluon.nn.Dense(256, in_units=64, activation="relu"), gluon.nn.Dense(10, in_units=256))
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    return net


def batch(rank, step):
    rng = np.random.RandomState(1000 * step + rank)
    return mx.nd.array(rng.randn(BATCH, 64)), mx.nd.array(rng.randint(0, 10, BATCH))


def backward(net, loss_fn, data):
    with autograd.record():
        loss = loss_fn(net(data[0]), data[1])
    loss.backward()


def reference_after_each_step(size):
    """Each worker's gradient scaled by 1/(batch * workers) and summed, as both trainers do."""
    net = make_net()
    params = ordered(net)
    trainer = gluon.Trainer(params, *OPTIMIZER, kvstore=None)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    after = []
    for step in range(STEPS):
        total = None
        for rank in range(size):
            backward(net, loss_fn, batch(rank, step))
            grads = [p.grad() * (1.0 / BATCH / size) for p in params]
            total = grads if total is None else [t + g for t, g in zip(total, grads)]
        for p, g in zip(params, total):
            p.grad()[:] = g
        trainer.step(1)
        after.append([p.data().asnumpy() for p in params])
    return after


def ordered(net):
    """Parameters in name order (each net has its own name prefix; the order is the same)."""
    return [p for _, p in sorted(net.collect_params().items())]


def make_trainer(net):
    if STORE == "byteps":
        import byteps.mxnet as bps

        bps.init()
        return bps.DistributedTrainer(net.collect_params(), *OPTIMIZER), bps.rank(), bps.size()
    kv = mx.kv.create("dist_sync")
    if os.environ.get("BYTEPS_SCHEDULER", "fifo").strip().lower() not in ("", "fifo"):
        from byteps_prophet.mxnet.kvstore import ScheduledKVStore

        kv = ScheduledKVStore(kv)
    # the optimizer on the servers (dist_sync's default for Gluon)
    return gluon.Trainer(net.collect_params(), *OPTIMIZER, kvstore=kv), kv.rank, kv.num_workers


def main():
    # BytePS's trainer writes 'lr.s' into the working directory: keep it out of the caller's
    os.chdir(os.environ.get("TMPDIR", "/tmp"))
    net = make_net()
    trainer, rank, size = make_trainer(net)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    data = [batch(rank, step) for step in range(STEPS)]  # drawn before: steps back to back
    after = []
    for step in range(STEPS):
        backward(net, loss_fn, data[step])
        trainer.step(BATCH * size if STORE == "kvstore" else BATCH)
        after.append([p.data().asnumpy() for p in ordered(net)])
    mismatch, worst = -1, 0.0
    for step, (got, expected) in enumerate(zip(after, reference_after_each_step(size))):
        diff = max(float(np.max(np.abs(g - e) / (1 + np.abs(e)))) for g, e in zip(got, expected))
        worst = max(worst, diff)
        if not diff <= TOLERANCE and mismatch < 0:
            mismatch = step
    total = sum(float(np.sum(p.data().asnumpy().astype(np.float64))) for p in net.collect_params().values())
    print(f"rank {rank} steps {STEPS} mismatch_step {mismatch} max_diff {worst:.3g} sum {total:.9f}", flush=True)
    return 3 if mismatch >= 0 else 0


if __name__ == "__main__":
    sys.exit(main())
