"""Prophet's paper rule (docs/ALGORITHMS.md section 3), driven by hand with a fake clock."""
import pytest

from byteps_prophet.core.ready_pattern import ReadyProfiler, find_blocks

BANDWIDTH = 1e6  # bytes/s
# (index, elements, ready offset s): three steps separated by 10 ms gaps; block C holds gradient 0.
STEPWISE = [(5, 1000, 0.0), (4, 1000, 0.001), (3, 2000, 0.010), (2, 1000, 0.011), (1, 500, 0.020), (0, 500, 0.021)]


def test_boundaries_from_a_stepwise_trace():
    blocks = find_blocks({i: t for i, _, t in STEPWISE}, boundary_factor=2.0)
    assert [b.indices for b in blocks] == [(5, 4), (3, 2), (1, 0)]
    assert [b.gap_after for b in blocks] == [pytest.approx(0.009), pytest.approx(0.009), None]


def test_uniform_arrivals_make_one_block():
    blocks = find_blocks({i: 0.001 * (9 - i) for i in range(10)}, boundary_factor=2.0)
    assert len(blocks) == 1 and blocks[0].gap_after is None


def test_profile_is_the_median_over_iterations_and_refreshes_on_drift():
    profiler = ReadyProfiler(iterations=3, drift_tolerance=0.25)
    for it, slow in enumerate([1.0, 1.0, 5.0]):  # one outlier iteration
        for i, _, t in STEPWISE:
            profiler.record(it, i, 100.0 * it + t * slow)
        profiler.close()
    assert profiler.profile.offsets[0] == pytest.approx(0.021)
    for it in range(3, 6):  # the pattern doubles in length for three iterations: re-profile
        for i, _, t in STEPWISE:
            profiler.record(it, i, 100.0 * it + 2 * t)
        profiler.close()
    assert profiler.profiles_built == 2 and profiler.profile.offsets[0] == pytest.approx(0.042)


def _profiled(harness, **settings):
    """A paper-mode Prophet after one profiling iteration at a known bandwidth."""
    h = harness(scheduler="prophet", prophet_mode="paper", profile_iterations=1, credit=1, **settings)
    run_iteration(h, 0)
    assert h.scheduler.bandwidth.bytes_per_s == pytest.approx(BANDWIDTH)
    return h


def run_iteration(h, iteration, skip=()):
    start = h.clock.now()
    for index, numel, offset in STEPWISE:
        if index in skip:
            continue
        h.clock.set(start + offset)
        h.post(f"g{index}", index, (numel,), iteration)
    h.scheduler.end_of_backward(iteration)
    drain(h)


def drain(h):
    while h.transport.in_flight:  # one at a time, each at exactly BANDWIDTH
        h.finish(after=h.transport.in_flight[0].nbytes / BANDWIDTH)


def test_release_grants_gap_times_bandwidth_and_stops_at_the_first_piece_that_does_not_fit(harness):
    h = _profiled(harness)
    h.transport.sent.clear()
    start = h.clock.now() + 1.0
    for index, numel, offset in STEPWISE[:2]:
        h.clock.set(start + offset)
        h.post(f"g{index}", index, (numel,), 1)
    # Block A complete: budget 9 ms x 1 MB/s = 9000 B; both 4000 B pieces fit, most urgent first.
    assert [p.name for p in h.transport.sent] == ["g4", "g5"]
    for index, numel, offset in STEPWISE[2:4]:
        h.clock.set(start + offset)
        h.post(f"g{index}", index, (numel,), 1)
    # Block B: g2 (4000 B) fits, g3 (8000 B) does not fit the remaining 5000 B: the release ends.
    assert [p.name for p in h.transport.sent] == ["g4", "g5", "g2"]


def test_last_block_goes_under_credit_most_urgent_first(harness):
    h = _profiled(harness)
    h.transport.sent.clear()
    run_iteration(h, 1)
    names = [p.name for p in h.transport.sent]
    assert names[:3] == ["g4", "g5", "g2"] and names[3:] == ["g0", "g1", "g3"]
    assert len(h.done) == 12  # every gradient of both iterations synchronised once


def test_missing_gradient_does_not_stall_the_iteration(harness):
    h = _profiled(harness)
    run_iteration(h, 1, skip={4, 0})  # block A and the last block each miss a gradient
    run_iteration(h, 2)
    assert len(h.done) == 6 + 4 + 6


def test_without_bandwidth_prophet_behaves_like_bytescheduler(harness):
    h = harness(scheduler="prophet", prophet_mode="paper", profile_iterations=1, partition=1000, credit=1500)
    h.post("g", 0, (4000,))
    assert len(h.transport.sent) == 2  # credit rule: 1500 -> 500 -> -500


def test_renumbered_profile_schedules_as_if_numbered_so_from_the_start(harness):
    """A transport that learns the forward order after training began (the MXNet store) renumbers:
    what Prophet profiled under the old numbers then schedules the next iteration as if the
    gradients had always carried the new ones."""
    reverse = {i: 5 - i for i, _, _ in STEPWISE}

    def iteration_one(renumbered: bool) -> list:
        h = harness(scheduler="prophet", prophet_mode="paper", profile_iterations=1, credit=1)
        start = h.clock.now()
        for index, numel, offset in STEPWISE:  # profiled under the caller's numbers
            h.clock.set(start + offset)
            h.post(f"g{index}", reverse[index], (numel,), 0)
        h.scheduler.end_of_backward(0)
        drain(h)
        if renumbered:
            h.scheduler.renumber({old: new for new, old in reverse.items()})
        h.transport.sent.clear()
        run_iteration(h, 1)
        return [(p.name, p.row_start, p.row_end) for p in h.transport.sent]

    h = _profiled(harness)
    h.transport.sent.clear()
    run_iteration(h, 1)
    numbered_from_the_start = [(p.name, p.row_start, p.row_end) for p in h.transport.sent]
    assert iteration_one(renumbered=True) == numbered_from_the_start
    assert iteration_one(renumbered=False) != numbered_from_the_start


def test_renumbering_keeps_the_profile_under_the_new_indices():
    profiler = ReadyProfiler(iterations=2)
    for it in range(2):
        for i, _, t in STEPWISE:
            profiler.record(it, i, 100.0 * it + t)
        profiler.close()
    before = profiler.profile
    index_of = {i: 5 - i for i in range(6)}
    profiler.renumber(index_of)
    assert profiler.profile.offsets == {index_of[i]: t for i, t in before.offsets.items()}
    assert [b.indices for b in profiler.profile.blocks] == [tuple(index_of[i] for i in b.indices) for b in before.blocks]
