"""DDP and Horovod in the simulator: every byte once, never below the bound, and the CLI's report."""
import json
import math

import pytest

from byteps_prophet.cli import main
from byteps_prophet.sim.baselines import MIB
from byteps_prophet.sim.baseline_runs import (BUCKET_SWEEP, CYCLE_SWEEP, FUSION_SWEEP, best_bucket, best_horovod,
                                              simulate_baseline)
from byteps_prophet.sim.simulation import Layer, SimulatedCluster, lower_bound_s


def toy_layers(n=12, rows=512, cols=256):
    return [Layer(f"w{i}", (rows, cols), 1e-4, 2e-4) for i in range(n)]


@pytest.mark.parametrize("arch", ["allreduce", "ps"])
@pytest.mark.parametrize("name, knobs", [("ddp", {}), ("ddp", {"bucket_bytes": 600_000}), ("horovod", {}),
                                         ("horovod", {"fusion_bytes": 0})])
def test_every_gradient_synchronised_once_and_never_below_the_bound(arch, name, knobs):
    layers = toy_layers()
    cluster = SimulatedCluster(workers=4, arch=arch, bandwidth=1e9 / 8)
    result = simulate_baseline(name, layers, cluster, iterations=8, warmup=2, **knobs)
    members = [(t.iteration, t.index) for c in result.sent for t in c.members]
    assert sorted(members) == [(it, i) for it in range(8) for i in range(len(layers))]  # once each
    per_layer = math.prod(layers[0].shape) * 4
    assert sum(c.nbytes for c in result.sent) == 8 * len(layers) * per_layer
    assert result.finish_s / 8 >= lower_bound_s(layers, cluster) * (1 - 1e-9)


def test_a_bucket_fuses_gradients_and_fusion_pays_fewer_messages():
    layers = toy_layers(n=24, rows=64, cols=64)  # 16 KiB gradients: the per-collective cost dominates
    cluster = SimulatedCluster(workers=8, arch="allreduce", bandwidth=10e9 / 8)
    alone = simulate_baseline("ddp", layers, cluster, iterations=6, warmup=2, bucket_bytes=1)
    fused = simulate_baseline("ddp", layers, cluster, iterations=6, warmup=2, bucket_bytes=MIB)
    assert len(alone.sent) == 6 * 24
    assert len(fused.sent) < 6 * 3
    assert fused.iter_s < alone.iter_s


def test_best_bucket_is_the_fastest_of_its_sweep():
    layers = toy_layers()
    cluster = SimulatedCluster(workers=4, arch="allreduce", bandwidth=1e9 / 8)
    (bucket,), times, _ = best_bucket(layers, cluster, iterations=6, warmup=2)
    assert {(b,) for b in BUCKET_SWEEP} <= set(times) and times[(bucket,)] == min(times.values())


def test_simulate_reports_the_baselines_beside_the_schedulers(capsys):
    assert main(["simulate", "--model", "alexnet", "--workers", "4", "--arch", "allreduce", "--bandwidth", "3gbit",
                 "--iterations", "8", "--scheduler", "prophet,ddp,horovod", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["results"]) == {"prophet", "prophet_paper", "ddp", "ddp_best", "horovod", "horovod_best"}
    best = out["results"]["ddp_best"]
    assert str(best["bucket_bytes"]) in out["bucket_sweep_ms"]
    assert best["iter_ms"] == min(out["bucket_sweep_ms"].values())
    assert {str(b) for b in BUCKET_SWEEP} <= set(out["bucket_sweep_ms"])
    fused = out["results"]["horovod_best"]
    assert f"{fused['cycle_s'] * 1e3:g}ms/{fused['fusion_bytes']}" in out["horovod_sweep_ms"]
    assert fused["iter_ms"] == min(out["horovod_sweep_ms"].values()) <= out["results"]["horovod"]["iter_ms"]
    assert all(r["iter_ms"] >= out["lower_bound_ms"] * 0.999 for r in out["results"].values())


def test_all_means_the_schedulers_and_on_all_reduce_the_baselines_and_a_bad_name_lists_them(capsys):
    from byteps_prophet.errors import UserError
    from byteps_prophet.sim.runner import parse_schedulers

    assert parse_schedulers("all") == ["fifo", "bytescheduler", "prophet"]
    assert parse_schedulers("all", "ps") == ["fifo", "bytescheduler", "prophet"]
    assert parse_schedulers("all,ddp") == ["fifo", "bytescheduler", "prophet", "ddp"]
    assert parse_schedulers("all", "allreduce") == ["fifo", "bytescheduler", "prophet", "ddp", "horovod"]
    assert parse_schedulers("prophet,all", "allreduce") == ["prophet", "fifo", "bytescheduler", "ddp", "horovod"]
    with pytest.raises(UserError, match="ddp.*horovod"):
        parse_schedulers("nccl")


def test_best_horovod_is_the_fastest_of_its_sweep():
    layers = toy_layers()
    cluster = SimulatedCluster(workers=4, arch="allreduce", bandwidth=1e9 / 8)
    pair, times, _ = best_horovod(layers, cluster, iterations=6, warmup=2)
    assert {(c, f) for c in CYCLE_SWEEP for f in FUSION_SWEEP} <= set(times) and times[pair] == min(times.values())


def test_best_bytescheduler_sweeps_credit_and_partition_together():
    from byteps_prophet.sim.runner import CREDIT_SWEEP, PARTITION_SWEEP, best_bytescheduler, compare

    layers = toy_layers()
    cluster = SimulatedCluster(workers=4, arch="allreduce", bandwidth=1e9 / 8)
    pair, times, _ = best_bytescheduler(layers, cluster, iterations=6, warmup=2)
    assert {(c, p) for c in CREDIT_SWEEP for p in PARTITION_SWEEP} <= set(times)
    assert times[pair] == min(times.values())
    credit_only = compare(layers, cluster, ["bytescheduler"], iterations=6, warmup=2)
    assert times[pair] <= credit_only.results["bytescheduler_best"].iter_s  # the credit sweep is among them


def test_simulate_all_on_all_reduce_reports_the_baselines(capsys):
    assert main(["simulate", "--model", "alexnet", "--workers", "4", "--arch", "allreduce", "--iterations", "6",
                 "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out)["results"]) == {
        "fifo", "bytescheduler", "bytescheduler_best", "prophet", "prophet_paper", "ddp", "ddp_best", "horovod",
        "horovod_best"}
