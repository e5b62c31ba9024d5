"""The simulator's model zoo: real parameter tensors, in forward order, with per-sample compute cost.

Every model lists each parameter tensor exactly as the reference PyTorch implementation names and
shapes it (torchvision ``resnet50``, ``vgg16``, ``alexnet``, ``inception_v3`` with aux logits, and
Hugging Face ``BertModel`` for ``bert-base-uncased`` including the pooler), in the order
``model.parameters()`` yields them, which is the forward order. The shapes are built by walking the
architecture (so parameter counts come out exact), not typed in.

Cost attribution (per sample, at the standard input: 224x224 images, 299x299 for Inception-v3,
sequence length 128 for BERT):

* conv: ``2 * kh * kw * Cin/groups * Cout * Hout * Wout`` FLOPs on the conv's weight; its bias (if
  any) gets the per-element add, ``Cout * Hout * Wout``.
* linear: ``2 * in * out`` FLOPs (times the tokens for BERT) on the weight; ``out`` (times tokens)
  on the bias.
* BatchNorm / LayerNorm: the normalisation (4 FLOPs per output element: mean, variance, subtract,
  scale) on the weight, the shift (1 per element) on the bias.
* Layers without parameters are charged to the parameter tensor computed just before them in the
  forward pass: ReLU/GELU and residual adds to the preceding bias (or BN shift), pooling likewise,
  and BERT's attention core (``QK^T``, softmax, ``.V``) to ``attention.self.value.weight``, so that
  in backward its cost also falls between the output projection's gradient and the value
  projection's gradient, as it does in autograd.
* Embedding lookups are gathers: no FLOPs, only memory traffic.

Besides FLOPs each tensor carries the activation memory traffic (bytes read and written per sample,
float32) of the same computation, so that the cost model can treat memory-bound layers (BN, ReLU,
softmax) as a roofline would; conv and linear layers count reading their input and writing their
output.

Backward rule: ``bwd = 2 x fwd`` for every tensor, FLOPs and bytes alike. A conv or linear layer's
backward computes two products each as costly as the forward (gradient w.r.t. the input and w.r.t.
the weight); an elementwise layer's backward reads the output gradient and the saved input and
writes the input gradient. The first layer's input gradient, which frameworks skip, is still
counted (a small effect); per-batch costs (writing a weight gradient once per batch) are
not modelled.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

from byteps_prophet.core.task import TensorSize
from byteps_prophet.errors import UserError

BWD_FACTOR = 2.0  # backward cost = 2 x forward cost (see module docstring)
_F32 = 4  # bytes per activation element in the traffic estimate


@dataclass(frozen=True)
class TensorSpec(TensorSize):
    """One parameter tensor: its name, shape and per-sample compute cost of what it parameterises."""

    name: str
    shape: tuple[int, ...]
    fwd_flops: float  # per sample
    bwd_flops: float  # per sample
    fwd_bytes: float = 0.0  # per sample activation memory traffic of the forward computation
    bwd_bytes: float = 0.0  # per sample activation memory traffic of the backward computation
    itemsize: int = 4  # bytes per gradient element (float32 unless a recorded profile says otherwise)


class _Total:
    """A read-only attribute of a model: the sum of one field over its tensors."""

    def __init__(self, field: str) -> None:
        self.field = field

    def __get__(self, model, owner=None):
        return self if model is None else sum(getattr(t, self.field) for t in model.tensors)


@dataclass(frozen=True)
class ModelSpec:
    """A model: its parameter tensors in forward order (index 0 = first layer)."""

    name: str
    tensors: tuple[TensorSpec, ...]
    default_batch: int

    # Totals over the tensors: parameters, bytes, and FLOPs per sample of the forward and the backward.
    params = _Total("numel")
    nbytes = _Total("nbytes")
    fwd_flops = _Total("fwd_flops")
    bwd_flops = _Total("bwd_flops")


class _Builder:
    """Collects tensors in forward order and tracks the activation shape (C, H, W) of a CNN."""

    def __init__(self) -> None:
        self._rows: list[list] = []  # [name, shape, fwd_flops, fwd_bytes]
        self.c = self.h = self.w = 0

    def add(self, name: str, shape: tuple[int, ...], flops: float, nbytes: float = 0.0) -> None:
        self._rows.append([name, tuple(int(d) for d in shape), float(flops), float(nbytes)])

    def charge(self, flops: float, nbytes: float) -> None:
        """Charge a parameter-free computation to the most recent tensor."""
        self._rows[-1][2] += flops
        self._rows[-1][3] += nbytes

    @property
    def elems(self) -> int:
        return self.c * self.h * self.w

    def image(self, c: int, h: int, w: int | None = None) -> None:
        self.c, self.h, self.w = c, h, h if w is None else w

    # -- CNN layers --------------------------------------------------------------------------
    def conv(self, name: str, cout: int, k, stride: int = 1, pad=0, *, bias: bool = False,
             relu: bool = False, groups: int = 1) -> None:
        kh, kw = (k, k) if isinstance(k, int) else k
        ph, pw = (pad, pad) if isinstance(pad, int) else pad
        cin, in_elems = self.c, self.elems
        self.h = (self.h + 2 * ph - kh) // stride + 1
        self.w = (self.w + 2 * pw - kw) // stride + 1
        self.c = cout
        out = self.elems
        self.add(f"{name}.weight", (cout, cin // groups, kh, kw),
                 2 * kh * kw * (cin // groups) * out, _F32 * (in_elems + out))
        if bias:
            self.add(f"{name}.bias", (cout,), out, 0.0)
        if relu:
            self.relu()

    def bn(self, name: str, *, relu: bool = False) -> None:
        n = self.elems
        self.add(f"{name}.weight", (self.c,), 4 * n, 3 * _F32 * n)  # stats pass + normalise pass
        self.add(f"{name}.bias", (self.c,), n, 0.0)  # fused shift
        if relu:
            self.relu()

    def relu(self) -> None:
        self.charge(self.elems, 2 * _F32 * self.elems)

    def add_residual(self) -> None:
        self.charge(self.elems, 3 * _F32 * self.elems)

    def pool(self, k: int, stride: int, pad: int = 0, *, keep_channels: bool = True) -> None:
        in_elems = self.elems
        self.h = (self.h + 2 * pad - k) // stride + 1
        self.w = (self.w + 2 * pad - k) // stride + 1
        self.charge(k * k * self.elems, _F32 * (in_elems + self.elems))

    def global_pool(self) -> None:
        self.charge(self.elems, _F32 * self.elems)
        self.h = self.w = 1

    def linear(self, name: str, fin: int, fout: int, *, tokens: int = 1, relu: bool = False) -> None:
        self.add(f"{name}.weight", (fout, fin), 2 * fin * fout * tokens, _F32 * (fin + fout) * tokens)
        self.add(f"{name}.bias", (fout,), fout * tokens, 0.0)
        if relu:
            self.charge(fout * tokens, 2 * _F32 * fout * tokens)

    def build(self, name: str, default_batch: int) -> ModelSpec:
        tensors = tuple(
            TensorSpec(n, s, f, f * BWD_FACTOR, b, b * BWD_FACTOR) for n, s, f, b in self._rows
        )
        return ModelSpec(name, tensors, default_batch)


# ---------------------------------------------------------------------------------------------
def _resnet50() -> ModelSpec:
    """torchvision resnet50 (v1.5: the stride sits on each bottleneck's 3x3 conv)."""
    b = _Builder()
    b.image(3, 224)
    b.conv("conv1", 64, 7, 2, 3)
    b.bn("bn1", relu=True)
    b.pool(3, 2, 1)
    for stage, (width, blocks, stride) in enumerate(((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)), 1):
        for i in range(blocks):
            p = f"layer{stage}.{i}"
            cin, h = b.c, b.h
            s = stride if i == 0 else 1
            b.conv(f"{p}.conv1", width, 1)
            b.bn(f"{p}.bn1", relu=True)
            b.conv(f"{p}.conv2", width, 3, s, 1)
            b.bn(f"{p}.bn2", relu=True)
            b.conv(f"{p}.conv3", width * 4, 1)
            b.bn(f"{p}.bn3")
            if i == 0:  # projection shortcut, computed after the main branch
                c_out, h_out = b.c, b.h
                b.image(cin, h)
                b.conv(f"{p}.downsample.0", width * 4, 1, s)
                b.bn(f"{p}.downsample.1")
                assert (b.c, b.h) == (c_out, h_out)
            b.add_residual()
            b.relu()
    b.global_pool()
    b.linear("fc", 2048, 1000)
    return b.build("resnet50", 32)


def _vgg16() -> ModelSpec:
    """torchvision vgg16 (no batch norm): ``features.N`` numbered as nn.Sequential numbers them."""
    b = _Builder()
    b.image(3, 224)
    idx = 0
    for v in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"):
        if v == "M":
            b.pool(2, 2)
            idx += 1
        else:
            b.conv(f"features.{idx}", v, 3, 1, 1, bias=True, relu=True)
            idx += 2  # conv, ReLU
    _classifier(b, 512 * 7 * 7, (0, 3, 6))
    return b.build("vgg16", 32)


def _classifier(b: "_Builder", features: int, numbers: tuple[int, int, int]) -> None:
    """The head vgg16 and alexnet share: two 4096-wide ReLU layers, then 1000 classes
    (``classifier.N`` numbered as their nn.Sequential numbers them, dropout included)."""
    b.linear(f"classifier.{numbers[0]}", features, 4096, relu=True)
    b.linear(f"classifier.{numbers[1]}", 4096, 4096, relu=True)
    b.linear(f"classifier.{numbers[2]}", 4096, 1000)


def _alexnet() -> ModelSpec:
    """torchvision alexnet (the one-tower variant)."""
    b = _Builder()
    b.image(3, 224)
    b.conv("features.0", 64, 11, 4, 2, bias=True, relu=True)
    b.pool(3, 2)
    b.conv("features.3", 192, 5, 1, 2, bias=True, relu=True)
    b.pool(3, 2)
    b.conv("features.6", 384, 3, 1, 1, bias=True, relu=True)
    b.conv("features.8", 256, 3, 1, 1, bias=True, relu=True)
    b.conv("features.10", 256, 3, 1, 1, bias=True, relu=True)
    b.pool(3, 2)
    assert (b.c, b.h, b.w) == (256, 6, 6)
    _classifier(b, 256 * 6 * 6, (1, 4, 6))
    return b.build("alexnet", 32)


def _inception_v3() -> ModelSpec:
    """torchvision inception_v3(aux_logits=True): BasicConv2d = conv (no bias) + BN + ReLU."""
    b = _Builder()

    def basic(name: str, cout: int, k, stride: int = 1, pad=0) -> None:
        b.conv(f"{name}.conv", cout, k, stride, pad)
        b.bn(f"{name}.bn", relu=True)

    def branches(prefix: str, cin: int, hw: int, spec: list[tuple[str, list[tuple]]]) -> int:
        """Run parallel branches from the same (cin, hw) input; return the concatenated channels."""
        total = 0
        out_hw = None
        for pool, convs in spec:
            b.image(cin, hw)
            if pool == "avg":
                b.pool(3, 1, 1)
            for conv in convs:
                basic(f"{prefix}.{conv[0]}", *conv[1:])
            if pool == "max":  # a parameter-free branch: charge it to the last tensor
                b.pool(3, 2)
            total += b.c if pool != "max" else cin
            out_hw = b.h
        b.image(total, out_hw)
        return total

    b.image(3, 299)
    basic("Conv2d_1a_3x3", 32, 3, 2)
    basic("Conv2d_2a_3x3", 32, 3)
    basic("Conv2d_2b_3x3", 64, 3, 1, 1)
    b.pool(3, 2)
    basic("Conv2d_3b_1x1", 80, 1)
    basic("Conv2d_4a_3x3", 192, 3)
    b.pool(3, 2)
    assert (b.c, b.h) == (192, 35)

    def inception_a(p: str, pool_features: int) -> None:
        branches(p, b.c, b.h, [
            ("", [("branch1x1", 64, 1)]),
            ("", [("branch5x5_1", 48, 1), ("branch5x5_2", 64, 5, 1, 2)]),
            ("", [("branch3x3dbl_1", 64, 1), ("branch3x3dbl_2", 96, 3, 1, 1), ("branch3x3dbl_3", 96, 3, 1, 1)]),
            ("avg", [("branch_pool", pool_features, 1)]),
        ])

    def inception_c(p: str, c7: int) -> None:
        branches(p, b.c, b.h, [
            ("", [("branch1x1", 192, 1)]),
            ("", [("branch7x7_1", c7, 1), ("branch7x7_2", c7, (1, 7), 1, (0, 3)),
                  ("branch7x7_3", 192, (7, 1), 1, (3, 0))]),
            ("", [("branch7x7dbl_1", c7, 1), ("branch7x7dbl_2", c7, (7, 1), 1, (3, 0)),
                  ("branch7x7dbl_3", c7, (1, 7), 1, (0, 3)), ("branch7x7dbl_4", c7, (7, 1), 1, (3, 0)),
                  ("branch7x7dbl_5", 192, (1, 7), 1, (0, 3))]),
            ("avg", [("branch_pool", 192, 1)]),
        ])

    def inception_e(p: str) -> None:
        # The 3x3 branches fork after their first conv into a (1,3) and a (3,1) conv.
        cin, hw = b.c, b.h
        basic(f"{p}.branch1x1", 320, 1)
        b.image(cin, hw)
        basic(f"{p}.branch3x3_1", 384, 1)
        basic(f"{p}.branch3x3_2a", 384, (1, 3), 1, (0, 1))
        b.image(384, hw)
        basic(f"{p}.branch3x3_2b", 384, (3, 1), 1, (1, 0))
        b.image(cin, hw)
        basic(f"{p}.branch3x3dbl_1", 448, 1)
        basic(f"{p}.branch3x3dbl_2", 384, 3, 1, 1)
        basic(f"{p}.branch3x3dbl_3a", 384, (1, 3), 1, (0, 1))
        b.image(384, hw)
        basic(f"{p}.branch3x3dbl_3b", 384, (3, 1), 1, (1, 0))
        b.image(cin, hw)
        b.pool(3, 1, 1)
        basic(f"{p}.branch_pool", 192, 1)
        b.image(320 + 768 + 768 + 192, hw)

    inception_a("Mixed_5b", 32)
    inception_a("Mixed_5c", 64)
    inception_a("Mixed_5d", 64)
    assert (b.c, b.h) == (288, 35)
    branches("Mixed_6a", b.c, b.h, [
        ("", [("branch3x3", 384, 3, 2)]),
        ("", [("branch3x3dbl_1", 64, 1), ("branch3x3dbl_2", 96, 3, 1, 1), ("branch3x3dbl_3", 96, 3, 2)]),
        ("max", []),
    ])
    assert (b.c, b.h) == (768, 17)
    for p, c7 in (("Mixed_6b", 128), ("Mixed_6c", 160), ("Mixed_6d", 160), ("Mixed_6e", 192)):
        inception_c(p, c7)
    # Auxiliary classifier (training mode): avgpool 5/3, 1x1 conv, 5x5 conv, fc.
    b.image(768, 17)
    b.pool(5, 3)
    basic("AuxLogits.conv0", 128, 1)
    basic("AuxLogits.conv1", 768, 5)
    b.global_pool()
    b.linear("AuxLogits.fc", 768, 1000)
    b.image(768, 17)
    branches("Mixed_7a", 768, 17, [
        ("", [("branch3x3_1", 192, 1), ("branch3x3_2", 320, 3, 2)]),
        ("", [("branch7x7x3_1", 192, 1), ("branch7x7x3_2", 192, (1, 7), 1, (0, 3)),
              ("branch7x7x3_3", 192, (7, 1), 1, (3, 0)), ("branch7x7x3_4", 192, 3, 2)]),
        ("max", []),
    ])
    assert (b.c, b.h) == (1280, 8)
    inception_e("Mixed_7b")
    inception_e("Mixed_7c")
    assert (b.c, b.h) == (2048, 8)
    b.global_pool()
    b.linear("fc", 2048, 1000)
    return b.build("inception_v3", 32)


def _bert_base(seq: int = 128) -> ModelSpec:
    """Hugging Face BertModel (bert-base-uncased config), pooler included, at sequence length 128."""
    vocab, hidden, layers, heads, ffn, max_pos, types = 30522, 768, 12, 12, 3072, 512, 2
    b = _Builder()
    n = seq * hidden  # elements of one hidden-state tensor per sample
    b.add("embeddings.word_embeddings.weight", (vocab, hidden), 0.0, 2 * _F32 * n)
    b.add("embeddings.position_embeddings.weight", (max_pos, hidden), n, 3 * _F32 * n)
    b.add("embeddings.token_type_embeddings.weight", (types, hidden), n, 3 * _F32 * n)

    def layer_norm(name: str) -> None:
        b.add(f"{name}.weight", (hidden,), 4 * n, 3 * _F32 * n)
        b.add(f"{name}.bias", (hidden,), n, 0.0)

    layer_norm("embeddings.LayerNorm")
    scores = heads * seq * seq  # attention score elements per sample
    for i in range(layers):
        p = f"encoder.layer.{i}"
        for proj in ("query", "key", "value"):
            b.linear(f"{p}.attention.self.{proj}", hidden, hidden, tokens=seq)
        # Attention core, charged to value.weight (the last tensor before it was .bias; move it).
        core_flops = 2 * seq * seq * hidden * 2 + 5 * scores  # QK^T, softmax, probs.V
        core_bytes = _F32 * (3 * n + 4 * scores + n)
        b._rows[-2][2] += core_flops
        b._rows[-2][3] += core_bytes
        b.linear(f"{p}.attention.output.dense", hidden, hidden, tokens=seq)
        b.charge(n, 3 * _F32 * n)  # residual add
        layer_norm(f"{p}.attention.output.LayerNorm")
        b.linear(f"{p}.intermediate.dense", hidden, ffn, tokens=seq)
        b.charge(8 * seq * ffn, 2 * _F32 * seq * ffn)  # GELU (erf form)
        b.linear(f"{p}.output.dense", ffn, hidden, tokens=seq)
        b.charge(n, 3 * _F32 * n)  # residual add
        layer_norm(f"{p}.output.LayerNorm")
    b.linear("pooler.dense", hidden, hidden)  # first token only
    b.charge(hidden, 2 * _F32 * hidden)  # tanh
    return b.build("bert_base", 32)


_BUILDERS: dict[str, Callable[[], ModelSpec]] = {
    "resnet50": _resnet50,
    "vgg16": _vgg16,
    "alexnet": _alexnet,
    "inception_v3": _inception_v3,
    "bert_base": _bert_base,
}
MODELS: tuple[str, ...] = tuple(_BUILDERS)

# Spellings accepted besides the canonical names (compared after lower-casing and dropping - _ space).
_ALIASES = {
    "resnet50": "resnet50",
    "vgg16": "vgg16",
    "alexnet": "alexnet",
    "inceptionv3": "inception_v3",
    "inception": "inception_v3",
    "bertbase": "bert_base",
    "bertbaseuncased": "bert_base",
    "bert": "bert_base",
}


def _key(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch not in "-_ .")


@functools.lru_cache(maxsize=None)
def _build(canonical: str) -> ModelSpec:
    return _BUILDERS[canonical]()


def get_model(name: str) -> ModelSpec:
    """The zoo model called ``name`` (case-insensitive; "resnet-50", "ResNet50", "bert-base" work)."""
    canonical = _ALIASES.get(_key(name)) if isinstance(name, str) else None
    if canonical is None:
        raise UserError(f"unknown model {name!r}; valid: {', '.join(MODELS)}")
    return _build(canonical)
