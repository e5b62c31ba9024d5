"""A plain BytePS PyTorch job, as a user writes it: bps.init(), the DistributedOptimizer, parameters
broadcast from rank 0, a few SGD steps on data of its own; each worker saves its parameters to
OUT.rank<r>.pt. Whether byteps_prophet schedules it is BYTEPS_SCHEDULER's business alone.

    python bps_train.py OUT [STEPS] [PAUSE]      # PAUSE: seconds of sleep per step (a long job)
    python bps_train.py --reference N OUT [STEPS]  # one process: what N workers must end with
"""
import sys
import time

import torch


def model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(32, 96), torch.nn.Tanh(), torch.nn.Linear(96, 4))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(8, 32, generator=g), torch.randn(8, 4, generator=g)


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.5)


def train(out, steps, pause):
    import byteps.torch as bps

    bps.init()
    torch.set_num_threads(1)
    net = model()
    opt = bps.DistributedOptimizer(sgd(net.parameters()), named_parameters=net.named_parameters())
    bps.broadcast_parameters(net.state_dict(), root_rank=0)
    for step in range(steps):
        x, y = batch(bps.rank(), step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
        print(f"rank {bps.rank()} step {step}", flush=True)
        time.sleep(pause)
    with torch.no_grad():  # evaluate the trained model (with Prophet, the last step's updates land in this forward)
        x, y = batch(bps.rank(), steps)
        print(f"rank {bps.rank()} done, loss {float(torch.nn.functional.mse_loss(net(x), y)):.6f}", flush=True)
    torch.save(net.state_dict(), f"{out}.rank{bps.rank()}.pt")


def reference(workers, out, steps):
    net = model()
    opt = sgd(net.parameters())
    for step in range(steps):
        grads = None
        for rank in range(workers):
            net.zero_grad()
            x, y = batch(rank, step)
            torch.nn.functional.mse_loss(net(x), y).backward()
            got = [p.grad.clone() for p in net.parameters()]
            grads = got if grads is None else [a + b for a, b in zip(grads, got)]
        for p, g in zip(net.parameters(), grads):
            p.grad = g / workers
        opt.step()
    torch.save(net.state_dict(), out)


if __name__ == "__main__":
    if sys.argv[1] == "--reference":
        reference(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 5)
    else:
        train(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5,
              float(sys.argv[3]) if len(sys.argv) > 3 else 0.0)
