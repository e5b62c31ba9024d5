"""The simulator's ring carries Prophet's fused message as one collective (docs/DESIGN.md, "Fused
collectives"), and every row still goes exactly once."""
import pytest

from byteps_prophet.core import Settings, Task
from byteps_prophet.core.task import Fused, State
from byteps_prophet.sim.baseline_runs import simulate_baseline
from byteps_prophet.sim.costmodel import compute_times
from byteps_prophet.sim.simulation import SimulatedCluster, Simulation, layers_from
from byteps_prophet.sim.zoo import get_model
from tests.sim.test_engine import assert_every_row_sent_once


def ready_slice(name, index, rows):
    task = Task(name, index, (rows, 1000))
    task.state = State.READY
    return task.slice(0, rows)


@pytest.mark.parametrize("workers", [2, 8, 32])
def test_a_fused_block_costs_one_collective(workers):
    cluster = SimulatedCluster(workers=workers, arch="allreduce", bandwidth=10e9 / 8)
    finishes = {}
    for fused in (True, False):
        sim = Simulation(layers_from(get_model("resnet50"), compute_times(get_model("resnet50"), 32)), cluster,
                         Settings(scheduler="prophet", fuse=True))
        network, done = sim.network, []
        network.on_finished = lambda message: done.append((sim.loop.now(), message))
        pieces = [ready_slice(f"g{i}", i, 250) for i in range(4)]  # 1 MB each
        if fused:
            network.send(Fused(pieces))
        else:
            for piece in pieces:
                network.send(piece)
        sim.loop.run()
        assert len(done) == (1 if fused else 4)
        finishes[fused] = done[-1][0]
    step_cost = 2 * (workers - 1) * cluster.overhead  # a collective's fixed cost: 2(n-1) ring steps
    wire = 2 * (workers - 1) / workers * 4 * 250 * 1000 * 4 / cluster.bandwidth
    assert finishes[True] == pytest.approx(step_cost + wire, rel=1e-9)
    assert finishes[False] - finishes[True] == pytest.approx(3 * step_cost, rel=1e-9)  # three start-ups saved


@pytest.mark.parametrize("model, workers", [("resnet50", 32), ("vgg16", 8), ("bert_base", 8)])
def test_prophet_fuses_on_the_ring_and_sends_every_row_once(model, workers):
    spec = get_model(model)
    layers = layers_from(spec, compute_times(spec, spec.default_batch))
    cluster = SimulatedCluster(workers=workers, arch="allreduce", bandwidth=10e9 / 8)
    result = Simulation(layers, cluster, Settings(scheduler="prophet", fuse=True), iterations=8, warmup=4).run()
    assert_every_row_sent_once(result, layers, 8)
    steady_messages = sum(1 for it in result.messages if it >= 5)
    steady_pieces = sum(1 for piece in result.sent if piece.iteration >= 5)
    assert steady_messages < steady_pieces / 4  # profiled iterations: several pieces per collective


def test_no_fused_message_on_a_parameter_server():
    spec = get_model("resnet50")
    layers = layers_from(spec, compute_times(spec, spec.default_batch))
    cluster = SimulatedCluster(workers=8, arch="ps", bandwidth=10e9 / 8)
    result = Simulation(layers, cluster, Settings(scheduler="prophet", fuse=True), iterations=8, warmup=4).run()
    assert len(result.messages) == len(result.sent)  # one message per slice, as before fusion


# The three cells of docs/BASELINES.md where fused Prophet was 1.1-2.8% behind the better of DDP and
# Horovod: a collective sent just before gradient 0 arrived was still on the ring, so gradient 0's
# collective waited behind it (docs/DESIGN.md, "Fused collectives", "Gradient 0's collective").
@pytest.mark.parametrize("model, workers, gbit", [("resnet50", 32, 25), ("inception_v3", 32, 100),
                                                  ("vgg16", 32, 100)])
def test_gradient_0_finds_the_ring_free_and_prophet_keeps_up_with_ddp_and_horovod(model, workers, gbit):
    spec = get_model(model)
    layers = layers_from(spec, compute_times(spec, spec.default_batch))
    cluster = SimulatedCluster(workers=workers, arch="allreduce", bandwidth=gbit * 1e9 / 8)
    iterations, warmup = 12, 4
    sim = Simulation(layers, cluster, Settings(scheduler="prophet", fuse=True), iterations, warmup)
    busy_at_gradient_0 = {}
    post = sim.scheduler.post

    def watched_post(task):
        if task.index == 0:  # how long the ring stays busy with earlier collectives after it arrives
            busy_at_gradient_0[task.iteration] = sim.network._free - sim.loop.now()
        post(task)

    sim.scheduler.post = watched_post
    result = sim.run()
    assert_every_row_sent_once(result, layers, iterations)
    steady = [busy_at_gradient_0[it] for it in range(warmup, iterations)]
    assert max(steady) <= 1e-9
    baselines = min(simulate_baseline(name, layers, cluster, iterations, warmup).iter_s for name in ("ddp", "horovod"))
    assert result.iter_s <= 1.01 * baselines
