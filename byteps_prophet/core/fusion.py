"""Prophet's fused collectives on all-reduce: which pending pieces go as one message, and how large
the collectives after the end of backward are (docs/DESIGN.md, "Fused collectives", "Gradient 0's
collective"). Pure functions of the prediction, the queue and the measured link; ``Prophet`` calls
them when ``fuses``.
"""
from __future__ import annotations

import math
from heapq import heappop

from byteps_prophet.core.prediction import StepPrediction
from byteps_prophet.core.task import Fused, Task

FUSION_LATENCIES = 16  # a fused collective carries at least this many per-message costs' worth of bytes
# Before gradient 0: a collective that could not end before gradient 0 reaches the link waits for it, at
# most this many per-message costs past the predicted end of backward; and the forward pass lasts about
# this share of the backward.
END_HOLD_COSTS = 1.0
FORWARD_PER_BACKWARD = 0.5


def drain_chunk(prediction: StepPrediction, pending_bytes: int, bandwidth: float, cost: float) -> float:
    """Fused collectives after the end of backward: equal chunks of what is pending, as many as balance
    their fixed costs against the compute of the next forward pass left after the last one (``k x cost``
    against ``chunk x seconds of compute per byte``). The backward's seconds per byte (the profiled span
    over the step's bytes) stands for the forward's."""
    step_bytes = prediction.bytes_from[0]
    per_byte = prediction.span / step_bytes if step_bytes and prediction.span > 0 else 1.0 / bandwidth
    return math.sqrt(pending_bytes * cost / per_byte)


def first_drain_chunk(prediction: StepPrediction, sizes: dict[int, int], head: Task, chunk: float,
                      floor: float, cost: float) -> float:
    """The first fused collective after the end of backward carries gradient 0 (the most urgent pending,
    ``head``), whole, and the next most urgent pieces up to the drain chunk, so the next forward pass can
    start on them while the rest follows. That pays only if the forward compute of the layers it carries
    (from the profiled backward gaps) outlasts the fixed cost of the collective that follows: otherwise
    it goes with everything up to the floor, as the other collectives."""
    chunk = max(chunk, sizes.get(head.index, 0))
    if FORWARD_PER_BACKWARD * backward_within(prediction, sizes, head.index, chunk) < cost:
        chunk = max(chunk, floor)
    return chunk


def backward_within(prediction: StepPrediction, sizes: dict[int, int], first: int, nbytes: float) -> float:
    """Predicted backward compute of gradients ``first``, ``first + 1``, ... while their bytes fit in
    ``nbytes``: each one's gap after the arrival before it, at the current pace."""
    order, offsets = prediction.order, prediction.offsets
    position = {index: k for k, index in enumerate(order)}
    total = compute = 0.0
    index = first
    while index in sizes:
        total += sizes[index]
        if total > nbytes:
            break
        k = position.get(index)
        if k:
            compute += offsets[k] - offsets[k - 1]
        index += 1
    return prediction.pace * compute


def fuse_pending(queue: list, head: Task, chunk: float) -> Task | Fused:
    """``head`` and the next most urgent whole pending pieces of its iteration (popped from ``queue``, a
    heap of ``(priority, sequence, piece)``), while they fit in ``chunk`` bytes together: one message."""
    members, total = [head], head.nbytes
    while queue:
        piece = queue[0][2]
        if piece.iteration != head.iteration or total + piece.nbytes > chunk:
            break
        heappop(queue)
        members.append(piece)
        total += piece.nbytes
    return head if len(members) == 1 else Fused(members)
