"""The one order synchroniser both plugins use, leader and follower over the real socket channel:
every op issued exactly once on every rank, in the leader's order, whatever order the follower's
gradients become ready in; the inline leader (the MXNet stores) and the threaded one (torch) alike;
a leader that disappears ends the follower with an error naming it, within a bound."""
import socket
import threading
import time

import numpy as np
import pytest

from byteps_prophet.backends.base import Backend, BackendError, Op
from byteps_prophet.backends.channel import SocketChannel
from byteps_prophet.backends.sync import Synchroniser


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SummingBackend(Backend):
    """One rank of a two-rank sum over a shared table: ``issue`` adds this rank's rows into the
    table under the op's (gradient, iteration, rows); the table is the result both ranks read."""

    name = "summing"

    def __init__(self, rank: int, channel, table: dict, lock: threading.Lock, handles: bool) -> None:
        super().__init__()
        self.rank, self.size = rank, 2
        self._channel, self._table, self._lock, self._handles = channel, table, lock, handles
        self.issued: list[tuple] = []

    def channel(self):
        return self._channel

    def issue(self, op: Op):
        with self._lock:
            key = (op.name, op.iteration, op.row_start, op.row_end)
            self._table[key] = self._table.get(key, 0.0) + float(op.tensor.sum())
        self.issued.append((op.name, op.iteration, op.row_start, op.row_end))
        return op if self._handles else None  # None: completion is the backend's to report

    def wait(self, handle) -> None:
        return None


def _pair(inline: bool):
    port = free_port()
    table, lock = {}, threading.Lock()
    lead_ch = SocketChannel("127.0.0.1", port, leader=True, followers=1, timeout_s=10)
    follow_ch = SocketChannel("127.0.0.1", port, leader=False, followers=0, timeout_s=10)
    errors = {0: [], 1: []}
    finished = {0: [], 1: []}
    lead_be = SummingBackend(0, lead_ch, table, lock, handles=not inline)
    follow_be = SummingBackend(1, follow_ch, table, lock, handles=True)
    leader = Synchroniser(lead_be, finished[0].append, errors[0].append, inline=inline)
    follower = Synchroniser(follow_be, finished[1].append, errors[1].append)
    return leader, follower, lead_be, follow_be, table, errors, finished


@pytest.mark.parametrize("inline", [True, False], ids=["inline-leader", "threaded-leader"])
def test_every_op_once_on_both_ranks_in_the_leaders_order(inline):
    leader, follower, lead_be, follow_be, table, errors, finished = _pair(inline)
    names = [f"g{i}" for i in range(6)]
    grads = {(r, n): np.full((8, 3), 1.0 + 10 * r + i) for r in (0, 1) for i, n in enumerate(names)}
    try:
        for iteration in range(3):
            # the follower's gradients become ready in the reverse of the leader's order
            for name in reversed(names):
                follower.local_ready(iteration, name, grads[1, name])
            for name in names:
                g = grads[0, name]
                ops = [Op(name, iteration, a, b, g[a:b], whole=g) for a, b in ((0, 3), (3, 8))]
                leader.submit(*ops)
            follower.local_end_of_backward(iteration)
            leader.end_iteration(iteration)
        deadline = time.monotonic() + 10
        while len(follow_be.issued) < len(lead_be.issued) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        leader.close()
        follower.close()
    assert not errors[0] and not errors[1], errors
    assert len(lead_be.issued) == 3 * 6 * 2
    assert follow_be.issued == lead_be.issued  # same ops, same order, each once (the list would repeat it)
    assert len(set(lead_be.issued)) == len(lead_be.issued)
    # sums, not averages: each slice is exactly leader + follower, once
    for (name, _, a, b), total in table.items():
        expected = float((grads[0, name][a:b] + grads[1, name][a:b]).sum())
        assert total == expected, (name, a, b, total, expected)
    assert follower.closed_by_leader
    if not inline:
        assert len(finished[0]) == len(lead_be.issued)
    assert len(finished[1]) == len(follow_be.issued)


def test_a_follower_whose_leader_vanishes_fails_naming_worker_0_within_a_bound():
    leader, follower, lead_be, follow_be, _, errors, _ = _pair(inline=True)
    g = np.ones((4, 2))
    follower.local_ready(0, "w", g)
    leader.submit(Op("w", 0, 0, 4, g, whole=g))
    t0 = time.monotonic()
    leader.channel.close()  # gone without its close record: what a dead worker 0 looks like
    while not errors[1] and time.monotonic() - t0 < 10:
        time.sleep(0.01)
    follower.close(timeout=2)
    leader.close(timeout=2)
    assert errors[1], "the follower did not notice its leader was gone"
    assert time.monotonic() - t0 < 10
    assert isinstance(errors[1][0], BackendError) and "worker 0" in str(errors[1][0])
    assert follow_be.issued == [("w", 0, 0, 4)]  # what was announced before is still issued, once


def test_a_follower_missing_the_announced_rows_is_an_order_mismatch():
    leader, follower, _, follow_be, _, errors, _ = _pair(inline=True)
    follower.local_ready(0, "w", np.ones((2, 2)))  # the leader's 'w' has 4 rows
    g = np.ones((4, 2))
    leader.submit(Op("w", 0, 0, 4, g, whole=g))
    t0 = time.monotonic()
    while not errors[1] and time.monotonic() - t0 < 10:
        time.sleep(0.01)
    leader.close(timeout=2)
    follower.close(timeout=2)
    assert errors[1] and "rows 0:4 of 'w'" in str(errors[1][0]) and "has 2 rows" in str(errors[1][0])
    assert follow_be.issued == []


def test_forget_drops_a_followers_entry_where_no_end_record_comes():
    """The MXNet stores send no end-of-iteration records: without forget every synchronisation
    would stay in the follower's tables for the whole run."""
    leader, follower, _, follow_be, _, errors, _ = _pair(inline=True)
    g = np.ones((4, 2))
    for seq in range(3):
        follower.local_ready(seq, 7, g)
        leader.submit(Op(7, seq, 0, 4, g, whole=g))
    deadline = time.monotonic() + 10
    while len(follow_be.issued) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    for seq in range(3):
        follower.forget(seq, 7)
    leader.close(timeout=2)
    follower.close(timeout=2)
    assert not errors[0] and not errors[1]
    assert follow_be.issued == [(7, 0, 0, 4), (7, 1, 0, 4), (7, 2, 0, 4)]
    assert not follower._local and not follower._posted and not follower._announced
