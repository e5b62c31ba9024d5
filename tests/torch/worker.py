"""A test worker: train a small model K steps under BYTEPS_SCHEDULER, dump the parameters.

argv: OUT_PATH STEPS OPTIMIZER [MODEL] (rank r > 0 saves to OUT_PATH.rank<r>). Env: RANK/WORLD_SIZE/MASTER_* (set by the launcher),
DIE_AT_STEP (rank 1 SIGKILLs itself there), BPPS (backward passes per step).
"""
import os
import signal
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from models_for_tests import build, data  # noqa: E402

from byteps_prophet.torch import DistributedOptimizer  # noqa: E402

out, steps, optname = sys.argv[1], int(sys.argv[2]), sys.argv[3]
model_name = sys.argv[4] if len(sys.argv) > 4 else "mlp"
rank = int(os.environ.get("RANK", "0"))
bpps = int(os.environ.get("BPPS", "1"))
die_at = int(os.environ.get("DIE_AT_STEP", "-1"))
torch.set_num_threads(1)
model = build(model_name)
opt = {"sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
       "adam": lambda p: torch.optim.Adam(p, lr=0.01),
       "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1)}[optname](
    [p for p in model.parameters() if p.requires_grad])
opt = DistributedOptimizer(opt, [(n, p) for n, p in model.named_parameters() if p.requires_grad],
                           backward_passes_per_step=bpps, backend="gloo")
for step in range(steps):
    if rank == 1 and step == die_at:
        os.kill(os.getpid(), signal.SIGKILL)
    opt.zero_grad()
    for micro in range(bpps):
        x, y = data(model_name, rank, step, micro)
        loss = torch.nn.functional.mse_loss(model(x), y) / bpps
        loss.backward()
    opt.step()
opt.synchronize()
torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, out if rank == 0 else f"{out}.rank{rank}")
opt.close()
print("worker done", rank, flush=True)
