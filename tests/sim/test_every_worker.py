"""Every worker of a parameter server simulated on its own (``SimulatedCluster.skew``): in step it is the
representative worker's model; out of step the workers share the servers' links as they come."""
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from byteps_prophet.core import Settings
from byteps_prophet.core.traits import load_engine
from byteps_prophet.errors import UserError
from byteps_prophet.sim.simulation import Layer, SimulatedCluster, simulate
from byteps_prophet.sim.network import _water_fill

CALIBRATED_BYTEPS = str(Path(__file__).resolve().parents[2] / "scripts" / "benchmarks" / "data" / "replay" / "engine_byteps.json")
LAYERS = [Layer(f"w{i}", (250_000,), 2e-3, 4e-3) for i in range(8)]  # 1 MB each: 8 ms at 1 Gbit/s


def run(scheduler, engine, skew, workers=2, iterations=16, **settings):
    cluster = SimulatedCluster(workers=workers, bandwidth=1e9 / 8, engine=load_engine(engine).replace(servers=1), skew=skew)
    return simulate(LAYERS, cluster, Settings(scheduler=scheduler, **settings), iterations, 6)


@pytest.mark.parametrize("engine", ["ideal-ps", "byteps", CALIBRATED_BYTEPS])
@pytest.mark.parametrize("scheduler", ["fifo", "bytescheduler"])
def test_workers_in_step_are_the_representative_worker(engine, scheduler):
    """Skew 0: both workers send the same bytes at the same time, which is what the representative
    worker assumes; the shared links give the same step (FIFO and the credit; exactly without a
    duplex efficiency, within 0.1% with the calibrated one, which the representative charges on
    whole messages and the shared links while both directions carry a flow)."""
    representative = run(scheduler, engine, None).iter_s
    every = run(scheduler, engine, 0.0)
    assert every.iter_s == pytest.approx(representative, rel=1e-3)
    assert every.others[0].iter_s == pytest.approx(every.iter_s, rel=1e-6)


@pytest.mark.parametrize("scheduler, settings", [("fifo", {}), ("bytescheduler", {}),
                                                 ("bytescheduler", {"credit": 300_000, "partition": 100_000}),
                                                 ("prophet", {}), ("prophet", {"prophet_mode": "paper"})])
@pytest.mark.parametrize("skew", [0.0, 0.013, -0.021])
def test_every_worker_sends_every_row_once_per_iteration(scheduler, settings, skew):
    result = run(scheduler, CALIBRATED_BYTEPS, skew, iterations=8, **settings)
    for worker in (result, *result.others):
        ranges = defaultdict(list)
        for piece in worker.sent:
            ranges[(piece.iteration, piece.index)].append((piece.row_start, piece.row_end))
        assert set(ranges) == {(it, i) for it in range(8) for i in range(len(LAYERS))}
        for (it, i), cuts in ranges.items():
            cuts.sort()
            assert cuts[0][0] == 0 and cuts[-1][1] == LAYERS[i].shape[0], (it, i, cuts)
            assert all(a[1] == b[0] for a, b in zip(cuts, cuts[1:])), f"gap or overlap in {cuts}"


def test_workers_out_of_step_overlap_the_early_pulls_with_the_late_pushes():
    """BytePS as calibrated (pulls behind the pushes, back-pressure): in step the servers take both
    workers' pushes, then send both workers' pulls; 20 ms apart, the early worker's pulls go out while
    the late worker still pushes, and the step is shorter (the BytePS-MXNet runs whose workers ran
    0.3-0.5 s apart were 2.1-2.6 s a step against 2.9-3.3 s in step). The workers stay apart."""
    in_step = run("fifo", CALIBRATED_BYTEPS, 0.0)
    apart = run("fifo", CALIBRATED_BYTEPS, 0.02)
    assert apart.iter_s < 0.8 * in_step.iter_s
    one_direction = 2 * 8 * 1e6 / (1e9 / 8)  # both workers' 8 MB through one server direction
    assert apart.iter_s >= one_direction
    late = apart.others[0]
    assert late.iteration_starts[-1] - apart.iteration_starts[-1] >= 0.02


