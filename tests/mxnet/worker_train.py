"""Worker for the multi-process tests: K steps of a small Gluon net on fixed synthetic data, then
saves the parameters to $BPP_OUT (worker 0; worker r to <$BPP_OUT without .npz>.rank<r>.npz; worker 0
also the initial ones to <$BPP_OUT without .npz>.init.npz).
Knobs: BPP_STEPS, BPP_PLAIN=1 (unwrapped dist_sync store), BPP_DIE_AT=step:worker (the worker with that DMLC_WORKER_ID exits 3 at that step), BPP_UNUSED=1 (a parameter with
grad_req='null' and a block not in the graph), BPP_ON_KV=0 (optimizer on the worker),
BPP_BACKEND=byteps (the scheduled store over byteps.mxnet; optimizer on the worker),
BPP_STALL=step:worker (that worker's main thread stalls 0.4 s right after its first pushpull of that
step, as a descheduled thread on a loaded machine would: its store closes the step there),
BPP_MANY=N (N more parameters of 10 elements each, added to the output: N + 6 tensors),
BPP_RAISE_AT=step:worker (the worker with that DMLC_WORKER_ID raises an unhandled exception at that step)."""
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from byteps_prophet.mxnet import kvstore as skv

steps = int(os.environ.get("BPP_STEPS", "4"))
rank_env = int(os.environ.get("DMLC_WORKER_ID", "0"))
mx.random.seed(7)
np.random.seed(7)


class Net(gluon.HybridBlock):
    def __init__(self, unused=False, many=0):
        super().__init__()
        self.unused, self.many = unused, many
        with self.name_scope():
            for i in range(many):  # as many tensors as a large model has, each with its own gradient
                setattr(self, f"extra{i}", self.params.get(f"extra{i}", shape=(10,), init=mx.init.Zero()))
            self.fc1 = gluon.nn.Dense(300, in_units=64)  # 300 rows: several atoms/partitions
            self.fc2 = gluon.nn.Dense(200, in_units=300)
            self.out = gluon.nn.Dense(10, in_units=200)
            if unused:
                self.spare = gluon.nn.Dense(50, in_units=64)  # never in the graph
                self.frozen = self.params.get("frozen", shape=(10,), init=mx.init.One(), grad_req="null")

    def hybrid_forward(self, F, x, **kw):
        y = self.out(F.relu(self.fc2(F.relu(self.fc1(x)))))
        if self.unused:
            y = F.broadcast_add(y, kw["frozen"].reshape((1, 10)))
        if self.many:
            y = F.broadcast_add(y, F.add_n(*(kw[f"extra{i}"] for i in range(self.many))).reshape((1, 10)))
        return y


net = Net(unused=os.environ.get("BPP_UNUSED") == "1", many=int(os.environ.get("BPP_MANY", "0")))
net.initialize(mx.init.Xavier(), ctx=mx.cpu())
if os.environ.get("BPP_OUT") and rank_env == 0:  # the initial values, to tell training from none
    np.savez(f"{os.environ['BPP_OUT'].removesuffix('.npz')}.init.npz",
             **{k: v.data().asnumpy() for k, v in net.collect_params().items()})
if os.environ.get("BPP_BACKEND") == "byteps":
    from byteps_prophet.mxnet.byteps_backend import create_byteps_kvstore
    kv = create_byteps_kvstore()
elif os.environ.get("BPP_PLAIN") == "1":
    kv = mx.kv.create("dist_sync")
    # Stock MXNet 1.9 hazard (docs/MXNET.md): Gluon broadcasts the initial parameters inside the first
    # step, after backward; nothing orders that pull before the key's first gradient push, and a
    # dist_sync server without an optimizer answers a pull that comes after every worker's push with
    # the gradient sum. The reference waits for its initial values, as a user of the stock store must.
    _stock_broadcast = kv.broadcast

    def _broadcast_then_wait(key, value, out, priority=0):
        _stock_broadcast(key, value, out, priority=priority)
        for array in out if isinstance(out, (list, tuple)) else [out]:
            array.wait_to_read()

    kv.broadcast = _broadcast_then_wait
else:
    kv = skv.create("dist_sync")
stall = os.environ.get("BPP_STALL")
current_step = [0]
if stall and stall.split(":")[1] == os.environ.get("DMLC_WORKER_ID"):
    import time
    _pushpull, _stalled = kv.pushpull, set()

    def _stalling_pushpull(key, value, out=None, priority=0):
        _pushpull(key, value, out=out, priority=priority)
        if current_step[0] == int(stall.split(":")[0]) and not _stalled:
            _stalled.add(key)
            time.sleep(0.4)

    kv.pushpull = _stalling_pushpull
on_kv = os.environ.get("BPP_ON_KV", "1") == "1" and os.environ.get("BPP_BACKEND") != "byteps"
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4},
                        kvstore=kv, update_on_kvstore=on_kv)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
rng = np.random.RandomState(100 + kv.rank)
die = os.environ.get("BPP_DIE_AT")
fail = os.environ.get("BPP_RAISE_AT")
for step in range(steps):
    if fail and fail.split(":")[1] == os.environ.get("DMLC_WORKER_ID") and int(fail.split(":")[0]) == step:
        raise RuntimeError(f"worker {kv.rank} raising at step {step}")
    if die and die.split(":")[1] == os.environ.get("DMLC_WORKER_ID") and int(die.split(":")[0]) == step:
        print(f"worker {kv.rank} dying at step {step}", flush=True)
        os._exit(3)
    current_step[0] = step
    x = mx.nd.array(rng.randn(16, 64))
    y = mx.nd.array(rng.randint(0, 10, 16))
    with autograd.record():
        loss = loss_fn(net(x), y)
    loss.backward()
    trainer.step(16, ignore_stale_grad=True)
mx.nd.waitall()
if os.environ.get("BPP_OUT"):  # worker 0's at BPP_OUT, the others' at <BPP_OUT>.rank<r>.npz
    params = {k: v.data().asnumpy() for k, v in net.collect_params().items()}
    out = os.environ["BPP_OUT"]
    np.savez(out if kv.rank == 0 else f"{out.removesuffix('.npz')}.rank{kv.rank}.npz", **params)
if isinstance(kv, skv.ScheduledKVStore) and isinstance(kv._real, mx.kv.KVStore):
    mxnet_store = kv._real
    kv.close()
    print("worker", kv.rank, "left ps-lite at close:", mxnet_store.handle is None, flush=True)
elif hasattr(kv, "close"):
    kv.close()
print("worker", kv.rank, "done", flush=True)
