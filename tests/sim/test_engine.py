"""Simulator invariants, and every row sent exactly once under every scheduler."""
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from byteps_prophet.core import Settings
from byteps_prophet.errors import UserError
from byteps_prophet.sim.costmodel import compute_times
from byteps_prophet.sim.simulation import Layer, SimulatedCluster, Simulation, layers_from, lower_bound_s
from byteps_prophet.sim.zoo import get_model

ALL_VARIANTS = [
    Settings(scheduler="fifo"),
    Settings(scheduler="bytescheduler"),
    Settings(scheduler="bytescheduler", credit=300_000, partition=200_000),
    Settings(scheduler="prophet"),
    Settings(scheduler="prophet", prophet_mode="paper"),
    Settings(scheduler="prophet", profile_iterations=1, partition=50_000),
]


def assert_every_row_sent_once(result, layers, iterations):
    rows = defaultdict(list)
    for piece in result.sent:
        rows[(piece.iteration, piece.index)].append((piece.row_start, piece.row_end))
    assert set(rows) == {(it, i) for it in range(iterations) for i in range(len(layers))}
    for (it, i), ranges in rows.items():
        ranges.sort()
        assert ranges[0][0] == 0 and ranges[-1][1] == layers[i].shape[0], (it, i, ranges)
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])), f"gap or overlap in {ranges}"


layer_strategy = st.builds(
    Layer,
    name=st.just("w"),
    shape=st.one_of(st.tuples(st.integers(1, 3000)), st.tuples(st.integers(1, 600), st.integers(1, 3000))),
    fwd_s=st.floats(0, 2e-3),
    bwd_s=st.floats(0, 4e-3),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layers=st.lists(layer_strategy, min_size=1, max_size=25),
    gbit=st.floats(0.1, 100),
    workers=st.integers(1, 32),
    arch=st.sampled_from(["ps", "allreduce"]),
    variant=st.sampled_from(ALL_VARIANTS),
)
def test_every_partition_sent_exactly_once_and_never_below_the_bound(layers, gbit, workers, arch, variant):
    layers = [Layer(f"w{i}", l.shape, l.fwd_s, l.bwd_s) for i, l in enumerate(layers)]
    cluster = SimulatedCluster(workers=workers, arch=arch, bandwidth=gbit * 1e9 / 8)
    result = Simulation(layers, cluster, variant, iterations=8, warmup=2).run()
    assert_every_row_sent_once(result, layers, 8)
    bound = lower_bound_s(layers, cluster)
    # Single iterations may borrow from the next; the whole run cannot beat the bound.
    assert result.finish_s / 8 >= bound * (1 - 1e-9)


@pytest.fixture(scope="module")
def resnet():
    model = get_model("resnet50")
    return layers_from(model, compute_times(model, 32))


def test_bytescheduler_with_infinite_credit_and_no_partitioning_equals_fifo(resnet):
    cluster = SimulatedCluster(workers=8, bandwidth=3e9 / 8)
    fifo = Simulation(resnet, cluster, Settings(scheduler="fifo"), iterations=6).run()
    unlimited = Settings(scheduler="bytescheduler", credit=10**12, partition=10**12)
    bytescheduler = Simulation(resnet, cluster, unlimited, iterations=6).run()
    assert bytescheduler.iteration_starts == fifo.iteration_starts


@pytest.mark.parametrize("scheduler", ["fifo", "bytescheduler"])
@pytest.mark.parametrize("arch", ["ps", "allreduce"])
def test_iteration_time_does_not_grow_with_bandwidth(resnet, scheduler, arch):
    times = [Simulation(resnet, SimulatedCluster(workers=8, arch=arch, bandwidth=g * 1e9 / 8),
                        Settings(scheduler=scheduler), iterations=12).run().iter_s
             for g in (1, 3, 10, 25, 100)]
    assert all(b <= a * (1 + 1e-9) for a, b in zip(times, times[1:])), times


def test_changing_conditions_slow_the_run_down():
    layers = [Layer(f"w{i}", (1000, 100), 1e-3, 2e-3) for i in range(10)]
    steady = SimulatedCluster(workers=4, bandwidth=1e9 / 8)
    changed = SimulatedCluster(workers=4, bandwidth=1e9 / 8, bandwidth_steps=((0.2, 1e8 / 8),), compute_steps=((0.2, 1.3),))
    fast = Simulation(layers, steady, Settings(), iterations=20).run()
    slow = Simulation(layers, changed, Settings(), iterations=20).run()
    assert slow.iteration_times[-1] > 1.3 * fast.iteration_times[-1]


