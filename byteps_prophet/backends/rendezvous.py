"""Where this process sits in the job, read from the environment in one place.

The launchers say it in two dialects: torch's (``RANK``, ``WORLD_SIZE``) and BytePS/ps-lite's
(``DMLC_ROLE``, ``DMLC_WORKER_ID``, ``DMLC_NUM_WORKER``, ``DMLC_NUM_SERVER``, ``DMLC_INTERFACE``;
gloo's ``GLOO_SOCKET_IFNAME``); both name worker 0's
address and a port on it with ``MASTER_ADDR``/``MASTER_PORT``, where worker 0 hosts torch's store or
the order channel. :func:`rendezvous` reads them all, once per call, into a :class:`Rendezvous`; values
are checked where they are used (a one-line error naming the variable and what is valid), so a
variable a run does not need never fails it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from byteps_prophet.errors import ConfigError

ORDER_CHANNEL_PORT = 29512  # worker 0's order channel on a parameter server, unless MASTER_PORT says
TORCH_STORE_PORT = 29500  # torch.distributed's usual default for its store


@dataclass(frozen=True)
class Rendezvous:
    rank_raw: str = ""  # RANK
    size_raw: str = ""  # WORLD_SIZE
    worker_id_raw: str = ""  # DMLC_WORKER_ID
    num_workers_raw: str = ""  # DMLC_NUM_WORKER
    num_servers_raw: str = ""  # DMLC_NUM_SERVER
    role: str = ""  # DMLC_ROLE
    interface: str = ""  # DMLC_INTERFACE
    gloo_interface: str = ""  # GLOO_SOCKET_IFNAME
    master_addr: str = ""  # MASTER_ADDR, "" when unset
    master_port_raw: str = ""  # MASTER_PORT

    @classmethod
    def from_env(cls, environ=None) -> "Rendezvous":
        env = os.environ if environ is None else environ

        def get(name: str) -> str:
            return (env.get(name) or "").strip()

        return cls(rank_raw=get("RANK"), size_raw=get("WORLD_SIZE"), worker_id_raw=get("DMLC_WORKER_ID"),
                   num_workers_raw=get("DMLC_NUM_WORKER"),
                   num_servers_raw=get("DMLC_NUM_SERVER"), role=get("DMLC_ROLE"), interface=get("DMLC_INTERFACE"),
                   gloo_interface=get("GLOO_SOCKET_IFNAME"), master_addr=get("MASTER_ADDR"),
                   master_port_raw=get("MASTER_PORT"))

    def rank_and_size(self) -> tuple[int, int]:
        """``RANK``/``WORLD_SIZE``, else ``DMLC_WORKER_ID``/``DMLC_NUM_WORKER``, else 0/1."""
        rank = self.rank_raw or self.worker_id_raw or "0"
        size = self.size_raw or self.num_workers_raw or "1"
        try:
            rank, size = int(rank), int(size)
        except ValueError:
            raise ConfigError(f"RANK={rank!r}/WORLD_SIZE={size!r} are not integers; "
                              f"valid: 0 <= RANK < WORLD_SIZE") from None
        if not 0 <= rank < size:
            raise ConfigError(f"RANK={rank} is outside WORLD_SIZE={size}; valid: 0 <= RANK < WORLD_SIZE")
        return rank, size

    @property
    def worker_id(self) -> int | None:
        """``DMLC_WORKER_ID`` (the cluster's worker number), None when unset or not a number."""
        return int(self.worker_id_raw) if self.worker_id_raw.isdigit() else None

    def num_servers(self, default: int = 0) -> int:
        """``DMLC_NUM_SERVER`` (``default`` when unset): the parameter servers of a BytePS or KVStore job."""
        return _count("DMLC_NUM_SERVER", self.num_servers_raw, default)

    def num_workers(self, default: int = 1) -> int:
        """``DMLC_NUM_WORKER`` (``default`` when unset), as the cluster's containers count them."""
        return _count("DMLC_NUM_WORKER", self.num_workers_raw, default)

    @property
    def world_size(self) -> int:
        """``WORLD_SIZE`` as a number (1 when unset or not a number): is this a multi-worker torch job?"""
        return int(self.size_raw) if self.size_raw.isdigit() else 1

    def master_port(self, default: int) -> int:
        """``MASTER_PORT`` (``default`` when unset)."""
        raw = self.master_port_raw or str(default)
        if not raw.isdigit() or not 0 < int(raw) < 65536:
            raise ConfigError(f"MASTER_PORT={raw!r} is invalid; valid: a TCP port number")
        return int(raw)


def _count(name: str, raw: str, default: int) -> int:
    if not raw:
        return default
    if not raw.isdigit():
        raise ConfigError(f"{name}={raw!r} is invalid; valid: an integer >= 0")
    return int(raw)


def rendezvous(environ=None) -> Rendezvous:
    """This process's place in the job, from ``environ`` (default: the process environment)."""
    return Rendezvous.from_env(environ)
