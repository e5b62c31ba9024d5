"""BytePS push_pull (parameter server): each byte is pushed then pulled (two stages).

A slice is pushed under ``bpp.<gradient>[<rows>].<round parity>``, averaged over workers, in place.
BytePS numbers keys in the order a worker first declares them, so every key is declared just before
its first push, from the issuer thread: every rank issues in rank 0's announced order, so every rank
declares in the same order and the numbers agree.

BytePS sets every new name up with a blocking exchange with every worker, and Prophet's cuts differ
from step to step. So under Prophet (``use_atoms``) each gradient is a fixed grid of *atoms*, each its
own name (docs/DESIGN.md, "Fixed atoms"): a slice is sent as the atoms it covers, an atom it covers
only partly whole and at once (the whole gradient is ready), and a later slice of the same iteration
that covers an atom already sent waits for it instead.

The order channel is ``channel.order_channel``: rank 0 listens at ``MASTER_ADDR`` and ``MASTER_PORT``
(default 29512).

:class:`BytePSTransport` is BytePS itself, for this backend and for the MXNet stores alike
(mxnet/byteps_backend.py): init, names declared once, a key's rounds on two alternating names,
push_pull in place, barrier, shutdown. Only the tensor calls differ between ``byteps.torch`` and
``byteps.mxnet`` (:class:`_TorchOps`, :class:`_MXNetOps`).
"""
from __future__ import annotations

import bisect
import os
import shutil
import tempfile

from byteps_prophet.backends.base import Backend, BackendError, Op, import_byteps
from byteps_prophet.backends.channel import order_channel
from byteps_prophet.core.traits import EngineTraits
from byteps_prophet.core.settings import Settings
from byteps_prophet.core.task import atom_grid
from byteps_prophet.errors import ConfigError


class _TorchOps:
    """``byteps.torch``'s calls: asynchronous in place, a handle to wait on."""

    private_socket = False  # the torch plugin's workers use BytePS's socket path as they find it

    def __init__(self) -> None:
        self.bps = import_byteps("torch", "backend gloo")
        import byteps.torch.ops as ops

        self._ops = ops

    def declare(self, name: str) -> None:
        self._ops.declare(name)

    def push_pull(self, name: str, tensor, average: bool, priority: int):
        return self._ops.push_pull_async_inplace(tensor, average=average, name=name)

    def wait(self, handle, tensor) -> None:
        self._ops.synchronize(handle)

    def zeros(self, n: int):
        import torch

        return torch.zeros(n)


class _MXNetOps:
    """``byteps.mxnet``'s calls: an engine op on the array, done when the array can be read."""

    # Two BytePS workers of one host (the local cluster shares /tmp) would bind the same unix sockets.
    private_socket = True

    def __init__(self) -> None:
        self.bps = import_byteps("mxnet", "--backend kvstore")

    def declare(self, name: str) -> None:
        self.bps.byteps_declare_tensor(name)

    def push_pull(self, name: str, tensor, average: bool, priority: int) -> None:
        self.bps.byteps_push_pull(tensor, name=name, priority=priority, is_average=average)

    def wait(self, handle, tensor) -> None:
        tensor.wait_to_read()

    def zeros(self, n: int):
        import mxnet as mx

        return mx.nd.zeros((n,))


_PLUGINS = {"torch": _TorchOps, "mxnet": _MXNetOps}