def test_recorded_iterations_are_replayed_in_turn_and_averaged_over_whole_cycles():
    """A layer with recorded iterations computes the recorded times in turn; the mean iteration time
    counts each recorded iteration as often (here: compute-bound, so exactly their mean)."""
    recorded = ((1e-3, 10e-3), (1e-3, 30e-3))
    layers = [Layer("w", (10,), 1e-3, 20e-3, recorded=recorded)]
    assert [layers[0].times(i) for i in range(3)] == [recorded[0], recorded[1], recorded[0]]
    cluster = SimulatedCluster(workers=2, bandwidth=100e9 / 8)
    result = Simulation(layers, cluster, Settings(scheduler="fifo"), iterations=9, warmup=2).run()
    assert result.cycle == 2
    assert result.iter_s == pytest.approx(21e-3, rel=0.02)  # mean of 11 and 31 ms (plus the tiny sync)
    times = result.iteration_times[2:]
    assert times[0] == pytest.approx(11e-3, rel=0.05) and times[1] == pytest.approx(31e-3, rel=0.05)
    steady = Simulation([Layer("w", (10,), 1e-3, 20e-3)], cluster, Settings(scheduler="fifo"), iterations=9,
                        warmup=2).run()
    assert steady.cycle == 1 and steady.iter_s == pytest.approx(21e-3, rel=0.02)


def test_layerwise_overlap_lets_forward_start_before_the_last_gradient_is_synchronised():
    # Gradient 0 is tiny and synchronised first; the huge last layer's sync overlaps the next forward.
    layers = [Layer("first", (10,), 5e-3, 5e-3), Layer("huge", (4_000_000,), 1e-3, 1e-3)]
    result = Simulation(layers, SimulatedCluster(workers=2, bandwidth=1e9 / 8), Settings(scheduler="bytescheduler"),
                        iterations=4, warmup=1).run()
    sync_huge = 2 * 16e6 / (1e9 / 8)  # push + pull of the last layer alone
    assert result.iter_s < 0.012 + sync_huge


def test_a_synchronised_run_times_the_recorded_iterations_from_its_first_timed_step():
    """Timed as the benchmarks do: the first timed step starts with every parameter synchronised, the
    window ends when the last step's bytes are, and the timed steps replay the recorded iterations
    from the first whatever the warm-up. One layer, nothing to overlap: exactly each step's compute
    plus one push and one pull of its 4 KB (32 us each at 1 Gbit/s, no per-message cost)."""
    recorded = ((1e-3, 10e-3), (1e-3, 30e-3))
    layers = [Layer("w", (1000,), 1e-3, 20e-3, recorded=recorded)]
    cluster = SimulatedCluster(workers=2, bandwidth=1e9 / 8, overhead=0)
    sync = 2 * 4000 / (1e9 / 8)
    for steps, compute in ((1, 11e-3), (2, 42e-3), (3, 53e-3)):
        result = Simulation(layers, cluster, Settings(scheduler="fifo"), iterations=3 + steps, warmup=3,
                            synchronised=True).run()
        start, end = result.window
        assert end - start == pytest.approx(compute + steps * sync, rel=1e-9)
        assert result.iter_s == pytest.approx((compute + steps * sync) / steps, rel=1e-9)
    # each step as the benches' profiles count it: backward start to backward start (the next step's
    # 1 ms forward in it), the last to the end of its sync; the first forward before the first
    assert result.timed_steps_s == pytest.approx([11e-3 + sync, 31e-3 + sync, 10e-3 + sync], rel=1e-9)
    assert end - start - sum(result.timed_steps_s) == pytest.approx(1e-3, rel=1e-9)


def test_a_synchronised_window_pays_the_forward_the_steady_state_overlaps():
    """With a small credit the first layer's parameters come back before the huge layer's, so in the
    steady state its 5 ms forward overlaps the huge layer's sync; the benchmarks' window starts with
    nothing in flight and pays it once: N steps take N steady iterations plus 5 ms."""
    layers = [Layer("first", (10,), 5e-3, 5e-3), Layer("huge", (4_000_000,), 1e-3, 1e-3)]
    cluster = SimulatedCluster(workers=2, bandwidth=1e9 / 8)
    settings = Settings(scheduler="bytescheduler", credit=300_000, partition=200_000)
    steady = Simulation(layers, cluster, settings, iterations=12, warmup=4).run().iter_s
    for steps in (1, 4):
        start, end = Simulation(layers, cluster, settings, iterations=2 + steps, warmup=2,
                                synchronised=True).run().window
        assert end - start == pytest.approx(steps * steady + 5e-3, rel=1e-6)


def test_a_synchronised_run_needs_a_timed_step():
    with pytest.raises(UserError, match="warmup=3 leaves no timed step of 3 iterations; valid: 0 to 2"):
        Simulation([Layer("w", (10,), 1e-3, 1e-3)], SimulatedCluster(workers=2), Settings(), iterations=3, warmup=3,
                   synchronised=True)
