"""Recorded profile: file format, strict validation, recorder, conversion to simulator inputs."""
import copy
import json

import pytest

from byteps_prophet.errors import UserError
from byteps_prophet.profile import (
    FORMAT, VERSION, IterationRecord, Profile, ProfileRecorder, ProfileTensor, load_profile,
)
from byteps_prophet.sim.costmodel import LayerTimes, compute_times
from byteps_prophet.sim.recorded import FWD_FROM_BWD, iteration_times, model_and_times
from byteps_prophet.sim.zoo import get_model

TENSORS = (("conv.weight", (8, 3, 3, 3)), ("bn.weight", (8,)), ("fc.weight", (10, 8)), ("fc.bias", (10,)))


def good_dict():
    return {
        "format": FORMAT,
        "version": VERSION,
        "model": "tiny",
        "framework": "pytorch",
        "batch": 16,
        "device": "v100",
        "world_size": 2,
        "tensors": [
            {"index": i, "name": n, "shape": list(s), "dtype": "float32", "itemsize": 4}
            for i, (n, s) in enumerate(TENSORS)
        ],
        "iterations": [
            {"ready_s": [0.010, 0.006, 0.003, 0.001], "fwd_s": [0.002, 0.001, 0.001, 0.0005],
             "iteration_s": 0.020, "bandwidth_Bps": 1.0e9},
            {"ready_s": [0.012, 0.007, 0.004, 0.001], "iteration_s": 0.025},
            {"ready_s": [0.011, 0.006, 0.003, 0.002]},
        ],
        "meta": {"probe": "torch hooks"},
    }


