"""Model zoo (real tensor shapes and counts) and compute cost model."""
import math

import pytest

from byteps_prophet.errors import UserError
from byteps_prophet.sim.costmodel import DEVICES, LayerTimes, compute_times, get_device
from byteps_prophet.sim.zoo import MODELS, ModelSpec, TensorSpec, get_model

# (params, tensors) of the reference implementations: torchvision resnet50 / vgg16 / alexnet /
# inception_v3(aux_logits=True), Hugging Face BertModel(bert-base-uncased) with pooler.
EXPECTED = {
    "resnet50": (25_557_032, 161),
    "vgg16": (138_357_544, 32),
    "alexnet": (61_100_840, 16),
    "inception_v3": (27_161_264, 292),
    "bert_base": (109_482_240, 199),
}


def test_models_listed():
    assert MODELS == ("resnet50", "vgg16", "alexnet", "inception_v3", "bert_base")


@pytest.mark.parametrize("name", MODELS)
def test_param_and_tensor_counts(name):
    model = get_model(name)
    params, count = EXPECTED[name]
    assert model.name == name
    assert model.params == params
    assert len(model.tensors) == count
    assert model.nbytes == 4 * params
    assert len({t.name for t in model.tensors}) == count  # names unique
    assert model.default_batch > 0


@pytest.mark.parametrize("name", MODELS)
def test_costs_positive_and_backward_rule(name):
    for t in get_model(name).tensors:
        assert t.numel == math.prod(t.shape) > 0
        assert t.nbytes == 4 * t.numel
        assert t.fwd_flops >= 0 and t.fwd_bytes >= 0
        assert t.bwd_flops == pytest.approx(2 * t.fwd_flops)
        assert t.bwd_bytes == pytest.approx(2 * t.fwd_bytes)
        assert t.fwd_flops > 0 or t.fwd_bytes > 0  # every tensor parameterises some work


def test_resnet50_shapes_and_order():
    m = get_model("resnet50")
    head = [(t.name, t.shape) for t in m.tensors[:6]]
    assert head == [
        ("conv1.weight", (64, 3, 7, 7)), ("bn1.weight", (64,)), ("bn1.bias", (64,)),
        ("layer1.0.conv1.weight", (64, 64, 1, 1)), ("layer1.0.bn1.weight", (64,)), ("layer1.0.bn1.bias", (64,)),
    ]
    by_name = {t.name: t.shape for t in m.tensors}
    assert by_name["layer1.0.downsample.0.weight"] == (256, 64, 1, 1)
    assert by_name["layer4.2.conv3.weight"] == (2048, 512, 1, 1)
    assert by_name["layer2.0.conv2.weight"] == (128, 128, 3, 3)
    assert [(t.name, t.shape) for t in m.tensors[-2:]] == [("fc.weight", (1000, 2048)), ("fc.bias", (1000,))]
    # torchvision registers (and runs) the shortcut after bn3.
    names = [t.name for t in m.tensors]
    assert names.index("layer3.0.downsample.0.weight") == names.index("layer3.0.bn3.bias") + 1


def test_conv_flops_formula():
    m = get_model("resnet50")
    conv1 = m.tensors[0]
    assert conv1.fwd_flops == 2 * 7 * 7 * 3 * 64 * 112 * 112
    fc = m.tensors[-2]
    assert fc.fwd_flops == 2 * 2048 * 1000
    # Whole-model forward FLOPs match the well-known MAC counts (x2).
    assert get_model("resnet50").fwd_flops == pytest.approx(2 * 4.1e9, rel=0.03)
    assert get_model("vgg16").fwd_flops == pytest.approx(2 * 15.5e9, rel=0.03)
    assert get_model("alexnet").fwd_flops == pytest.approx(2 * 0.71e9, rel=0.05)
    assert get_model("inception_v3").fwd_flops == pytest.approx(2 * 5.7e9, rel=0.05)
    # BERT-base, 128 tokens: ~2 x 85M (encoder + pooler linear params) x 128 plus attention.
    assert get_model("bert_base").fwd_flops == pytest.approx(2.24e10, rel=0.05)


def test_vgg_alexnet_names():
    vgg = [t.name for t in get_model("vgg16").tensors]
    assert vgg[:4] == ["features.0.weight", "features.0.bias", "features.2.weight", "features.2.bias"]
    assert vgg[-6:] == ["classifier.0.weight", "classifier.0.bias", "classifier.3.weight",
                        "classifier.3.bias", "classifier.6.weight", "classifier.6.bias"]
    assert {t.name: t.shape for t in get_model("vgg16").tensors}["classifier.0.weight"] == (4096, 25088)
    alex = {t.name: t.shape for t in get_model("alexnet").tensors}
    assert alex["features.0.weight"] == (64, 3, 11, 11)
    assert alex["features.10.weight"] == (256, 256, 3, 3)
    assert alex["classifier.1.weight"] == (4096, 9216)


def test_inception_names():
    m = get_model("inception_v3")
    shapes = {t.name: t.shape for t in m.tensors}
    assert m.tensors[0].name == "Conv2d_1a_3x3.conv.weight"
    assert shapes["Mixed_6b.branch7x7_2.conv.weight"] == (128, 128, 1, 7)
    assert shapes["Mixed_7c.branch3x3dbl_3b.conv.weight"] == (384, 384, 3, 1)
    assert shapes["AuxLogits.fc.weight"] == (1000, 768)
    names = [t.name for t in m.tensors]
    assert names.index("AuxLogits.conv0.conv.weight") > names.index("Mixed_6e.branch_pool.bn.bias")
    assert names.index("AuxLogits.fc.bias") < names.index("Mixed_7a.branch3x3_1.conv.weight")
    assert names[-2:] == ["fc.weight", "fc.bias"]


