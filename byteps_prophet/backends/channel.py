"""How rank 0 announces the global order of synchronisations to the other ranks.

All ranks must issue collectives in the same order and cut gradients at the same rows; only rank 0's
scheduler decides (as ByteScheduler's plugins and Horovod's coordinator do), and it publishes each
batch of decisions as one record in a key-value store (torch.distributed's TCPStore: rank 0 hosts it,
the others read it). Records are numbered, so a follower reads them strictly in order.

A follower that waits for the next record retries on the store's timeout (training may pause for
evaluation), but a broken connection (rank 0 died) is an error at once.
"""
from __future__ import annotations

import json
import threading
from datetime import timedelta

from byteps_prophet.backends.base import BackendError

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


def make_store(host: str, port: int, rank: int, world_size: int, timeout_s: float = 300.0):
    """A TCPStore rank 0 hosts at host:port (others connect)."""
    from torch.distributed import TCPStore

    return TCPStore(host, int(port), world_size, rank == 0, timedelta(seconds=timeout_s),
                    wait_for_workers=False)