def write(tmp_path, data, name="p.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


# -- round trip --------------------------------------------------------------------------------
def test_round_trip(tmp_path):
    original = Profile.from_dict(good_dict())
    path = tmp_path / "out.json"
    original.save(path)
    loaded = load_profile(path)
    assert loaded == original
    assert loaded.tensors[0] == ProfileTensor("conv.weight", (8, 3, 3, 3), "float32")
    assert loaded.iterations[1] == IterationRecord((0.012, 0.007, 0.004, 0.001), None, 0.025, None)
    assert loaded.meta == {"probe": "torch hooks"}
    data = json.loads(path.read_text())
    assert data["format"] == FORMAT and data["version"] == 1
    assert data["tensors"][2] == {"index": 2, "name": "fc.weight", "shape": [10, 8], "dtype": "float32",
                                  "itemsize": 4}
    assert json.loads(original.to_json()) == data


def test_optional_fields_and_nulls(tmp_path):
    data = good_dict()
    del data["meta"]
    data["tensors"][1]["dtype"] = "float16"
    del data["tensors"][1]["itemsize"]
    data["iterations"][0]["ready_s"][1] = None  # not observed this iteration
    data["iterations"][2]["fwd_s"] = None
    data["iterations"][2]["iteration_s"] = None
    p = load_profile(write(tmp_path, data))
    assert p.tensors[1].itemsize == 2 and p.tensors[1].nbytes == 16
    assert p.meta == {}
    assert p.iterations[0].ready_s[1] is None
    assert p.iteration_s == pytest.approx(0.0225)  # median of the two recorded
    assert p.bandwidth_Bps == pytest.approx(1.0e9)


# -- validation: every error path is one line naming the file and the field -------------------
def mutate(path_spec, value):
    def apply(d):
        target = d
        for key in path_spec[:-1]:
            target = target[key]
        if value is DELETE:
            del target[path_spec[-1]]
        else:
            target[path_spec[-1]] = value
        return d
    return apply


DELETE = object()

BAD = [
    # (mutation, field the message must name, a word the message must contain)
    (mutate(["format"], "other-format"), "format", FORMAT),
    (mutate(["version"], 2), "version", "reads: 1"),
    (mutate(["version"], "1"), "version", "unsupported"),
    (mutate(["version"], True), "version", "unsupported"),
    (mutate(["model"], ""), "model", "non-empty"),
    (mutate(["model"], 5), "model", "string"),
    (mutate(["framework"], "jax"), "framework", "pytorch"),
    (mutate(["device"], None), "device", "null"),
    (mutate(["batch"], 0), "batch", ">= 1"),
    (mutate(["batch"], 3.5), "batch", "integer"),
    (mutate(["batch"], True), "batch", "integer"),
    (mutate(["world_size"], -1), "world_size", ">= 1"),
    (mutate(["meta"], [1]), "meta", "object"),
    (mutate(["extra"], 1), "extra", "unknown field"),
    (mutate(["tensors"], []), "tensors", "non-empty"),
    (mutate(["tensors"], {}), "tensors", "non-empty"),
    (mutate(["tensors", 0], "conv"), "tensors[0]", "object"),
    (mutate(["tensors", 1, "index"], 3), "tensors[1].index", "position 1"),
    (mutate(["tensors", 1, "name"], "conv.weight"), "tensors[1].name", "duplicate"),
    (mutate(["tensors", 1, "shape"], "8"), "tensors[1].shape", "list"),
    (mutate(["tensors", 1, "shape"], [8.0]), "tensors[1].shape[0]", "integer"),
    (mutate(["tensors", 1, "shape"], [-8]), "tensors[1].shape[0]", ">= 0"),
    (mutate(["tensors", 1, "dtype"], "int8"), "tensors[1].dtype", "float32"),
    (mutate(["tensors", 1, "itemsize"], 2), "tensors[1].itemsize", "must be 4"),
    (mutate(["tensors", 1, "stride"], 1), "tensors[1].stride", "unknown field"),
    (mutate(["iterations"], []), "iterations", "non-empty"),
    (mutate(["iterations", 0, "ready_s"], [0.1, 0.2]), "iterations[0].ready_s", "one entry per tensor (4)"),
    (mutate(["iterations", 0, "ready_s"], 0.1), "iterations[0].ready_s", "list"),
    (mutate(["iterations", 0, "ready_s"], [None] * 4), "iterations[0].ready_s", "no gradient"),
    (mutate(["iterations", 1, "ready_s", 2], -0.001), "iterations[1].ready_s[2]", ">= 0"),
    (mutate(["iterations", 1, "ready_s", 2], "0.1"), "iterations[1].ready_s[2]", "number"),
    (mutate(["iterations", 1, "ready_s", 2], 0.5), "iterations[1].ready_s[2]", "later than the whole iteration"),
    (mutate(["iterations", 0, "fwd_s", 3], -1), "iterations[0].fwd_s[3]", ">= 0"),
    (mutate(["iterations", 0, "fwd_s"], [0.01] * 3), "iterations[0].fwd_s", "one entry per tensor"),
    (mutate(["iterations", 0, "fwd_s"], [0.01] * 4), "iterations[0].fwd_s", "more than the iteration"),
    (mutate(["iterations", 0, "iteration_s"], 0), "iterations[0].iteration_s", "> 0"),
    (mutate(["iterations", 0, "bandwidth_Bps"], -5.0), "iterations[0].bandwidth_Bps", "> 0"),
    (mutate(["iterations", 0, "bandwidth_Bps"], "fast"), "iterations[0].bandwidth_Bps", "number"),
    (mutate(["iterations", 0, "latency"], 1), "iterations[0].latency", "unknown field"),
]


@pytest.mark.parametrize("change,field,word", BAD, ids=[f"{b[1]}:{b[2]}" for b in BAD])
def test_validation_errors(tmp_path, change, field, word):
    path = write(tmp_path, change(good_dict()))
    with pytest.raises(UserError) as err:
        load_profile(path)
    msg = str(err.value)
    assert "\n" not in msg
    assert str(path) in msg
    assert f"'{field}'" in msg
    assert word in msg


@pytest.mark.parametrize("field", ["format", "version", "model", "framework", "batch", "device",
                                   "world_size", "tensors", "iterations"])
def test_missing_top_level_field(tmp_path, field):
    data = good_dict()
    del data[field]
    with pytest.raises(UserError, match=rf"missing field '{field}'"):
        load_profile(write(tmp_path, data))


@pytest.mark.parametrize("where,field", [
    (["tensors", 2, "shape"], "tensors[2].shape"),
    (["tensors", 0, "name"], "tensors[0].name"),
    (["iterations", 1, "ready_s"], "iterations[1].ready_s"),
])
def test_missing_nested_field(tmp_path, where, field):
    data = mutate(where, DELETE)(good_dict())
    with pytest.raises(UserError) as err:
        load_profile(write(tmp_path, data))
    assert f"missing field '{field}'" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("text,word", [
    ("{not json", "not valid JSON"),
    ('{"ready": NaN}', "NaN"),
    ("[]", "must be an object"),
])
def test_not_a_profile(tmp_path, text, word):
    path = write(tmp_path, text)
    with pytest.raises(UserError) as err:
        load_profile(path)
    assert word in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="cannot read profile"):
        load_profile(tmp_path / "nope.json")