def test_followers_issue_the_leaders_cuts_and_wait_for_it():
    """Worker 0 schedules; the others issue its slices in its order (the plugins' Synchroniser), so
    a credit below one partition, which lets two independent schedulers wait on each other's
    different slices forever, completes, every worker cutting the leader's cuts; and a follower
    that starts ahead waits for the leader: the step is the in-step one."""
    tight = {"credit": 100_000, "partition": 150_000}
    result = run("bytescheduler", CALIBRATED_BYTEPS, 0.03, **tight)
    cuts = [sorted((p.iteration, p.index, p.row_start, p.row_end) for p in worker.sent)
            for worker in (result, *result.others)]
    assert cuts[0] == cuts[1]
    in_step = run("bytescheduler", CALIBRATED_BYTEPS, 0.0).iter_s
    assert run("bytescheduler", CALIBRATED_BYTEPS, -0.03).iter_s == pytest.approx(in_step, rel=1e-6)


def test_every_worker_on_its_own_is_a_parameter_servers_and_bounded():
    with pytest.raises(UserError, match="only on a parameter server; valid: architecture 'ps', or no skew"):
        SimulatedCluster(workers=2, arch="allreduce", skew=0.1)
    with pytest.raises(UserError, match="takes at most 64; valid: fewer workers, or no skew"):
        SimulatedCluster(workers=65, skew=0.1)
    proc = subprocess.run([sys.executable, "-m", "byteps_prophet", "simulate", "--model", "alexnet", "--workers", "2",
                           "--skew", "0.1", "--scheduler", "ddp"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--skew" in lines[0] and "ddp" in lines[0]
    with pytest.raises(UserError, match="hold_skew holds the workers at a skew; valid: a skew with it"):
        SimulatedCluster(workers=2, hold_skew=True)
    with pytest.raises(UserError, match="hold_skew with workers=4: .*valid: 2 workers, or no hold_skew"):
        SimulatedCluster(workers=4, skew=0.01, hold_skew=True)
    proc = subprocess.run([sys.executable, "-m", "byteps_prophet", "simulate", "--model", "alexnet", "--workers", "2",
                           "--hold-skew"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--hold-skew holds the workers at their --skew" in lines[0]
    proc = subprocess.run([sys.executable, "-m", "byteps_prophet", "simulate", "--model", "alexnet", "--workers", "4",
                           "--skew", "0.1", "--hold-skew"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "valid: --workers 2, or no --hold-skew" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_the_servers_ingress_is_shared_by_the_connections_weights_each_at_most_its_own_link():
    assert _water_fill(1.0, {0: 2.0, 1: 1.0}, 3) == pytest.approx([2 / 3, 1 / 3, 0.0])
    assert _water_fill(1.0, {0: 1.0, 1: 1.0}, 2) == pytest.approx([0.5, 0.5])
    # two servers' worth for two connections: each its own link's rate, whatever the weights
    assert _water_fill(2.0, {0: 3.0, 1: 1.0}, 2) == pytest.approx([1.0, 1.0])
    # the favoured one capped at its link, the rest shared by the others' weights
    assert _water_fill(2.0, {0: 6.0, 1: 1.0, 2: 3.0}, 3) == pytest.approx([1.0, 0.25, 0.75])


def held_skews(scheduler, skew, hold):
    cluster = SimulatedCluster(workers=2, bandwidth=1e9 / 8, engine=load_engine(CALIBRATED_BYTEPS).replace(servers=1),
                          skew=skew, hold_skew=hold)
    result = simulate(LAYERS, cluster, Settings(scheduler=scheduler), 24, 6)
    return [late - early for early, late in zip(result.iteration_starts, result.others[0].iteration_starts)]


@pytest.mark.parametrize("scheduler", ["fifo", "bytescheduler"])
@pytest.mark.parametrize("skew", [0.02, 0.005])
def test_a_held_skew_stays_where_equal_shares_drift_apart(scheduler, skew):
    """Started 5 or 20 ms apart, equal shares drift the pair to 44 ms apart; held (the late worker's
    connection weighted on the servers' ingress, as TCP favours one worker), the pair ends its last
    eight iterations within a few ms of its skew, every row still sent once (the test above)."""
    free = held_skews(scheduler, skew, hold=False)
    assert free[-2] == pytest.approx(0.0437, abs=1e-3)
    held = held_skews(scheduler, skew, hold=True)[-8:]
    assert abs(sum(held) / len(held) - skew) < 4e-3, held
    assert max(abs(s - skew) for s in held) < 0.012, held

