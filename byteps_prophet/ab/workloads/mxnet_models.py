"""Gluon models for the MXNet benchmark, sized for CPUs: real layer structure, small inputs.

* ``resnet18`` / ``resnet50``: Gluon model-zoo ResNet v1 (11.2 M / 23.5 M parameters with 10
  classes), many small tensors, compute-heavy per byte.
* ``vgg``: VGG-style: 8 conv layers (64-512 channels) on 32x32 inputs and the classic fully connected
  head (512*4*4 -> 4096 -> 4096 -> classes), 59.6 M parameters, most of them in the last layers to be
  produced and the first to be needed late: communication-heavy.
* ``vgg16``: the model-zoo VGG-16 (224x224 inputs, 134 M parameters).
* ``mlp``: a tiny perceptron (256 -> 512 -> 512 -> classes, 0.4 M parameters; tests).
* ``transformer``: a transformer-ish MLP: token embedding projection, N residual blocks of
  LayerNorm + Dense(d, 4d) + GELU + Dense(4d, d), a classifier; 12.7 M parameters at d=512, N=6.

``width`` scales the channel counts and dense sizes of ``vgg``, ``transformer`` and ``mlp`` (1.0 = the
sizes above; the transformer's d=512 x width), as the torch models' ``width`` does; the model-zoo
models keep theirs.
"""
from __future__ import annotations

import mxnet as mx
from mxnet import gluon
from mxnet.gluon import nn

from byteps_prophet.errors import UserError

MODELS = ("resnet18", "resnet50", "vgg", "vgg16", "transformer", "mlp")
SCALABLE = ("vgg", "transformer", "mlp")  # the models ``width`` applies to
DEFAULT_INPUT = {"resnet18": 64, "resnet50": 64, "vgg": 32, "vgg16": 224, "transformer": 16, "mlp": 256}


def _scaled(size: int, width: float) -> int:
    return max(4, int(size * width))


class VGGStyle(gluon.HybridBlock):
    def __init__(self, classes: int = 10, width: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            for stage, (channels, convs) in enumerate(((64, 1), (128, 1), (256, 2), (512, 2), (512, 2))):
                for _ in range(convs):
                    self.features.add(nn.Conv2D(_scaled(channels, width), 3, padding=1, activation="relu"))
                if stage < 3:  # three poolings: 32x32 inputs reach the head at 4x4
                    self.features.add(nn.MaxPool2D(2, 2))
            hidden = _scaled(4096, width)
            self.head = nn.HybridSequential(prefix="")
            self.head.add(nn.Flatten(), nn.Dense(hidden, activation="relu"), nn.Dense(hidden, activation="relu"),
                          nn.Dense(classes))

    def hybrid_forward(self, F, x):
        return self.head(self.features(x))


class Block(gluon.HybridBlock):
    def __init__(self, d: int, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.norm = nn.LayerNorm()
            self.up = nn.Dense(4 * d, flatten=False)
            self.down = nn.Dense(d, flatten=False)

    def hybrid_forward(self, F, x):
        h = self.up(self.norm(x))
        h = 0.5 * h * (1 + F.tanh(0.7978845608 * (h + 0.044715 * h ** 3)))  # GELU
        return x + self.down(h)


class TransformerMLP(gluon.HybridBlock):
    def __init__(self, classes: int = 10, d: int = 512, blocks: int = 6, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embed = nn.Dense(d, flatten=False)
            self.blocks = nn.HybridSequential(prefix="")
            for _ in range(blocks):
                self.blocks.add(Block(d))
            self.norm = nn.LayerNorm()
            self.out = nn.Dense(classes)

    def hybrid_forward(self, F, x):
        return self.out(F.mean(self.norm(self.blocks(self.embed(x))), axis=1))


def build(name: str, classes: int = 10, width: float = 1.0) -> gluon.HybridBlock:
    if width != 1.0 and name not in SCALABLE:
        raise UserError(f"--width {width:g} with --model {name}: the model-zoo models have fixed widths; "
                        f"valid: --width 1.0, or --model {', '.join(SCALABLE)}")
    vision = gluon.model_zoo.vision
    if name == "resnet18":
        return vision.resnet18_v1(classes=classes)
    if name == "resnet50":
        return vision.resnet50_v1(classes=classes)
    if name == "vgg":
        return VGGStyle(classes, width)
    if name == "vgg16":
        return vision.vgg16(classes=classes)
    if name == "transformer":
        return TransformerMLP(classes, d=_scaled(512, width))
    if name == "mlp":
        hidden = _scaled(512, width)
        net = nn.HybridSequential()
        net.add(nn.Dense(hidden, activation="relu"), nn.Dense(hidden, activation="relu"), nn.Dense(classes))
        return net
    raise UserError(f"--model {name!r} is not a model; valid: {', '.join(MODELS)}")


def input_shape(name: str, batch: int, size: int | None = None) -> tuple[int, ...]:
    size = size or DEFAULT_INPUT[name]
    if name == "transformer":
        return (batch, size, 256)  # size tokens of 256 features
    if name == "mlp":
        return (batch, size)
    return (batch, 3, size, size)