def test_non_monotone_ready_order_is_accepted(tmp_path):
    data = good_dict()
    data["iterations"][0]["ready_s"] = [0.010, 0.003, 0.006, 0.001]  # index 1 before index 2
    assert load_profile(write(tmp_path, data)).iterations[0].ready_s[1] == 0.003


def test_invalid_profile_is_never_written(tmp_path):
    p = Profile.from_dict(good_dict())
    bad = Profile(p.model, p.framework, 0, p.device, p.world_size, p.tensors, p.iterations)
    with pytest.raises(UserError, match="'batch'"):
        bad.save(tmp_path / "bad.json")
    assert not (tmp_path / "bad.json").exists()


# -- conversion to simulator inputs ------------------------------------------------------------
def test_model_and_times_reproduces_gaps():
    data = good_dict()
    # Medians per tensor: 0.011, 0.006, 0.003, 0.001 -> gaps in backward order 0.005, 0.003, 0.002, 0.001.
    model, times = model_and_times(Profile.from_dict(data))
    assert [t.name for t in model.tensors] == [n for n, _ in TENSORS]
    assert [t.shape for t in model.tensors] == [s for _, s in TENSORS]
    assert model.default_batch == 16 and model.name == "tiny"
    assert model.params == 8 * 27 + 8 + 80 + 10
    assert times.bwd_s == pytest.approx((0.005, 0.003, 0.002, 0.001))
    assert times.ready_times() == pytest.approx((0.011, 0.006, 0.003, 0.001))
    # Forward: recorded in one iteration only -> that value.
    assert times.fwd_s == pytest.approx((0.002, 0.001, 0.001, 0.0005))


def test_median_resists_an_outlier_iteration():
    data = good_dict()
    data["iterations"].append({"ready_s": [5.0, 4.0, 3.0, 2.0]})  # a stalled iteration
    data["iterations"].append({"ready_s": [0.011, 0.006, 0.003, 0.001]})
    _, times = model_and_times(Profile.from_dict(data))
    assert times.ready_times() == pytest.approx((0.011, 0.006, 0.003, 0.001))


def test_forward_derived_from_backward_only_when_none_was_recorded():
    data = good_dict()
    for it in data["iterations"]:
        it.pop("fwd_s", None)
    _, times = model_and_times(Profile.from_dict(data))  # MXNet's: no forward times at all
    assert FWD_FROM_BWD == 0.5
    assert times.fwd_s == pytest.approx(tuple(0.5 * b for b in times.bwd_s))
    # The torch probe records a layer's forward on its first tensor: the others have none of their
    # own (half their backward gap, which spans the layer's whole backward, counted it twice).
    data["iterations"][1]["fwd_s"] = [None, 0.004, None, None]
    _, times = model_and_times(Profile.from_dict(data))
    assert times.fwd_s == pytest.approx((0.0, 0.004, 0.0, 0.0))


