#!/usr/bin/env bash
# Set up a fresh machine for byteps-prophet: system tools, the project's .venv (Python 3.11, the pinned
# stack in requirements.txt, this package in editable mode) and real BytePS built with our patches.
# Idempotent: a second run only checks. Used by scripts/test.sh and scripts/demo.sh.
#   SKIP_BYTEPS=1 scripts/setup.sh   # everything but the BytePS build
set -Eeuo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=$ROOT/.venv
say() { printf '==> %s\n' "$*"; }

need_apt=()
command -v ip >/dev/null || need_apt+=(iproute2)
command -v tc >/dev/null || need_apt+=(iproute2)
command -v docker-compose >/dev/null || need_apt+=(docker-compose)
[[ -e /usr/include/numa.h ]] || need_apt+=(libnuma-dev)
command -v podman >/dev/null || need_apt+=(podman runc catatonit netavark aardvark-dns)   # tests/deploy: podman kube play
if ((${#need_apt[@]})); then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    say "installing system packages: ${need_apt[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    say "warning: missing system packages (${need_apt[*]}); install them as root for cluster tests"
  fi
fi

if [[ ! -x $VENV/bin/python ]]; then
  PY=${PYTHON:-python3.11}
  command -v "$PY" >/dev/null || { echo "setup.sh: $PY not found; set PYTHON=/path/to/python3.11" >&2; exit 1; }
  say "creating $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
stamp=$VENV/.requirements.sha256
want=$(cat "$ROOT/requirements.txt" "$ROOT/setup.py" | sha256sum | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  say "installing requirements.txt (torch==2.13.0 CPU, mxnet==1.9.1, numpy<1.24, ...)"
  "$VENV/bin/python" -m pip install -q -r "$ROOT/requirements.txt"
  "$VENV/bin/python" -m pip install -q --no-deps -e "$ROOT"
  echo "$want" >"$stamp"
fi

if [[ ${SKIP_BYTEPS:-0} != 1 && -x $ROOT/scripts/build_byteps.sh ]]; then
  "$ROOT/scripts/build_byteps.sh"
fi
say "environment ready: $VENV"
