"""How rank 0 announces the global order of synchronisations to the other ranks.

All ranks must issue collectives in the same order and cut gradients at the same rows; only rank 0's
scheduler decides (as ByteScheduler's plugins and Horovod's coordinator do), and it publishes each
batch of decisions as one record in a key-value store (torch.distributed's TCPStore: rank 0 hosts it,
the others read it). Records are numbered, so a follower reads them strictly in order.

A follower that waits for the next record retries on the store's timeout (training may pause for
evaluation), but a broken connection (rank 0 died) is an error at once.

:class:`SocketChannel` is the same announcement for engines without such a store (BytePS from torch
or MXNet, MXNet's KVStore; :func:`order_channel` makes it): rank 0 listens, every other rank holds one
TCP connection to it (``multiprocessing.connection``), and each record is one message, so a follower
reads them in order without numbering.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from datetime import timedelta
from multiprocessing.connection import Client, Listener

from byteps_prophet.backends.base import BackendError, timeout_s
from byteps_prophet.backends.rendezvous import ORDER_CHANNEL_PORT, Rendezvous, rendezvous

POLL = timedelta(seconds=5)


class StoreChannel:
    def __init__(self, store, prefix: str = "bpp/order") -> None:
        self._store = store
        self._prefix = prefix
        self._put_seq = 0
        self._get_seq = 0
        self.closed = threading.Event()

    def put(self, records: list) -> None:
        self._store.set(f"{self._prefix}/{self._put_seq}", json.dumps(records))
        self._put_seq += 1

    def get(self) -> list:
        key = f"{self._prefix}/{self._get_seq}"
        while True:
            if self.closed.is_set():
                raise BackendError("order channel closed")
            try:
                self._store.wait([key], POLL)
            except Exception as err:  # the store raises plain RuntimeError subclasses
                text = str(err).lower()
                if "timeout" in text or "timed out" in text or "wait timeout" in text:
                    continue
                raise BackendError(f"lost the order channel to rank 0 (rank 0 died or left?): "
                                   f"{str(err).splitlines()[0] if str(err) else type(err).__name__}") from None
            break
        try:
            raw = self._store.get(key)
        except Exception as err:
            raise BackendError(f"lost the order channel to rank 0: {str(err).splitlines()[0]}") from None
        self._get_seq += 1
        return json.loads(raw)

    def close(self) -> None:
        """A ``get`` waiting in another thread raises within one poll (the store is its host's)."""
        self.closed.set()


def make_store(host: str, port: int, rank: int, world_size: int, timeout_s: float = 300.0):
    """A TCPStore rank 0 hosts at host:port (others connect)."""
    from torch.distributed import TCPStore

    return TCPStore(host, int(port), world_size, rank == 0, timedelta(seconds=timeout_s),
                    wait_for_workers=False)


def order_channel(leader: bool, followers: int, where: Rendezvous | None = None) -> "SocketChannel | None":
    """Worker 0's order channel on a parameter server: a :class:`SocketChannel` at ``MASTER_ADDR``
    (worker 0's address) and ``MASTER_PORT`` (default ``ORDER_CHANNEL_PORT``); None without
    ``MASTER_ADDR`` (the caller says what that means for it)."""
    where = rendezvous() if where is None else where
    if not where.master_addr:
        return None
    return SocketChannel(where.master_addr, where.master_port(ORDER_CHANNEL_PORT), leader, followers, timeout_s())


class SocketChannel:
    """Rank 0 (``leader``) sends each record to every follower over its own connection, in order.

    The leader listens on ``port`` (every interface: its address is whatever the followers reach it
    by) and ``put`` waits, at most ``timeout_s``, until all ``followers`` have connected; a follower
    connects in its constructor, retrying while rank 0 is not listening yet. A lost connection is a
    ``BackendError`` naming the peer, at once."""

    AUTHKEY = b"byteps-prophet-order"

    def __init__(self, host: str, port: int, leader: bool, followers: int, timeout_s: float = 300.0) -> None:
        self._expected = followers
        self._timeout_s = timeout_s
        self._conns: list = []
        self._connected = threading.Condition()
        self._listener = None
        self._conn = None
        self.closed = threading.Event()
        if leader:
            self._listener = Listener(("", int(port)), authkey=self.AUTHKEY)
            threading.Thread(target=self._accept, name="bpp-order-accept", daemon=True).start()
        else:
            self._conn = self._connect(host, int(port))

    def _accept(self) -> None:
        while len(self._conns) < self._expected and not self.closed.is_set():
            try:
                conn = self._listener.accept()
            except (OSError, EOFError):  # closed, or a connection that failed the handshake
                if self.closed.is_set():
                    return
                continue
            with self._connected:
                self._conns.append(conn)
                self._connected.notify_all()

    def _connect(self, host: str, port: int):
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                return Client((host, port), authkey=self.AUTHKEY)
            except (ConnectionRefusedError, ConnectionResetError, TimeoutError):
                if time.monotonic() > deadline:
                    raise BackendError(f"no order channel at {host}:{port} (worker 0) after "
                                       f"{self._timeout_s:.0f} s; is worker 0 running?") from None
                time.sleep(0.05)

    def put(self, records: list) -> None:
        with self._connected:
            if not self._connected.wait_for(lambda: len(self._conns) >= self._expected, self._timeout_s):
                raise BackendError(f"only {len(self._conns)} of {self._expected} followers reached the order "
                                   f"channel in {self._timeout_s:.0f} s")
        raw = json.dumps(records).encode()
        for conn in self._conns:
            try:
                conn.send_bytes(raw)
            except OSError as err:
                raise BackendError(f"lost the order channel to a follower (it died or left?): {err}") from None

    def get(self) -> list:
        try:
            return json.loads(self._conn.recv_bytes())
        except (EOFError, OSError) as err:
            if self.closed.is_set():
                raise BackendError("order channel closed") from None
            raise BackendError(f"lost the order channel to worker 0 (it died or left?): "
                               f"{type(err).__name__}") from None

    def close(self) -> None:
        """Close every connection; a ``get`` blocked in another thread returns (raises) at once."""
        self.closed.set()
        for conn in self._conns + ([self._conn] if self._conn is not None else []):
            with contextlib.suppress(OSError):  # closing alone would not wake a reader blocked in recv
                with socket.socket(fileno=os.dup(conn.fileno())) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
            conn.close()
        if self._listener is not None:
            self._listener.close()