def test_a_forward_timed_whole_is_spread_as_the_backward_times():
    """MXNet's profile: one forward pass timed alone, spread over the tensors as their backward times
    are; the simulator then replays that total, not half the backward."""
    data = good_dict()
    for it in data["iterations"]:
        it.pop("fwd_s", None)
    profile = Profile.from_dict(data)
    _, without = model_and_times(profile)
    _, times = model_and_times(profile.with_forward_total(0.02))
    assert sum(times.fwd_s) == pytest.approx(0.02)
    assert times.fwd_s == pytest.approx(tuple(0.02 * b / sum(without.bwd_s) for b in without.bwd_s))
    assert times.bwd_s == without.bwd_s


def test_non_monotone_and_unused_tensors():
    data = good_dict()
    data["tensors"].append({"index": 4, "name": "unused.weight", "shape": [3], "dtype": "float32"})
    data["iterations"] = [
        {"ready_s": [0.010, 0.002, 0.006, 0.001, None], "fwd_s": [0.001, 0.001, 0.001, 0.001, 0.0007]},
    ]
    model, times = model_and_times(Profile.from_dict(data))
    assert [t.name for t in model.tensors] == [n for n, _ in TENSORS]  # never-ready tensor left out
    # bn.weight (0.002) is ready before fc.weight (0.006): gap 0, replayed with fc.weight.
    assert times.bwd_s == pytest.approx((0.004, 0.0, 0.005, 0.001))
    assert times.ready_times() == pytest.approx((0.010, 0.006, 0.006, 0.001))
    assert all(b >= 0 for b in times.bwd_s)
    assert times.fwd_s == pytest.approx((0.001, 0.001, 0.001, 0.0017))  # unused fwd folded into fc.bias


def test_iteration_times_replay_each_recorded_iteration():
    """Each recorded iteration's own backward gaps and forward times, in the recorded order; what one
    did not record is the medians'."""
    profile = Profile.from_dict(good_dict())
    first, second, third = iteration_times(profile)
    assert first.ready_times() == pytest.approx((0.010, 0.006, 0.003, 0.001))
    assert second.ready_times() == pytest.approx((0.012, 0.007, 0.004, 0.001))
    assert third.ready_times() == pytest.approx((0.011, 0.006, 0.003, 0.002))
    assert first.fwd_s == pytest.approx((0.002, 0.001, 0.001, 0.0005))
    _, median = model_and_times(profile)
    assert second.fwd_s == third.fwd_s == median.fwd_s  # no forward recorded: the medians'


def test_iteration_times_fill_a_tensor_an_iteration_missed_with_its_median():
    data = good_dict()
    data["tensors"].append({"index": 4, "name": "unused.weight", "shape": [3], "dtype": "float32"})
    for it in data["iterations"]:
        it["ready_s"] = it["ready_s"] + [None]
        if "fwd_s" in it:
            it["fwd_s"] = it["fwd_s"] + [0.0007]
    data["iterations"][2]["ready_s"][1] = None  # bn.weight not seen in the third iteration
    profile = Profile.from_dict(data)
    model, median = model_and_times(profile)
    times = iteration_times(profile)
    assert all(len(t.bwd_s) == len(model.tensors) == 4 for t in times)  # the unused tensor left out
    assert times[2].ready_times() == pytest.approx((0.011, median.ready_times()[1], 0.003, 0.002))
    assert times[0].fwd_s[-1] == pytest.approx(0.0005 + 0.0007)  # unused forward folded as in the medians


