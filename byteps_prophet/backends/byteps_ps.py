"""BytePS push_pull (parameter server): each byte is pushed then pulled, ``serializations = 2``.

A slice is pushed under ``bpp.<gradient>[<rows>].<round parity>``, averaged over workers, in place.
BytePS numbers keys in the order a worker first declares them, so every key is declared
synchronously, just before its first push, from the issuer thread: since every rank issues in rank
0's announced order, every rank declares in the same order and the numbers agree.

The order channel needs a store rank 0 can host: ``MASTER_ADDR`` (rank 0's address, reachable by the
other workers) and ``MASTER_PORT`` (default 29512); the A/B runner sets both.
"""
from __future__ import annotations

import os

from byteps_prophet.backends.base import Backend, BackendError, Op
from byteps_prophet.backends.channel import StoreChannel, make_store
from byteps_prophet.errors import ConfigError


class BytePSBackend(Backend):
    name = "byteps"
    serializations = 2

    def __init__(self, init: bool = True) -> None:
        super().__init__()
        try:
            import byteps.torch as bps
        except ImportError as err:
            raise ConfigError(f"backend byteps: byteps.torch is not importable ({err}); "
                              f"valid: build it with scripts/build_byteps.sh, or backend gloo") from None
        import byteps.torch.ops as ops

        self.bps = bps
        self.ops = ops
        if init:
            bps.init()
        self.rank, self.size = bps.rank(), bps.size()
        self._declared: set[str] = set()
        self._rounds: dict[str, int] = {}
        self._store = None
        if self.size > 1:
            addr = os.environ.get("MASTER_ADDR")
            if not addr:
                raise ConfigError("backend byteps with several workers needs MASTER_ADDR (rank 0's address) "
                                  "for the order channel; valid: an address of worker 0")
            port = os.environ.get("MASTER_PORT", "29512")
            if not port.isdigit():
                raise ConfigError(f"MASTER_PORT={port!r} is invalid; valid: a TCP port number")
            from byteps_prophet.backends.torch_dist import timeout_s

            self._store = make_store(addr, int(port), self.rank, self.size, timeout_s())

    def channel(self):
        return StoreChannel(self._store) if self._store is not None else None

    def issue(self, op: Op):
        # Two names per slice, used in alternate rounds (as the MXNet store does, docs/MXNET.md): BytePS's
        # server serves a round's pulls from the sum the next round's first push overwrites, so one name
        # let a worker's round r+1 push corrupt another's round r pull (ranks ended with different
        # parameters). Every rank issues the same ops in the same order, so the round counts agree.
        rounds = self._rounds.get(op.key, 0)
        self._rounds[op.key] = rounds + 1
        name = f"bpp.{op.key}.{rounds % 2}"
        if name not in self._declared:
            self.ops.declare(name)
            self._declared.add(name)
        return (op, self.ops.push_pull_async_inplace(op.tensor, average=True, name=name))

    def wait(self, handle) -> None:
        op, h = handle
        try:
            self.ops.synchronize(h)
        except Exception as err:  # noqa: BLE001
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise BackendError(f"rank {self.rank}: push_pull of {op.key} (iteration {op.iteration}) failed: {first}") from None
