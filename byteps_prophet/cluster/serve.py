"""Scheduler and server roles: ``python -m byteps_prophet.cluster.serve``.

Reads ``ENGINE`` (byteps or mxnet) and replaces itself with the engine's parameter server, which
serves as scheduler or server according to ``DMLC_ROLE``:

* byteps: ``python -c 'import byteps.server'``
* mxnet:  ``python -c 'import mxnet'`` (MXNet's KVStore server starts on import when DMLC_ROLE is
  scheduler or server; workers use ``mx.kv.create('dist_sync')``)

The same command runs under Docker (docker/docker-compose.yml) and in the local cluster.
"""
from __future__ import annotations

import os
import sys

SERVER_IMPORTS = {"byteps": "import byteps.server", "mxnet": "import mxnet"}


def main() -> int:
    engine = os.environ.get("ENGINE", "byteps").strip().lower()
    role = os.environ.get("DMLC_ROLE", "")
    if engine not in SERVER_IMPORTS:
        print(f"serve: ENGINE={engine!r} is not an engine; valid: {', '.join(SERVER_IMPORTS)}", file=sys.stderr)
        return 2
    if role not in ("scheduler", "server"):
        print(f"serve: DMLC_ROLE={role!r} must be scheduler or server", file=sys.stderr)
        return 2
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-c", SERVER_IMPORTS[engine]])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