def test_zoo_times_survive_a_profile_round_trip(tmp_path):
    """A profile synthesised from the cost model converts back to the same backward times."""
    zoo = get_model("resnet50")
    lt = compute_times(zoo, 32)
    rec = ProfileRecorder([(t.name, t.shape) for t in zoo.tensors], model="resnet50", framework="sim",
                          batch=32, device="v100")
    for k in range(3):
        t0 = 100.0 * k
        rec.begin_iteration(t0)
        for name, f in zip((t.name for t in zoo.tensors), lt.fwd_s):
            rec.forward_time(name, f)
        rec.backward_start(t0 + lt.fwd_total)
        for name, r in zip((t.name for t in zoo.tensors), lt.ready_times()):
            rec.gradient_ready(name, t0 + lt.fwd_total + r)
        rec.end_iteration(t0 + lt.total)
    path = tmp_path / "resnet.json"
    rec.profile().save(path)
    model, times = model_and_times(load_profile(path))
    assert model.params == zoo.params and len(model.tensors) == 161
    assert times.bwd_s == pytest.approx(lt.bwd_s, rel=1e-6, abs=1e-9)
    assert times.fwd_s == pytest.approx(lt.fwd_s, rel=1e-6, abs=1e-9)
    assert load_profile(path).iteration_s == pytest.approx(lt.total)


# -- recorder ----------------------------------------------------------------------------------
def run_iteration(rec, t0, ready, *, bwd_start=None, end=None, bandwidth=None):
    rec.begin_iteration(t0)
    if bwd_start is not None:
        rec.backward_start(bwd_start)
    for name, t in ready:
        rec.gradient_ready(name, t)
    return rec.end_iteration(end if end is not None else max(t for _, t in ready) + 0.001,
                             bandwidth_Bps=bandwidth)


def make_recorder(**kw):
    kw.setdefault("model", "tiny")
    kw.setdefault("framework", "pytorch")
    kw.setdefault("batch", 16)
    return ProfileRecorder(TENSORS, **kw)


def test_recorder_several_iterations():
    rec = make_recorder(device="a100", world_size=4, warmup=1, max_iterations=3, meta={"run": 7})
    # Warm-up iteration: dropped.
    assert run_iteration(rec, 0.0, [("fc.bias", 0.5), ("conv.weight", 0.9)]) is False
    for k in range(4):
        t0 = 10.0 + k
        recorded = run_iteration(rec, t0, [("fc.bias", t0 + 0.101), ("fc.weight", t0 + 0.103),
                                           ("bn.weight", t0 + 0.106), ("conv.weight", t0 + 0.110 + 0.001 * k)],
                                 bwd_start=t0 + 0.1, end=t0 + 0.2, bandwidth=1e9 + k)
        assert recorded
    assert rec.iterations_recorded == 3  # newest three kept
    p = rec.profile()
    assert (p.model, p.framework, p.batch, p.device, p.world_size) == ("tiny", "pytorch", 16, "a100", 4)
    assert p.meta == {"run": 7}
    assert [it.ready_s[0] for it in p.iterations] == pytest.approx([0.011, 0.012, 0.013])
    assert p.iterations[0].ready_s[1:] == pytest.approx((0.006, 0.003, 0.001))
    assert p.iteration_s == pytest.approx(0.2)
    assert p.bandwidth_Bps == pytest.approx(1e9 + 2)
    assert all(it.fwd_s is None for it in p.iterations)
    _, times = model_and_times(p)
    assert times.bwd_s == pytest.approx((0.006, 0.003, 0.002, 0.001))


def test_recorder_defaults_backward_start_to_begin_and_keeps_last_duplicate():
    rec = make_recorder()
    rec.begin_iteration(1.0)
    rec.gradient_ready("fc.bias", 1.2)
    rec.gradient_ready("fc.bias", 1.3)  # gradient accumulation: the later one counts
    rec.forward_time("conv.weight", 0.05)
    assert rec.end_iteration(1.5)
    it = rec.profile().iterations[0]
    assert it.ready_s[3] == pytest.approx(0.3)
    assert it.ready_s[:3] == (None, None, None)
    assert it.fwd_s[0] == pytest.approx(0.05) and it.fwd_s[1] is None
    assert it.iteration_s == pytest.approx(0.5)