class BytePSTransport:
    """BytePS for both plugins.

    ``init=False``: BytePS was initialised by the caller (a patched ``DistributedTrainer`` or
    optimizer), who also owns its shutdown: then ``shutdown`` does not call ``byteps.<plugin>.shutdown()``.
    With ``init=True`` and an unset ``BYTEPS_SOCKET_PATH`` the MXNet plugin gets a private socket
    directory, removed at ``shutdown``. Do not use both plugins in one process (docs/BYTEPS.md)."""

    def __init__(self, plugin: str = "torch", init: bool = True) -> None:
        if plugin not in _PLUGINS:
            raise ConfigError(f"BytePS plugin {plugin!r} is not one; valid: {', '.join(_PLUGINS)}")
        ops_cls = _PLUGINS[plugin]
        self._owns_bps = init
        self._socket_dir = None
        self._closed = False
        if init and ops_cls.private_socket and not Settings.from_env().socket_path:
            self._socket_dir = tempfile.mkdtemp(prefix="bpp-bps-sock-")
            os.environ["BYTEPS_SOCKET_PATH"] = self._socket_dir
        try:
            self.ops = ops_cls()
        except ConfigError:
            self._cleanup()
            raise
        self.bps = self.ops.bps
        if init:
            self.bps.init()
        self.rank, self.size = self.bps.rank(), self.bps.size()
        self._declared: set[str] = set()
        self._rounds: dict = {}

    def declare(self, name: str) -> None:
        """BytePS numbers names in the order a worker first declares them: every worker must declare
        the same names in the same order."""
        if name not in self._declared:
            self.ops.declare(name)
            self._declared.add(name)

    @staticmethod
    def round_names(key) -> tuple[str, str]:
        return f"bpp.{key}.0", f"bpp.{key}.1"

    def next_round(self, key) -> str:
        """The (declared) name of ``key``'s next round: its two names in alternate rounds, counted per
        key. BytePS's server serves a round's pulls from the value the next round's first push
        overwrites, so with one name a worker's round r+1 push could corrupt another's round r pull.
        Round r+2 (the same name) waits for round r+1, which every worker pushes only after its round
        r is done. Every worker syncs each key equally often, so the counts agree."""
        rounds = self._rounds.get(key, 0) + 1
        self._rounds[key] = rounds
        name = self.round_names(key)[rounds % 2]
        self.declare(name)
        return name

    def push_pull(self, name: str, tensor, *, average: bool, priority: int = 0):
        """Average (or sum) ``tensor`` over the workers, in place, without waiting; a handle for
        ``wait`` (None where the framework's engine orders what reads the tensor)."""
        return self.ops.push_pull(name, tensor, average, priority)

    def wait(self, handle, tensor) -> None:
        self.ops.wait(handle, tensor)

    def barrier(self) -> None:
        """Meet every worker (a one-element sum under its own name)."""
        buf = self.ops.zeros(1)
        self.declare("bpp.barrier")
        self.wait(self.push_pull("bpp.barrier", buf, average=False), buf)

    def shutdown(self, alone: bool = False) -> None:
        """Shut BytePS down if this transport initialised it. ``alone`` (leaving on an error): not
        here, where every worker is met; BytePS's exit handler shuts down without them (patch 0015)."""
        if not self._closed:
            self._closed = True
            if self._owns_bps and not alone:
                self.bps.shutdown()
            self._cleanup()

    def _cleanup(self) -> None:
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None


class BytePSBackend(Backend):
    name = "byteps"
    # BytePS pulls a partition once the server acknowledged its push
    traits = EngineTraits(name="byteps", stages=2, pulls_follow_pushes=True)

    def __init__(self, init: bool = True) -> None:
        super().__init__()
        # BytePS is left to the script and BytePS's own exit handler: close() does not shut it down
        self.transport = BytePSTransport("torch", init)
        self.rank, self.size = self.transport.rank, self.transport.size
        self._atom_elements = 0
        self._atoms: dict[str, tuple[list[int], list[_Atom]]] = {}  # per gradient: first rows, atoms
        self._channel = None
        if self.size > 1:
            self._channel = order_channel(self.rank == 0, self.size - 1)
            if self._channel is None:
                raise ConfigError("backend byteps with several workers needs MASTER_ADDR (rank 0's address) "
                                  "for the order channel; valid: an address of worker 0")

    def channel(self):
        return self._channel

    def use_atoms(self, elements: int) -> int:
        self._atom_elements = elements
        return elements

    def issue(self, op: Op):
        if not self._atom_elements or op.whole is None:
            return (op, [self._push_pull(op.key, op.tensor)])
        grid = self._atoms.get(op.name)
        if grid is None:
            ranges = atom_grid(op.whole.shape[0], op.whole[0].numel(), self._atom_elements)
            grid = self._atoms[op.name] = ([a for a, _ in ranges], [_Atom(a, b) for a, b in ranges])
        starts, atoms = grid
        lo = bisect.bisect_right(starts, op.row_start) - 1
        hi = bisect.bisect_left(starts, op.row_end)
        handles = []
        for atom in atoms[lo:hi]:
            if atom.iteration != op.iteration:  # not sent yet in this iteration: send it whole, now
                atom.iteration = op.iteration
                atom.handle = self._push_pull(f"{op.name}[{atom.row_start}:{atom.row_end}]",
                                              op.whole[atom.row_start:atom.row_end])
            handles.append(atom.handle)
        return (op, handles)

    def _push_pull(self, key: str, tensor) -> "_Handle":
        # declared on first use, from the issuer thread: every rank issues (declares) in rank 0's order
        name = self.transport.next_round(key)
        return _Handle(self.transport.push_pull(name, tensor, average=True), tensor)

    def wait(self, handle) -> None:
        op, handles = handle
        try:
            for h in handles:  # one waiter thread (the Synchroniser's): an atom shared by slices once
                if not h.done:
                    self.transport.wait(h.handle, h.tensor)
                    h.done = True
        except Exception as err:  # noqa: BLE001
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise BackendError(f"rank {self.rank}: push_pull of {op.key} (iteration {op.iteration}) failed: {first}") from None


class _Handle:
    __slots__ = ("handle", "tensor", "done")

    def __init__(self, handle, tensor) -> None:
        self.handle, self.tensor, self.done = handle, tensor, False


class _Atom:
    __slots__ = ("row_start", "row_end", "iteration", "handle")

    def __init__(self, row_start: int, row_end: int) -> None:
        self.row_start, self.row_end = row_start, row_end
        self.iteration: int | None = None  # the last iteration it was sent in
        self.handle: _Handle | None = None
