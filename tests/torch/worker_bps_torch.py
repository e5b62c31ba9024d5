"""An ordinary BytePS PyTorch training script (nothing byteps_prophet in it): bps.init(),
bps.DistributedOptimizer(SGD, named_parameters), bps.broadcast_parameters, K steps of
zero_grad/backward/step on fixed synthetic data, a final evaluation, then each worker saves its
parameters to <$BPP_OUT without .pt>.rank<r>.pt. Whether byteps_prophet schedules it is up to
BYTEPS_SCHEDULER alone (patch 90).

``--reference N``: no BytePS; one process computes what N workers must end with (the N gradients
averaged, as BytePS's push_pull(average=True) does, then the same SGD update), saved to $BPP_OUT.
Knobs: BPP_STEPS (default 5), BPP_OUT."""
import os
import sys

import torch

STEPS = int(os.environ.get("BPP_STEPS", "5"))
OUT = os.environ.get("BPP_OUT", "")
BATCH = 16


def make_model():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.ReLU(),  # 300 rows: several atoms
                               torch.nn.Linear(300, 200), torch.nn.ReLU(), torch.nn.Linear(200, 10))


def make_optimizer(params):
    return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-4)


def batches(rank):
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        yield torch.randn(BATCH, 64, generator=gen), torch.randint(0, 10, (BATCH,), generator=gen)


def train():
    import byteps.torch as bps

    bps.init()
    rank = bps.rank()
    torch.set_num_threads(1)
    model = make_model()
    optimizer = bps.DistributedOptimizer(make_optimizer(model.parameters()),
                                         named_parameters=model.named_parameters())
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    loss_fn = torch.nn.CrossEntropyLoss()
    for x, y in batches(rank):
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    with torch.no_grad():  # evaluate the trained model
        loss = float(loss_fn(model(x), y))
    if OUT:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()},
                   f"{OUT.removesuffix('.pt')}.rank{rank}.pt")
    print("worker", rank, "done, loss", loss, flush=True)


def reference(workers):
    model = make_model()
    optimizer = make_optimizer(model.parameters())
    loss_fn = torch.nn.CrossEntropyLoss()
    streams = [batches(rank) for rank in range(workers)]
    for _ in range(STEPS):
        total = None
        for stream in streams:
            model.zero_grad()
            x, y = next(stream)
            loss_fn(model(x), y).backward()
            grads = [p.grad.clone() for p in model.parameters()]
            total = grads if total is None else [t + g for t, g in zip(total, grads)]
        for p, g in zip(model.parameters(), total):
            p.grad = g / workers
        optimizer.step()
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, OUT)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--reference"]:
        reference(int(sys.argv[2]))
    else:
        train()
