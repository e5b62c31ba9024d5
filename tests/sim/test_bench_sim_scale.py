"""scripts/benchmarks/bench_sim.py's scale grid: every baseline at the best of its own sweep, on the
same engine as Prophet."""
import pytest

from byteps_prophet.core.traits import EngineTraits
from byteps_prophet.sim.simulation import Layer, SimulatedCluster
from tests.conftest import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench_sim")


def toy_layers(n=8, rows=256, cols=256):
    return [Layer(f"w{i}", (rows, cols), 1e-4, 2e-4) for i in range(n)]


@pytest.mark.parametrize("arch", ["ps", "allreduce"])
def test_a_cell_puts_prophet_against_each_baseline_at_its_best(bench, arch):
    engine = EngineTraits(name="toy", stages=2 if arch == "ps" else 1, message_cost_s=2e-4)
    cluster = SimulatedCluster(workers=4, arch=arch, bandwidth=1e9 / 8, engine=engine)
    cell = bench.scale_cell(toy_layers(), cluster, iterations=5, warmup=1)
    ms = cell["iter_ms"]
    assert ms["bytescheduler_swept"] <= ms["bytescheduler_best"] <= ms["bytescheduler"]
    assert set(ms) >= {"prophet", *bench.BEST[arch]}
    assert (arch == "allreduce") == ("ddp_best" in ms) == ("horovod_best" in ms)
    if arch == "allreduce":
        assert ms["ddp_best"] <= ms["ddp"] and ms["horovod_best"] <= ms["horovod"]
    for name in bench.BEST[arch]:
        assert cell[f"prophet_vs_{name}"] == pytest.approx(ms["prophet"] / ms[name])


def test_the_compact_form_leaves_the_all_reduce_baselines_out_of_a_parameter_server(bench):
    row = {"model": "toy", "arch": "ps", "case": "homogeneous", "workers": 8, "gbit": 10, "best_credit": 1,
           "best_credit_partition": [1, 1], "iter_ms": {"bytescheduler": 2.0, "bytescheduler_best": 2.0,
                                                        "bytescheduler_swept": 1.5, "prophet": 1.0},
           "prophet_vs_bytescheduler_swept": 1 / 1.5}
    compact = bench.compact_scale({"setup": {}, "summary": bench.summarize_scale([row]), "cells": [row]})
    cells = dict(zip(compact["columns"], compact["cells"][0]))
    assert cells["ddp_best_ms"] is None and cells["horovod_best_ms"] is None and cells["prophet_ms"] == 1.0
    assert compact["summary"]["ps/homogeneous"]["8"]["prophet_vs_bytescheduler_swept"]["max"] == round(1 / 1.5, 4)


def test_the_grid_is_the_same_in_one_process_or_two_and_each_cell_lists_its_open_edges(bench):
    engines = {"ps": EngineTraits(name="ps", stages=2), "allreduce": EngineTraits(name="ring", stages=1)}
    small = dict(models=("alexnet",), cases=("homogeneous",), workers=(2,), gbits=(10,))
    alone = bench.scale_grid(engines, 3, **small)
    assert bench.scale_grid(engines, 3, **small, jobs=2)["cells"] == alone["cells"]
    assert [(r["arch"], r["workers"]) for r in alone["cells"]] == [("ps", 2), ("allreduce", 2)]
    for row in alone["cells"]:
        assert set(row["open_edges"]) <= {"bytescheduler credit", "bytescheduler partition", "ddp bucket",
                                          "horovod cycle", "horovod fusion"}
