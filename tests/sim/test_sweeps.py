"""sim/sweeps.py: a baseline's sweep widened while its best sits at an edge, never past a natural limit."""
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from byteps_prophet.sim.sweeps import WIDENINGS, Axis, widened_sweep


def counted(f):
    calls = []

    def time_of(*point):
        calls.append(point)
        return f(*point)
    return time_of, calls


def test_a_best_on_the_top_edge_widens_the_grid_until_it_is_inside():
    time_of, calls = counted(lambda x: abs(math.log2(x) - math.log2(40)))
    best, times, open_edges = widened_sweep(time_of, [Axis("x", (1, 2, 4, 8))])
    assert best == (32,) and set(times) == {(v,) for v in (1, 2, 4, 8, 16, 32, 64)}
    assert open_edges == () and len(calls) == len(set(calls))


def test_a_best_on_the_bottom_edge_widens_downward():
    best, times, open_edges = widened_sweep(lambda x: abs(x - 0.3), [Axis("cycle", (1.0, 2.0, 4.0))])
    assert best == (0.25,) and (0.125,) in times and open_edges == ()


def test_a_best_still_on_an_edge_after_the_widenings_is_an_open_edge():
    best, times, open_edges = widened_sweep(lambda x: -x, [Axis("bucket", (1, 2))])
    assert best == (2 * 2**WIDENINGS,) and len(times) == 2 + WIDENINGS
    assert open_edges == ("bucket",)


def test_a_natural_limit_stops_the_widening_and_is_no_open_edge():
    best, times, open_edges = widened_sweep(lambda x: -x, [Axis("bucket", (1, 2, 4), highest=10)])
    assert best == (10,) and set(times) == {(1,), (2,), (4,), (8,), (10,)} and open_edges == ()
    best, _, open_edges = widened_sweep(lambda f: f, [Axis("fusion", (0, 1, 4))])
    assert best == (0,) and open_edges == ()  # 0 (no fusion) is the bottom of the knob


def test_two_knobs_widen_only_the_one_on_its_edge():
    # the best partition is past the grid's top, the best credit inside it
    time_of = lambda credit, partition: abs(credit - 4) + abs(math.log2(partition) - 5)  # noqa: E731
    best, times, open_edges = widened_sweep(time_of, [Axis("credit", (2, 4, 8)), Axis("partition", (1, 2, 4, 8))])
    assert best == (4, 32) and {c for c, _ in times} == {2, 4, 8} and {p for _, p in times} == {1, 2, 4, 8, 16, 32, 64}
    assert open_edges == ()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 1, allow_nan=False), min_size=64, max_size=64),
       st.lists(st.sampled_from([1, 2, 4, 8, 16, 32]), min_size=1, max_size=4, unique=True))
def test_the_best_is_the_fastest_point_tried_and_each_point_is_tried_once(noise, start):
    time_of, calls = counted(lambda x: noise[int(math.log2(x)) % 64])
    best, times, open_edges = widened_sweep(time_of, [Axis("x", tuple(sorted(start)), lowest=1)])
    assert times[best] == min(times.values()) and len(calls) == len(set(calls)) == len(times)
    assert {(v,) for v in start} <= set(times) and len(times) <= len(start) + 2 * WIDENINGS
    values = sorted(v for (v,) in times)
    edge = best[0] in (values[0], values[-1]) and best[0] != 1  # 1 is the natural bottom here
    assert bool(open_edges) == edge
