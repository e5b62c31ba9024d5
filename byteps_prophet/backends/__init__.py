"""How bytes move: each backend turns "synchronise these rows of this gradient" into an engine call.

* :mod:`.base`      the contract (:class:`Op`, :class:`Backend`) and the single-process backend;
* :mod:`.torch_dist` torch.distributed all-reduce (gloo on CPU, NCCL on GPU), one stage;
* :mod:`.byteps_ps` BytePS push_pull (parameter server), two stages, pulls follow pushes;
* :mod:`.channel`   how rank 0 announces the global order to the other ranks;
* :mod:`.rendezvous` where this process sits in the job (RANK/WORLD_SIZE, DMLC_*, MASTER_ADDR/PORT),
  read from the environment in one place for both plugins;
* :mod:`.sync`      the :class:`Synchroniser` (torch plugin and MXNet stores alike): issues ops in one
  global order on every rank and reports completions, failing loudly (never hanging) on a mismatch
  or a dead peer.

Backends are framework-level but scheduler-free: the plugin owns the scheduler and its lock.
"""
from byteps_prophet.backends.base import Backend, BackendError, LocalBackend, Op, OrderMismatch
from byteps_prophet.core.settings import BACKENDS


def make_backend(name: str, **kwargs) -> Backend:
    """The backend ``name`` (one of BACKENDS); raises ConfigError for an unknown one."""
    from byteps_prophet.errors import ConfigError

    name = (name or "").strip().lower()
    if name in ("gloo", "nccl"):
        from byteps_prophet.backends.torch_dist import TorchDistBackend

        return TorchDistBackend(name, **kwargs)
    if name == "byteps":
        from byteps_prophet.backends.byteps_ps import BytePSBackend

        return BytePSBackend(**kwargs)
    if name == "local":
        return LocalBackend()
    raise ConfigError(f"backend {name!r} is not a backend; valid: {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "Backend", "BackendError", "LocalBackend", "Op", "OrderMismatch", "make_backend"]
