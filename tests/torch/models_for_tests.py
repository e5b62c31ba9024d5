"""Small models with the awkward cases: unused parameters, frozen layers, many tensors."""
import torch
from torch import nn


class WithUnused(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 8)
        self.unused = nn.Linear(8, 8)  # never called: no gradient ever
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.b = nn.Linear(8, 3)
        self.scale = nn.Parameter(torch.tensor(1.5))  # a 0-d parameter used in the parent's forward

    def forward(self, x):
        return self.b(torch.relu(self.frozen(torch.relu(self.a(x))))) * self.scale


class Many(nn.Module):
    """1,202 parameter tensors (601 tiny linear layers)."""

    def __init__(self, n=601):
        super().__init__()
        self.inp = nn.Linear(6, 4)
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(n - 2))
        self.out = nn.Linear(4, 3)

    def forward(self, x):
        x = self.inp(x)
        for layer in self.layers:
            x = x + 0.01 * layer(x)
        return self.out(x)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 300), nn.ReLU(), nn.Linear(300, 200), nn.ReLU(), nn.Linear(200, 3))

    def forward(self, x):
        return self.net(x)


def build(name):
    torch.manual_seed(0)
    return {"mlp": MLP, "unused": WithUnused, "many": Many}[name]()


def data(name, rank, step, micro=0, batch=8):
    g = torch.Generator().manual_seed(rank * 100003 + step * 101 + micro)
    return torch.randn(batch, 6, generator=g), torch.randn(batch, 3, generator=g)
