"""A BytePS PyTorch training script written as a user would, that checks every step against the
single-process reference: a lost or stale update shows at the step it happens.

Each rank trains a deep, narrow-and-wide MLP on small batches, so steps come back to back and the server's rounds overlap as tightly as they can. Every rank also
trains a reference copy on every rank's batch, averaged (what stock BytePS must compute), and compares
its parameters with it after each step. Ends with ``bps.shutdown()``, as scripts do.

Prints one line per rank: ``rank R steps S mismatch_step M max_diff D sum X`` (M is -1 when every
step matched). Exit status 3 on a mismatch. Knobs: STRESS_STEPS (default 200), STRESS_LAYERS (default 12).
"""
import os
import sys

import torch

import byteps.torch as bps

STEPS = int(os.environ.get("STRESS_STEPS", "200"))
LAYERS = int(os.environ.get("STRESS_LAYERS", "2"))
BATCH = 32
TOLERANCE = 1e-6  # relative to the parameter's scale; a lost update moves it by a whole step


class Model(torch.nn.Module):
    """A stack of linear layers, wide and narrow in turn: many keys, small (biases) and large (several
    BytePS partitions), whose gradients become ready one layer after the other, as in training."""

    def __init__(self, layers):
        super().__init__()
        widths = [64] + [(256, 1024, 16, 512, 32)[i % 5] for i in range(layers - 1)] + [10]
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(widths, widths[1:]))

    def forward(self, x):
        for layer in self.layers[:-1]:
            x = torch.relu(layer(x))
        return self.layers[-1](x)


def batch(rank, step):
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(BATCH, 64, generator=gen), torch.randint(0, 10, (BATCH,), generator=gen)


def loss_of(model, data):
    x, y = data
    return torch.nn.functional.cross_entropy(model(x), y)


def compare(after, start, size):
    """The first step whose parameters differ from the single-process reference (every rank's batch,
    gradients averaged), and the largest relative difference over all steps."""
    reference = Model(LAYERS)
    with torch.no_grad():
        for p, q in zip(reference.parameters(), start):
            p.copy_(q)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    mismatch, worst = -1, 0.0
    for step, params in enumerate(after):
        ref_opt.zero_grad()
        (sum(loss_of(reference, batch(r, step)) for r in range(size)) / size).backward()
        ref_opt.step()
        with torch.no_grad():
            diff = max(float(((p - q).abs() / (1 + q.abs())).max()) for p, q in zip(params, reference.parameters()))
        worst = max(worst, diff)
        if not diff <= TOLERANCE and mismatch < 0:  # NaN counts as a mismatch
            mismatch = step
    return mismatch, worst


def main():
    bps.init()
    rank, size = bps.rank(), bps.size()
    torch.manual_seed(rank)  # differently on each rank: broadcast_parameters must make them equal
    model = Model(LAYERS)
    opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters())
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    start = [p.detach().clone() for p in model.parameters()]
    data = [batch(rank, step) for step in range(STEPS)]  # drawn before: steps back to back
    after = []
    for step in range(STEPS):
        opt.zero_grad()
        loss_of(model, data[step]).backward()
        opt.step()
        after.append([p.detach().clone() for p in model.parameters()])
    mismatch, worst = compare(after, start, size)
    total = sum(p.double().sum().item() for p in model.parameters())
    print(f"rank {rank} steps {STEPS} mismatch_step {mismatch} max_diff {worst:.3g} sum {total:.9f}",
          flush=True)
    bps.shutdown()
    return 3 if mismatch >= 0 else 0


if __name__ == "__main__":
    sys.exit(main())
