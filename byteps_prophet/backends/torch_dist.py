"""torch.distributed all-reduce: gloo on CPU, NCCL on GPU. Each byte crosses the link once.

Rendezvous: an existing default process group is used as is; otherwise this backend creates one from
the environment: ``RANK``/``WORLD_SIZE`` (else BytePS's ``DMLC_WORKER_ID``/``DMLC_NUM_WORKER``) and
``MASTER_ADDR``/``MASTER_PORT`` (rank 0 hosts the store). The order channel lives in the same store
under its own prefix. ``BYTEPS_PROPHET_TIMEOUT`` (seconds, default 300) bounds every collective: a
dead peer turns into an error naming the backend, never a hang.
"""
from __future__ import annotations

import os
from datetime import timedelta

from byteps_prophet.backends.base import Backend, BackendError, FusedOp, Op, timeout_s
from byteps_prophet.backends.channel import StoreChannel
from byteps_prophet.backends.rendezvous import TORCH_STORE_PORT, rendezvous
from byteps_prophet.core.traits import EngineTraits
from byteps_prophet.errors import ConfigError


class TorchDistBackend(Backend):
    """One asynchronous ``all_reduce`` per op (one per dtype for a FusedOp), divided by the world size
    when waited for. ``kind`` is the torch.distributed backend (gloo or nccl); ``group`` a process
    group to use instead of the default one."""

    traits = EngineTraits(name="gloo", stages=1)  # every all-reduce crosses the link once, gloo or NCCL
    accepts_fused = True  # a FusedOp is one all_reduce of a flat buffer per dtype (issue below)

    def __init__(self, kind: str = "gloo", group=None) -> None:
        super().__init__()
        self.name = kind
        self.group = group
        self._store = None
        self._owns_group = False
        # this iteration's collectives (their Work objects), referenced until the next iteration (_hold)
        self._held: list = []
        self._held_iteration = None
        self.setup()

    def setup(self) -> None:
        """Join the default process group, creating it from the rendezvous if there is none yet (then
        it is this backend's to destroy at ``close``), and open the order channel's store prefix."""
        import torch.distributed as dist

        if not dist.is_available():
            raise ConfigError("torch.distributed is not available in this torch build; valid: backend local")
        if not dist.is_initialized():
            where = rendezvous()
            rank, size = where.rank_and_size()
            addr = where.master_addr or "127.0.0.1"
            port = where.master_port(TORCH_STORE_PORT)
            from byteps_prophet.backends.channel import make_store

            if self.name == "gloo" and not where.gloo_interface and where.interface:
                # In the cluster's namespaces the hostname resolves to loopback; use the host's link.
                os.environ["GLOO_SOCKET_IFNAME"] = where.interface

            store = make_store(addr, port, rank, size, timeout_s())
            dist.init_process_group(self.name, store=store, rank=rank, world_size=size,
                                    timeout=timedelta(seconds=timeout_s()))
            self._owns_group = True
        self.rank = dist.get_rank(self.group)
        self.size = dist.get_world_size(self.group)
        if self.size > 1:
            base = dist.distributed_c10d._get_default_store()
            self._store = dist.PrefixStore("bpp-order", base)

    def channel(self):
        return StoreChannel(self._store) if self._store is not None else None

    def issue(self, op: Op):
        """Start the all-reduce (sum) of ``op``'s rows in place; the handle is ``(op, work)``, where a
        FusedOp's work is a list of ``(members, flat buffer, Work)`` and one worker's is None."""
        import torch.distributed as dist

        if self.size == 1:
            return (op, None)
        if isinstance(op, FusedOp):
            # One flat buffer per dtype (in the members' order, the same on every rank), one all_reduce each.
            from torch._utils import _flatten_dense_tensors

            groups: dict = {}
            for member in op.members:
                groups.setdefault(member.tensor.dtype, []).append(member)
            works = []
            for members in groups.values():
                flat = _flatten_dense_tensors([m.tensor for m in members])
                works.append((members, flat, dist.all_reduce(flat, group=self.group, async_op=True)))
            return (op, works)
        return (op, dist.all_reduce(op.tensor, group=self.group, async_op=True))

    def wait(self, handle) -> None:
        """Wait for the all-reduce, then turn the sum into the average (a FusedOp's flat buffer once,
        then copied back into each member's rows). A failed collective is a BackendError naming the op."""
        op, work = handle
        if work is None:
            return
        try:
            for item in (work if isinstance(work, list) else [(None, None, work)]):
                item[2].wait()
        except Exception as err:  # noqa: BLE001
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise BackendError(f"rank {self.rank}: all-reduce of {op.key} (iteration {op.iteration}) failed; "
                               f"a peer died or left? {first}") from None
        if isinstance(work, list):
            from torch._utils import _unflatten_dense_tensors

            for members, flat, _ in work:
                flat.div_(self.size)  # once, for the whole buffer
                for member, reduced in zip(members, _unflatten_dense_tensors(flat, [m.tensor for m in members])):
                    member.tensor.copy_(reduced)
            self._hold(op.iteration, [item[2] for item in work])
            return
        op.tensor.div_(self.size)
        self._hold(op.iteration, [work])

    def _hold(self, iteration: int, works: list) -> None:
        """Keep a collective's Work referenced until the next iteration. gloo's worker thread drops its
        own reference a moment after the collective completes; were it the last, that thread would
        destroy the Work and release its tensors, which asks for the GIL (they are Python's too), and
        a thread that asks for the GIL while the interpreter finalizes is ended by a forced unwind that
        aborts the process ("terminate called without an active exception"). Held here, the Work is
        released by Python, under the GIL; the last iteration's are kept for good by ``close``."""
        if iteration != self._held_iteration:
            self._held, self._held_iteration = [], iteration
        self._held.extend(works)

    def close(self, together: bool = True) -> None:
        """Destroy the process group if this backend made it (after a barrier when ``together``), drop
        the store, and keep the last iteration's Works referenced for good (``_hold``)."""
        import torch.distributed as dist

        if self._owns_group and dist.is_initialized():
            try:
                if together and self.size > 1:
                    # Leave together: a rank that tears the group down (rank 0: the store) while a peer
                    # still uses it would make the peer's last calls fail
                    dist.barrier(group=self.group)
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass
            self._owns_group = False
        # The store (rank 0 hosts its server) goes now, not in the interpreter's teardown, where the
        # plugin's objects (a cycle) outlive the user's script.
        self._store = None
        # gloo's worker threads may still hold the last iteration's Works; they must never drop the
        # last reference while the interpreter finalizes (_hold), so these stay referenced until the
        # process ends: a deliberate leak of one iteration's Works (and buffers) at exit.
        _keep_until_exit(self._held)
        self._held = []


def _keep_until_exit(objects: list) -> None:
    import ctypes

    ctypes.pythonapi.Py_IncRef(ctypes.py_object(objects))
