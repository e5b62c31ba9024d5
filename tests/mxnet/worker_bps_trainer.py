"""An ordinary BytePS MXNet/Gluon training script (nothing byteps_prophet in it): bps.init(),
bps.DistributedTrainer(params, optimizer, optimizer_params), K steps of trainer.step(batch) on fixed
synthetic data, then each worker saves its parameters to <$BPP_OUT without .npz>.rank<r>.npz.
Whether byteps_prophet schedules it is up to BYTEPS_SCHEDULER alone (patch 91).

``--reference N``: no BytePS; one process computes what N workers must end with (each worker's
gradient scaled by 1/(batch*N) as the stock trainer does, the N summed in rank order, the same SGD
update), saved to $BPP_OUT, and the initial values to <$BPP_OUT without .npz>.init.npz. Knobs: BPP_STEPS (default 5), BPP_OUT."""
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

STEPS = int(os.environ.get("BPP_STEPS", "5"))
OUT = os.environ.get("BPP_OUT", "")
BATCH = 16
OPTIMIZER = ("sgd", {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4})


def make_net():
    mx.random.seed(7)
    net = gluon.nn.HybridSequential()
    with net.name_scope():
        net.add(gluon.nn.Dense(300, in_units=64, activation="relu"),  # 300 rows: several atoms/partitions
                gluon.nn.Dense(200, in_units=300, activation="relu"),
                gluon.nn.Dense(10, in_units=200))
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    return net


def batches(rank):
    rng = np.random.RandomState(100 + rank)
    for _ in range(STEPS):
        yield mx.nd.array(rng.randn(BATCH, 64)), mx.nd.array(rng.randint(0, 10, BATCH))


def backward(net, loss_fn, x, y):
    with autograd.record():
        loss = loss_fn(net(x), y)
    loss.backward()
    return loss


def train():
    import byteps.mxnet as bps

    bps.init()
    rank = bps.rank()
    # The stock trainer writes 'lr.s' into the working directory of local rank 0: keep it out of the repo.
    workdir = os.path.join(os.path.dirname(OUT) if OUT else "/tmp", f"bps-trainer-w{rank}")
    os.makedirs(workdir, exist_ok=True)
    os.chdir(workdir)
    net = make_net()
    trainer = bps.DistributedTrainer(net.collect_params(), *OPTIMIZER)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for x, y in batches(rank):
        loss = backward(net, loss_fn, x, y)
        trainer.step(BATCH)
    params = {k: v.data().asnumpy() for k, v in net.collect_params().items()}
    if OUT:
        np.savez(f"{OUT.removesuffix('.npz')}.rank{rank}.npz", **params)
    print("worker", rank, "done, loss", float(loss.mean().asscalar()), flush=True)


def reference(workers):
    net = make_net()
    np.savez(f"{OUT.removesuffix('.npz')}.init.npz", **{k: v.data().asnumpy() for k, v in net.collect_params().items()})
    params = [p for _, p in sorted(net.collect_params().items())]
    trainer = gluon.Trainer(params, *OPTIMIZER, kvstore=None)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    streams = [batches(rank) for rank in range(workers)]
    for _ in range(STEPS):
        total = None
        for stream in streams:
            backward(net, loss_fn, *next(stream))
            grads = [p.grad() * (1.0 / BATCH / workers) for p in params]
            total = grads if total is None else [t + g for t, g in zip(total, grads)]
        for p, g in zip(params, total):
            p.grad()[:] = g
        trainer.step(1)  # rescale_grad 1, as DistributedTrainer's step(batch)
    np.savez(OUT, **{k: v.data().asnumpy() for k, v in net.collect_params().items()})


if __name__ == "__main__":
    if sys.argv[1:2] == ["--reference"]:
        reference(int(sys.argv[2]))
    else:
        train()