def test_bert_names():
    m = get_model("bert_base")
    shapes = {t.name: t.shape for t in m.tensors}
    assert m.tensors[0].name == "embeddings.word_embeddings.weight"
    assert shapes["embeddings.word_embeddings.weight"] == (30522, 768)
    assert shapes["embeddings.position_embeddings.weight"] == (512, 768)
    assert shapes["encoder.layer.11.intermediate.dense.weight"] == (3072, 768)
    assert shapes["encoder.layer.0.output.dense.weight"] == (768, 3072)
    assert [t.name for t in m.tensors[-2:]] == ["pooler.dense.weight", "pooler.dense.bias"]
    # The attention core is charged to the value projection: it costs more than the query one.
    q = next(t for t in m.tensors if t.name == "encoder.layer.0.attention.self.query.weight")
    v = next(t for t in m.tensors if t.name == "encoder.layer.0.attention.self.value.weight")
    assert q.fwd_flops == 2 * 768 * 768 * 128
    assert v.fwd_flops > q.fwd_flops


@pytest.mark.parametrize("alias,canonical", [
    ("ResNet-50", "resnet50"), ("resnet_50", "resnet50"), ("RESNET50", "resnet50"),
    ("VGG-16", "vgg16"), ("AlexNet", "alexnet"), ("inception-v3", "inception_v3"),
    ("Inception_V3", "inception_v3"), ("bert-base", "bert_base"), ("bert-base-uncased", "bert_base"),
    ("BERT", "bert_base"),
])
def test_lookup_aliases(alias, canonical):
    assert get_model(alias) is get_model(canonical)


@pytest.mark.parametrize("bad", ["resnet18", "", "vgg", None, 50])
def test_lookup_error_names_choices(bad):
    with pytest.raises(UserError) as err:
        get_model(bad)
    msg = str(err.value)
    assert "\n" not in msg and repr(bad) in msg
    for name in MODELS:
        assert name in msg


def test_specs_frozen():
    m = get_model("alexnet")
    with pytest.raises(Exception):
        m.name = "x"
    with pytest.raises(Exception):
        m.tensors[0].shape = (1,)
    t = TensorSpec("w", (3, 4), 1.0, 2.0)
    assert (t.numel, t.nbytes, t.itemsize) == (12, 48, 4)
    assert ModelSpec("m", (t,), 8).params == 12


# -- cost model ------------------------------------------------------------------------------
def test_sanity_ranges_v100():
    resnet = compute_times(get_model("resnet50"), 32)
    vgg = compute_times(get_model("vgg16"), 32, "v100")
    assert 0.07 <= resnet.total <= 0.14  # ~100 ms
    assert 0.19 <= vgg.total <= 0.26  # 200-250 ms
    # Backward is about twice forward.
    assert resnet.bwd_total == pytest.approx(2 * resnet.fwd_total, rel=0.1)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("device", list(DEVICES))
def test_monotone_in_batch(name, device):
    model = get_model(name)
    prev = None
    for batch in (1, 2, 8, 32, 128):
        lt = compute_times(model, batch, device)
        assert len(lt.fwd_s) == len(lt.bwd_s) == len(model.tensors)
        assert all(t > 0 for t in lt.fwd_s + lt.bwd_s)
        if prev is not None:
            assert all(a >= b for a, b in zip(lt.fwd_s, prev.fwd_s))
            assert all(a >= b for a, b in zip(lt.bwd_s, prev.bwd_s))
            assert lt.total > prev.total
        prev = lt


def test_launch_overhead_floor_and_linear_growth():
    model = get_model("resnet50")
    launch = DEVICES["v100"].launch_s
    lt1 = compute_times(model, 1)
    assert min(lt1.fwd_s) >= launch
    t64, t128 = compute_times(model, 64).total, compute_times(model, 128).total
    fixed = 2 * launch * len(model.tensors)
    assert (t128 - fixed) == pytest.approx(2 * (t64 - fixed), rel=1e-9)


def test_faster_devices_are_faster():
    model = get_model("resnet50")
    totals = {d: compute_times(model, 32, d).total for d in ("cpu", "v100", "a100", "h100")}
    assert totals["cpu"] > totals["v100"] > totals["a100"] > totals["h100"]
    assert compute_times(model, 32, "v100", precision="fp16").total < totals["v100"]


def test_ready_times_from_layer_times():
    lt = LayerTimes((1.0, 1.0, 1.0), (0.5, 0.2, 0.3))
    assert lt.ready_times() == pytest.approx((1.0, 0.5, 0.3))
    assert lt.total == pytest.approx(4.0)
    assert lt.scaled(2).bwd_s == pytest.approx((1.0, 0.4, 0.6))


@pytest.mark.parametrize("kwargs,needle", [
    (dict(batch=0), "batch"), (dict(batch=2.5), "batch"), (dict(batch=True), "batch"),
    (dict(batch=8, device="tpu"), "v100"), (dict(batch=8, precision="int8"), "fp16"),
])
def test_cost_model_errors(kwargs, needle):
    with pytest.raises(UserError) as err:
        compute_times(get_model("alexnet"), **kwargs)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_device_lookup():
    assert get_device("V100") is DEVICES["v100"]
    for spec in DEVICES.values():
        assert spec.peak_fp16 >= spec.peak_fp32 > 0 and spec.mem_bw > 0
    with pytest.raises(UserError, match="a100"):
        get_device("k80")
    with pytest.raises(UserError, match="fwd_s"):
        LayerTimes((1.0,), ())
