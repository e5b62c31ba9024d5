"""scripts/benchmarks/predict.py: a prediction is written once, from a profile and an engine, with what the
prediction table needs to compare it with its measurement later."""
import json

import pytest

from tests.conftest import load_script

predict = load_script("predict")
PROFILE = "scripts/benchmarks/data/replay/torch_gloo_vgg_1g/fifo_r0.profile.json"


def argv(name="toy"):
    return [name, "--profile", PROFILE, "--engine", "gloo", "--arch", "allreduce", "--workers", "2",
            "--bandwidth", "300mbit", "--steps", "3", "--warmup", "1", "--configuration", "torch/gloo vgg, 300 Mbit/s",
            "--inputs", "the 1 Gbit/s FIFO profile", "--measure-with", "byteps-prophet ab --bandwidth 300mbit --json"]


def test_a_prediction_holds_each_scheduler_its_order_its_command_and_where_it_will_be_measured(tmp_path, monkeypatch,
                                                                                                capsys):
    monkeypatch.setattr(predict, "PREDICTIONS", tmp_path)
    assert predict.main(argv()) == 0
    doc = json.loads((tmp_path / "toy.json").read_text())
    assert set(doc["predicted"]) == {"fifo", "bytescheduler", "prophet"}
    rates = {v: p["samples_per_s"] for v, p in doc["predicted"].items()}
    assert doc["predicted_order"] == sorted(rates, key=lambda v: -rates[v])
    for v, p in doc["predicted"].items():  # samples/s is the step's samples over the simulated step
        assert p["samples_per_s"] == pytest.approx(doc["samples_per_step"] / p["step_s"], rel=1e-3)
        assert p["step_s"] * 1e3 == pytest.approx(doc["simulate"]["results"][v]["iter_ms"], abs=0.1)
    assert "--compute median" in doc["command"] and "--skew" not in doc["command"]
    assert doc["measurement_file"] == "scripts/benchmarks/data/ab/ab-toy.json"
    # the link is the engine's calibrated share of 300 Mbit/s, not the nominal rate
    assert "--bandwidth 300mbit" not in doc["command"] and "engine_gloo.json" in doc["command"]
    with pytest.raises(SystemExit, match="exists; a prediction is written once"):
        predict.main(argv())


def test_a_malformed_setting_is_one_line_naming_it(tmp_path, monkeypatch):
    monkeypatch.setattr(predict, "PREDICTIONS", tmp_path)
    with pytest.raises(SystemExit, match="predict: --env 'ATOMS' must be KEY=VALUE"):
        predict.main([*argv(), "--env", "ATOMS"])
    assert not (tmp_path / "toy.json").exists()