def test_recorder_abandons_unfinished_and_skips_empty_iterations():
    rec = make_recorder()
    rec.begin_iteration(0.0)
    rec.gradient_ready("fc.bias", 0.1)
    rec.begin_iteration(1.0)  # the previous step never ended
    assert rec.abandoned == 1
    assert rec.end_iteration(1.5) is False  # no gradient seen
    assert rec.iterations_recorded == 0
    with pytest.raises(UserError, match="no iteration recorded"):
        rec.profile()


@pytest.mark.parametrize("action,word", [
    (lambda r: r.gradient_ready("fc.bias", 1.0), "begin_iteration first"),
    (lambda r: r.end_iteration(1.0), "begin_iteration first"),
    (lambda r: r.backward_start(1.0), "begin_iteration first"),
    (lambda r: (r.begin_iteration(0.0), r.gradient_ready("nope", 0.1)), "unknown tensor 'nope'"),
    (lambda r: (r.begin_iteration(0.0), r.forward_time("nope", 0.1)), "unknown tensor 'nope'"),
    (lambda r: (r.begin_iteration(1.0), r.backward_start(0.5)), "before the iteration began"),
    (lambda r: (r.begin_iteration(1.0), r.gradient_ready("fc.bias", 0.5)), "before backward started"),
    (lambda r: (r.begin_iteration(0.0), r.gradient_ready("fc.bias", 0.5), r.end_iteration(0.4)),
     "before the last gradient"),
    (lambda r: (r.begin_iteration(0.0), r.forward_time("fc.bias", -1.0)), ">= 0"),
    (lambda r: r.begin_iteration(float("nan")), "finite"),
    (lambda r: r.begin_iteration("now"), "finite"),
    (lambda r: (r.begin_iteration(0.0), r.gradient_ready("fc.bias", 0.1), r.end_iteration(1, bandwidth_Bps=0)),
     "bandwidth_Bps"),
])
def test_recorder_errors(action, word):
    with pytest.raises(UserError) as err:
        action(make_recorder())
    assert word in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("kw,word", [
    (dict(framework="jax"), "pytorch"),
    (dict(batch=0), "batch"),
    (dict(world_size=0), "world_size"),
    (dict(model=""), "model"),
    (dict(warmup=-1), "warmup"),
    (dict(max_iterations=0), "max_iterations"),
])
def test_recorder_constructor_errors(kw, word):
    with pytest.raises(UserError) as err:
        make_recorder(**kw)
    assert word in str(err.value) and "\n" not in str(err.value)


def test_recorder_tensor_errors():
    with pytest.raises(UserError, match="duplicate"):
        ProfileRecorder([("a", (1,)), ("a", (2,))], model="m", framework="pytorch", batch=1)
    with pytest.raises(UserError, match="no tensors"):
        ProfileRecorder([], model="m", framework="pytorch", batch=1)
    with pytest.raises(UserError, match="dtype"):
        ProfileRecorder([("a", (1,), "int8")], model="m", framework="pytorch", batch=1)
    rec = ProfileRecorder([ProfileTensor("a", (2, 2), "bfloat16")], model="m", framework="mxnet", batch=1)
    assert rec.tensors[0].nbytes == 8


def test_layer_times_type_is_the_simulators():
    _, times = model_and_times(Profile.from_dict(copy.deepcopy(good_dict())))
    assert isinstance(times, LayerTimes)


def test_the_plugins_record_profiles_without_the_simulator():
    """The plugin side (profile recording) does not import the simulator (sim/ depends on the core
    and the profile, never the other way round)."""
    import subprocess
    import sys

    code = ("import sys, byteps_prophet.profile, byteps_prophet.core; "
            "print(sorted(m for m in sys.modules if m.startswith('byteps_prophet.sim')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_profile_module_imports_nothing_of_the_simulator():
    """Plugins record profiles: the recorder's module stays below the simulator (sim/recorded.py
    converts a profile for it)."""
    import subprocess
    import sys

    code = ("import sys, byteps_prophet.profile; "
            "print(sorted(m for m in sys.modules if m.startswith('byteps_prophet.sim')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
