"""Real models that train on CPU with synthetic data, for the bench and the A/B runner.

* ``resnet``: a CIFAR-style ResNet-18 (BasicBlocks 2-2-2-2, widths 64-512, 11.2 M parameters) on
  32x32 images: compute-heavy per byte.
* ``vgg``: a VGG-style network (conv 3x3 stacks + two 2048-wide fully connected layers, 10.6 M
  parameters) on 32x32 images: most bytes in the last layers, little compute:
  communication-bound.
* ``transformer``: a small GPT-style language model (4 layers, d=256, 4 heads, vocabulary 8192,
  context 64; 7.4 M parameters), next-token loss on random tokens.
* ``mlp``: a tiny multi-layer perceptron (tests).

``width`` scales channel counts / model dimension (1.0 = the sizes above).
"""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

MODELS = ("resnet", "vgg", "transformer", "mlp")


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    def __init__(self, width: float = 1.0, classes: int = 10) -> None:
        super().__init__()
        w = [max(4, int(c * width)) for c in (64, 128, 256, 512)]
        self.conv1 = nn.Conv2d(3, w[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(w[0])
        layers, cin = [], w[0]
        for i, c in enumerate(w):
            layers += [BasicBlock(cin, c, 1 if i == 0 else 2), BasicBlock(c, c, 1)]
            cin = c
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layers(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class VGG(nn.Module):
    def __init__(self, width: float = 1.0, classes: int = 10) -> None:
        super().__init__()
        cfg = [64, "M", 128, "M", 256, 256, "M", 512, "M"]
        layers, cin = [], 3
        for c in cfg:
            if c == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                c = max(4, int(c * width))
                layers += [nn.Conv2d(cin, c, 3, padding=1), nn.ReLU(inplace=True)]
                cin = c
        self.features = nn.Sequential(*layers)
        hidden = max(16, int(2048 * width))
        self.classifier = nn.Sequential(
            nn.Linear(cin * 2 * 2, hidden), nn.ReLU(inplace=True),
            nn.Linear(hidden, hidden), nn.ReLU(inplace=True),
            nn.Linear(hidden, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


class TinyGPT(nn.Module):
    def __init__(self, width: float = 1.0, vocab: int = 8192, context: int = 64, layers: int = 4) -> None:
        super().__init__()
        d = max(16, int(256 * width) // 4 * 4)
        self.context = context
        self.vocab = vocab
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(context, d))
        block = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        mask = nn.Transformer.generate_square_subsequent_mask(idx.shape[1])
        return self.head(self.norm(self.blocks(x, mask=mask, is_causal=True)))


class MLP(nn.Module):
    def __init__(self, width: float = 1.0, features: int = 32, classes: int = 10) -> None:
        super().__init__()
        h = max(4, int(64 * width))
        self.net = nn.Sequential(nn.Linear(features, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, classes))

    def forward(self, x):
        return self.net(x)


def build(name: str, width: float = 1.0) -> nn.Module:
    if name == "resnet":
        return ResNet18(width)
    if name == "vgg":
        return VGG(width)
    if name == "transformer":
        return TinyGPT(width)
    if name == "mlp":
        return MLP(width)
    from byteps_prophet.errors import ConfigError

    raise ConfigError(f"model {name!r} is not a bench model; valid: {', '.join(MODELS)}")


def synthetic_batch(name: str, model: nn.Module, batch: int, seed: int):
    """(inputs, targets, loss_fn) of a fixed synthetic batch."""
    g = torch.Generator().manual_seed(seed)
    if name in ("resnet", "vgg"):
        x = torch.randn(batch, 3, 32, 32, generator=g)
        y = torch.randint(0, 10, (batch,), generator=g)
        return x, y, F.cross_entropy
    if name == "transformer":
        idx = torch.randint(0, model.vocab, (batch, model.context + 1), generator=g)
        return idx[:, :-1], idx[:, 1:], lambda out, y: F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    x = torch.randn(batch, 32, generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    return x, y, F.cross_entropy
