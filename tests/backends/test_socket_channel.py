"""The parameter servers' order channel (BytePS from torch or MXNet, MXNet's KVStore): worker 0's records reach every follower, in order, and a lost or
missing peer is a one-line error within the timeout, never a hang; where worker 0 listens."""
import socket
import threading
import time

import pytest

from byteps_prophet.backends.base import BackendError
from byteps_prophet.backends.channel import SocketChannel
from byteps_prophet.backends.rendezvous import rendezvous
from byteps_prophet.errors import ConfigError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connect_followers(port: int, count: int) -> list[SocketChannel]:
    return [SocketChannel("127.0.0.1", port, leader=False, followers=0, timeout_s=10) for _ in range(count)]


def test_every_follower_reads_every_record_in_order():
    port = free_port()
    leader = SocketChannel("127.0.0.1", port, leader=True, followers=2, timeout_s=10)
    followers = connect_followers(port, 2)
    try:
        for n in range(50):
            leader.put([[n, 1, n % 3]])
        for follower in followers:
            assert [follower.get() for _ in range(50)] == [[[n, 1, n % 3]] for n in range(50)]
    finally:
        for channel in (leader, *followers):
            channel.close()


def test_a_follower_may_connect_before_the_leader_listens():
    port = free_port()
    got = []
    early = threading.Thread(target=lambda: got.append(connect_followers(port, 1)[0]))
    early.start()
    time.sleep(0.3)  # the follower retries meanwhile
    leader = SocketChannel("127.0.0.1", port, leader=True, followers=1, timeout_s=10)
    early.join(timeout=10)
    try:
        leader.put([[0, 1, 0]])
        assert got[0].get() == [[0, 1, 0]]
    finally:
        leader.close()
        got[0].close()


def test_the_leader_waits_for_every_follower_at_most_the_timeout():
    leader = SocketChannel("127.0.0.1", free_port(), leader=True, followers=1, timeout_s=0.5)
    t0 = time.monotonic()
    with pytest.raises(BackendError, match="only 0 of 1 followers"):
        leader.put([[0, 1, 0]])
    assert time.monotonic() - t0 < 3
    leader.close()


def test_no_leader_is_an_error_naming_worker_0_after_the_timeout():
    with pytest.raises(BackendError, match="worker 0"):
        SocketChannel("127.0.0.1", free_port(), leader=False, followers=0, timeout_s=0.5)


def test_a_leader_that_leaves_is_an_error_at_the_follower():
    port = free_port()
    leader = SocketChannel("127.0.0.1", port, leader=True, followers=1, timeout_s=10)
    (follower,) = connect_followers(port, 1)
    leader.put([[0, 1, 0]])
    leader.close()
    assert follower.get() == [[0, 1, 0]]  # what was sent before is still read
    with pytest.raises(BackendError, match="lost the order channel to worker 0"):
        follower.get()
    follower.close()


def test_close_wakes_a_reader_blocked_in_another_thread():
    port = free_port()
    leader = SocketChannel("127.0.0.1", port, leader=True, followers=1, timeout_s=10)
    (follower,) = connect_followers(port, 1)
    errors = []

    def read():
        try:
            follower.get()
        except BackendError as err:
            errors.append(str(err))

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.2)
    follower.close()
    reader.join(timeout=5)
    assert not reader.is_alive()
    assert errors == ["order channel closed"]
    leader.close()


@pytest.mark.parametrize("raw", ["abc", "0", "70000", "-1", "12.5"])
def test_an_invalid_master_port_is_a_one_line_error_naming_it(raw):
    with pytest.raises(ConfigError, match=f"MASTER_PORT={raw!r} is invalid; valid: a TCP port number"):
        rendezvous({"MASTER_PORT": raw}).master_port(29512)


def test_master_port_defaults_when_unset():
    assert rendezvous({}).master_port(29512) == 29512
    assert rendezvous({"MASTER_PORT": " 1234 "}).master_port(29512) == 1234
