"""Scheduler and server roles: ``python -m byteps_prophet.cluster.serve``.

Reads ``ENGINE`` (byteps or mxnet: cluster/container.py) and replaces itself with the engine's parameter server, which
serves as scheduler or server according to ``DMLC_ROLE``:

* byteps: ``python -c 'import byteps.server'``
* mxnet:  ``python -c 'import mxnet'`` (MXNet's KVStore server starts on import when DMLC_ROLE is
  scheduler or server; workers use ``mx.kv.create('dist_sync')``)

The same command runs under Docker (docker/docker-compose.yml) and in the local cluster.
"""
from __future__ import annotations

import os
import sys

from byteps_prophet.backends.rendezvous import rendezvous
from byteps_prophet.cluster.container import container
from byteps_prophet.core.settings import Settings
from byteps_prophet.errors import ConfigError

SERVER_IMPORTS = {"byteps": "import byteps.server", "mxnet": "import mxnet"}


def main() -> int:
    try:
        engine, role = container().engine, rendezvous().role
        Settings.from_env()  # the engine reads PS_ZMQ_IDLE_US / BYTEPS_LOOP_IDLE_US itself: checked here first
    except ConfigError as err:
        print(f"serve: {err}", file=sys.stderr)
        return 2
    if role not in ("scheduler", "server"):
        print(f"serve: DMLC_ROLE={role!r} is invalid; valid: scheduler, server", file=sys.stderr)
        return 2
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-c", SERVER_IMPORTS[engine]])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
