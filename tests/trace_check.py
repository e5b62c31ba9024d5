"""Shared by the multi-process tests: exactly-once from a rank's trace (BYTEPS_PROPHET_TRACE), by
sums of what was sent, not by the averaged values (an all-reduce or a push_pull with average=True sent
twice gives the same average, so parameters alone cannot show a duplicate)."""
from __future__ import annotations

import collections

from byteps_prophet.core.trace import events


def assert_every_row_sent_once(trace: dict, iterations: int, what: str) -> int:
    """Every iteration, every tensor whose gradient was ready in it (a ``ready`` event): the rows of
    its ops tile [0, rows) exactly (no row twice, none missing) and their bytes add up to the
    tensor's; a tensor without a gradient (unused) sends nothing. Returns the number of ops (so a
    caller can check that tensors were cut)."""
    tensors = {index: (shape[0] if shape else 1, nbytes)
               for index, _name, shape, nbytes in trace["metadata"]["tensors"]}
    ops = [e["args"] for e in events(trace, "op")]
    pieces = collections.defaultdict(list)
    for op in ops:
        pieces[op["iteration"], op["index"]].append((*op["rows"], op["bytes"]))
    ready = {(e["args"]["iteration"], e["args"]["index"]) for e in events(trace, "ready")}
    assert sorted({it for it, _ in pieces}) == list(range(iterations)), f"{what}: iterations {sorted(pieces)[:5]}"
    assert set(pieces) == ready, f"{what}: sent without a gradient, or a gradient never sent: {set(pieces) ^ ready}"
    for iteration in range(iterations):
        for index, (rows, nbytes) in tensors.items():
            if (iteration, index) not in ready:
                continue
            got = sorted(pieces[iteration, index])
            assert sum(end - start for start, end, _ in got) == rows, \
                f"{what}: iteration {iteration} tensor {index}: rows sent {got}, tensor has {rows}"
            assert sum(b for _, _, b in got) == nbytes, f"{what}: iteration {iteration} tensor {index}: bytes {got}"
            edges = [0] + [end for _, end, _ in got]
            assert [start for start, _, _ in got] == edges[:-1], f"{what}: iteration {iteration} tensor {index}: {got}"
    return len(ops)



def assert_plan_engaged(trace: dict, iterations: int, what: str, pieces: str = "op") -> list[int]:
    """Prophet's prediction, not the credit it falls back on, scheduled some iterations: the trace's
    ``planned_iterations`` (the scheduler's count) is positive, there is one ``plan`` event per planned
    iteration, and each planned iteration's pieces are in the trace (``pieces`` is their kind: the torch
    plugin's ``op``, the MXNet stores' ``send``; ``assert_every_row_sent_once`` checks their rows).
    Returns the planned iterations."""
    planned = trace["metadata"]["planned_iterations"]
    plans = sorted(e["args"]["iteration"] for e in events(trace, "plan"))
    why = trace["metadata"].get("credit_iterations")
    assert planned and planned > 0, \
        f"{what}: Prophet's plan never engaged ({planned!r} of {iterations} iterations; under the credit: {why})"
    assert len(plans) == planned and len(set(plans)) == len(plans), f"{what}: plan events {plans}, count {planned}"
    assert all(0 < it < iterations for it in plans), f"{what}: planned iterations {plans} of {iterations}"
    sent = collections.Counter(e["args"]["iteration"] for e in events(trace, pieces))
    assert all(sent[it] > 0 for it in plans), f"{what}: planned iterations without ops: {plans}, {sent}"
    return plans
