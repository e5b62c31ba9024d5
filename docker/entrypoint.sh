#!/bin/sh
# Container entrypoint of every cluster host (scheduler, server, worker):
# 1. DMLC_NODE_HOST defaults to this container's address, so ps-lite peers can reach it;
# 2. the link is shaped from LINK_BANDWIDTH / LINK_LATENCY (needs cap_add NET_ADMIN; LINK_SHAPING=0
#    leaves it alone) by the same code the local cluster uses (byteps_prophet.cluster.linkshape);
# 3. the role's command (the compose service's `command`) replaces this shell.
set -eu
if [ -z "${DMLC_NODE_HOST:-}" ]; then
    DMLC_NODE_HOST=$(hostname -i | awk '{print $1}')
    export DMLC_NODE_HOST
fi
if [ -z "${BYTEPS_CPU_ONLY:-}" ]; then
    if [ "${CUDA:-0}" = 1 ]; then BYTEPS_CPU_ONLY=0; else BYTEPS_CPU_ONLY=1; fi
    export BYTEPS_CPU_ONLY
fi
python -m byteps_prophet.cluster.linkshape
exec "$@"
