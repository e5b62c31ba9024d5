"""BytePS push_pull (parameter server): each byte is pushed then pulled (two stages).

A slice is pushed under ``bpp.<gradient>[<rows>].<round parity>``, averaged over workers, in place.
BytePS numbers keys in the order a worker first declares them, so every key is declared
synchronously, just before its first push, from the issuer thread: since every rank issues in rank
0's announced order, every rank declares in the same order and the numbers agree.

Prophet's cuts differ from iteration to iteration, and BytePS sets every new name up with a blocking
exchange with every worker (about a second each here): one new name per cut made each step wait for
set-ups. So under Prophet (``use_atoms``) each gradient is a fixed grid of *atoms* (runs of rows of
about ``elements``, from row 0), each its own name: a slice is sent as the atoms it covers, an atom it
covers only partly whole and at once (the whole gradient is ready, so its other rows may go early),
and a later slice of the same iteration that covers an atom already sent waits for it instead. Every
byte still goes once per iteration, and the names are the same on every rank and in every iteration.
The scheduler cuts on the same grid (``Prophet.cut_elements``), so partial atoms are rare.

The order channel needs a store rank 0 can host: ``MASTER_ADDR`` (rank 0's address, reachable by the
other workers) and ``MASTER_PORT`` (default 29512); the A/B runner sets both.
"""
from __future__ import annotations

import bisect

from byteps_prophet.backends.base import Backend, BackendError, Op, import_byteps, timeout_s
from byteps_prophet.backends.channel import StoreChannel, make_store
from byteps_prophet.backends.rendezvous import ORDER_CHANNEL_PORT, rendezvous
from byteps_prophet.core.engine import EngineTraits
from byteps_prophet.core.task import atom_grid
from byteps_prophet.errors import ConfigError


class BytePSBackend(Backend):
    name = "byteps"
    # BytePS pulls a partition once the server acknowledged its push
    traits = EngineTraits(name="byteps", stages=2, pulls_follow_pushes=True)

    def __init__(self, init: bool = True) -> None:
        super().__init__()
        bps = import_byteps("torch", "backend gloo")
        import byteps.torch.ops as ops

        self.bps = bps
        self.ops = ops
        if init:
            bps.init()
        self.rank, self.size = bps.rank(), bps.size()
        self._declared: set[str] = set()
        self._rounds: dict[str, int] = {}
        self._atom_elements = 0
        self._atoms: dict[str, tuple[list[int], list[_Atom]]] = {}  # per gradient: first rows, atoms
        self._store = None
        if self.size > 1:
            where = rendezvous()
            if not where.master_addr:
                raise ConfigError("backend byteps with several workers needs MASTER_ADDR (rank 0's address) "
                                  "for the order channel; valid: an address of worker 0")
            port = where.master_port(ORDER_CHANNEL_PORT)
            self._store = make_store(where.master_addr, port, self.rank, self.size, timeout_s())

    def channel(self):
        return StoreChannel(self._store) if self._store is not None else None

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
        # Two names per slice, used in alternate rounds (as the MXNet store does, docs/MXNET.md): BytePS's
        # server serves a round's pulls from the sum the next round's first push overwrites, so one name
        # let a worker's round r+1 push corrupt another's round r pull (ranks ended with different
        # parameters). Every rank issues the same ops in the same order, so the round counts agree.
        rounds = self._rounds.get(key, 0)
        self._rounds[key] = rounds + 1
        name = f"bpp.{key}.{rounds % 2}"
        if name not in self._declared:
            self.ops.declare(name)
            self._declared.add(name)
        return _Handle(self.ops.push_pull_async_inplace(tensor, average=True, name=name))

    def wait(self, handle) -> None:
        op, handles = handle
        try:
            for h in handles:  # one waiter thread (the Synchroniser's): an atom shared by slices once
                if not h.done:
                    self.ops.synchronize(h.handle)
                    h.done = True
        except Exception as err:  # noqa: BLE001
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise BackendError(f"rank {self.rank}: push_pull of {op.key} (iteration {op.iteration}) failed: {first}") from None


class _Handle:
    __slots__ = ("handle", "done")

    def __init__(self, handle) -> None:
        self.handle, self.done = handle, False


class _Atom:
    __slots__ = ("row_start", "row_end", "iteration", "handle")

    def __init__(self, row_start: int, row_end: int) -> None:
        self.row_start, self.row_end = row_start, row_end
        self.iteration: int | None = None  # the last iteration it was sent in
        self.handle: _Handle | None = None
