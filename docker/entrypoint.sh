#!/bin/sh
# Container entrypoint of every cluster host (scheduler, server, worker):
# 1. DMLC_NODE_HOST defaults to this container's address, so ps-lite peers can reach it;
# 2. the scheduler binds its own address: ps-lite binds the scheduler to DMLC_PS_ROOT_URI, and zmq
#    reads a host name there ("scheduler") as an interface name ("No such device" / "bind
#    failed"), so a name is resolved to this container's address first (what the name stands for,
#    on the cluster network only; both ps-lites, BytePS' and MXNet's, accept an address);
# 3. the link is shaped from LINK_BANDWIDTH / LINK_LATENCY (needs cap_add NET_ADMIN; LINK_SHAPING=0
#    leaves it alone) by the same code the local cluster uses (byteps_prophet.cluster.container_shaping);
# 4. the role's command (the compose service's `command`) runs under the agent
#    (byteps_prophet.cluster.agent), which ends the whole run when any role fails and names it;
#    CLUSTER_AGENT=0, or no DMLC_ROLE, runs the command alone.
set -eu
if [ -z "${DMLC_NODE_HOST:-}" ]; then
    DMLC_NODE_HOST=$(hostname -i | awk '{print $1}')
    export DMLC_NODE_HOST
fi
if [ "${DMLC_ROLE:-}" = scheduler ] && [ -n "${DMLC_PS_ROOT_URI:-}" ]; then
    case "$DMLC_PS_ROOT_URI" in
        *[!0-9.]*)
            address=$(getent ahostsv4 "$DMLC_PS_ROOT_URI" | awk 'NR == 1 {print $1}')
            if [ -z "$address" ]; then
                echo "entrypoint: DMLC_PS_ROOT_URI=$DMLC_PS_ROOT_URI does not resolve; the scheduler cannot bind it" >&2
                exit 2
            fi
            DMLC_PS_ROOT_URI=$address
            export DMLC_PS_ROOT_URI ;;
    esac
fi
if [ -z "${BYTEPS_CPU_ONLY:-}" ]; then
    if [ "${CUDA:-0}" = 1 ]; then BYTEPS_CPU_ONLY=0; else BYTEPS_CPU_ONLY=1; fi
    export BYTEPS_CPU_ONLY
fi
python -m byteps_prophet.cluster.container_shaping
if [ -n "${DMLC_ROLE:-}" ] && [ "${CLUSTER_AGENT:-1}" != 0 ]; then
    exec python -m byteps_prophet.cluster.agent "$@"
fi
exec "$@"
