"""One worker: init a key, pull it, push the same key (what Gluon's first Trainer.step does with
update_on_kvstore=False: broadcast the initial parameters, then push the gradients), with the pull
held back in MXNet's engine for a second. Prints ``RESULT pulled=initial|gradient|other grad=<mean>``.
BPP_PLAIN=1: the unwrapped dist_sync store; else the scheduled store (BYTEPS_SCHEDULER, ...)."""
import os
import threading

import mxnet as mx
import numpy as np

from byteps_prophet.mxnet import kvstore as skv
from byteps_prophet.mxnet.gates import EngineGate

kv = mx.kv.create("dist_sync") if os.environ.get("BPP_PLAIN") == "1" else skv.create("dist_sync")
initial = np.arange(3000, dtype=np.float32).reshape(300, 10)
weight = mx.nd.array(initial)
kv.init(3, weight)
mx.nd.waitall()
# Holds every later writer of weight's engine variable. On rank 0 MXNet 1.9 receives a pull into the
# buffer the init was pushed from (weight itself, or views of it), so the pull waits for the gate;
# the gradient below does not.
gate = EngineGate()
token = gate.hold([weight])
kv.pull(3, out=weight)
grad = mx.nd.full((300, 10), 5.0)
kv.pushpull(3, grad)  # one worker: the sum is the gradient itself
threading.Timer(1.0, gate.release, (token,)).start()
mx.nd.waitall()
value = weight.asnumpy()
pulled = "initial" if np.array_equal(value, initial) else "gradient" if (value == 5.0).all() else "other"
print(f"RESULT pulled={pulled} grad={float(grad.asnumpy().mean())}", flush=True)
if hasattr(kv, "close"):
    kv.close()
