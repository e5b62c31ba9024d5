#!/usr/bin/env bash
# Run docker/docker-compose.yml under a real container engine, from Debian packages, offline.
#
#   scripts/compose.sh up [COMPOSE-UP-ARGS...]  # everything below, then `up` and `down`; exits with the run's status
#   scripts/compose.sh engine                   # apt-get install docker.io docker-compose mmdebstrap; start dockerd
#   scripts/compose.sh base                     # base image byteps-prophet-base:bookworm from Debian packages (mmdebstrap)
#   scripts/compose.sh wheels                   # docker/wheels/: every wheel the image needs, from this machine's pip
#   scripts/compose.sh build                    # engine, base, wheels, then the image byteps-prophet:cpu (cached)
#   scripts/compose.sh down                     # remove the run's containers and network
#   scripts/compose.sh compare [ROUNDS]         # the same job under compose and in the netns cluster, interleaved
#
# CONTAINER_ENGINE=podman does the same with podman (runc, catatonit) and podman-compose (from PyPI,
# into /opt/podman-compose): images live in podman's own store, so it builds its own.
#
# Environment: ENGINE (byteps|mxnet), BYTEPS_SCHEDULER, LINK_BANDWIDTH, TRAIN_* ... go to the compose
# file as usual; COMPOSE_PROJECT_NAME (default byteps-prophet) names the run's containers and network;
# BYTEPS_PROPHET_IMAGE / BYTEPS_PROPHET_BASE the two images. No registry is needed: the base image is
# made with mmdebstrap from apt's Debian mirror and imported, the Python packages come from pip's own
# configuration (pip download, then `pip install --no-index` inside the build). Needs root.
set -Eeuo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
COMPOSE_FILE=$ROOT/docker/docker-compose.yml
IMAGE=${BYTEPS_PROPHET_IMAGE:-byteps-prophet:cpu}
BASE=${BYTEPS_PROPHET_BASE:-byteps-prophet-base:bookworm}
export COMPOSE_PROJECT_NAME=${COMPOSE_PROJECT_NAME:-byteps-prophet}
WHEELS=$ROOT/docker/wheels
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
# what the base image holds: Debian bookworm's python3 is 3.11; the rest builds BytePS and shapes links
BASE_PACKAGES=python3,python3-venv,python3-dev,g++,make,patch,libnuma-dev,iproute2,procps,ca-certificates,netbase
NVIDIA_PKGS=("nvidia-cuda-runtime==13.0.96" "nvidia-cuda-crt==13.0.88" "nvidia-cuda-cccl==13.0.85" "nvidia-nccl-cu13==2.32.3")
BYTEPS_SDIST=byteps-0.2.5.post15.tar.gz
CONTAINER_ENGINE=${CONTAINER_ENGINE:-docker}
case $CONTAINER_ENGINE in docker|podman) ;; *) echo "compose.sh: CONTAINER_ENGINE=$CONTAINER_ENGINE is not an engine; valid: docker, podman" >&2; exit 2 ;; esac
PODMAN_COMPOSE=/opt/podman-compose/bin/podman-compose

say() { printf '==> compose.sh: %s\n' "$*" >&2; }
die() { printf 'compose.sh: %s\n' "$*" >&2; exit "${2:-1}"; }

apt_install() {
  (($#)) || return 0
  [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null \
    || die "need $* and cannot install them (not root, or no apt-get)"
  say "apt-get install $*"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

engine() {
  local need=()
  command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
  if [[ $CONTAINER_ENGINE == podman ]]; then podman_engine "${need[@]}"; return; fi
  command -v dockerd >/dev/null || need+=(docker.io)
  command -v docker-compose >/dev/null || need+=(docker-compose)
  [[ -x /usr/bin/docker-init || -x /usr/bin/tini ]] || need+=(tini)
  apt_install "${need[@]}"
  if ! docker info >/dev/null 2>&1; then
    say "starting dockerd (log: /var/log/dockerd-byteps-prophet.log, pid in /run/byteps-prophet-dockerd.pid)"
    setsid dockerd >/var/log/dockerd-byteps-prophet.log 2>&1 < /dev/null &
    echo $! > /run/byteps-prophet-dockerd.pid
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || die "dockerd did not start; see /var/log/dockerd-byteps-prophet.log"
  fi
}

# podman from Debian with runc (crun fails on hosts with mixed cgroup v1/v2), cgroupfs, a file
# events logger, and ulimits within this host's hard limits (podman's defaults exceed them).
podman_engine() {
  local need=("$@")
  command -v podman >/dev/null || need+=(podman)
  command -v runc >/dev/null || need+=(runc)
  [[ -x /usr/libexec/podman/catatonit || -x /usr/bin/catatonit ]] || need+=(catatonit)
  apt_install "${need[@]}"
  mkdir -p /etc/containers/containers.conf.d
  # podman lowers its own process limit to 32768 before it starts conmon and runc, so runc may not
  # raise a container's above that, whatever this shell's hard limit says
  local nproc
  nproc=$(ulimit -Hu)
  [[ $nproc == unlimited || $nproc -gt 32768 ]] && nproc=32768
  cat > /etc/containers/containers.conf.d/byteps-prophet.conf <<EOF
# written by byteps-prophet scripts/compose.sh
[containers]
default_ulimits = ["nofile=$(ulimit -Hn):$(ulimit -Hn)", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
  if [[ ! -x $PODMAN_COMPOSE ]]; then
    say "podman-compose from PyPI into /opt/podman-compose"
    python3 -m venv /opt/podman-compose
    /opt/podman-compose/bin/pip install -q podman-compose
  fi
}

base() {
  if "$CONTAINER_ENGINE" image inspect "$BASE" >/dev/null 2>&1; then say "base image $BASE exists"; return; fi
  say "making $BASE with mmdebstrap (Debian bookworm: ${BASE_PACKAGES//,/ }; a few minutes)"
  local tar
  tar=$(mktemp --suffix=.tar)
  mmdebstrap --quiet --variant=minbase --include="$BASE_PACKAGES" bookworm "$tar"
  "$CONTAINER_ENGINE" import -c 'CMD ["bash"]' "$tar" "$BASE" >/dev/null
  rm -f "$tar"
}

wheels() {
  [[ -x $PYTHON ]] || PYTHON=$(command -v python3.11 || command -v python3)
  mkdir -p "$WHEELS"
  say "wheels into docker/wheels (pip download, pip's configuration: $("$PYTHON" -m pip config list 2>/dev/null | tr '\n' ' '))"
  "$PYTHON" -m pip download -qq --disable-pip-version-check -d "$WHEELS" --only-binary :all: \
    -r "$ROOT/requirements.txt" "${NVIDIA_PKGS[@]}" pip setuptools wheel
  if [[ ! -f $WHEELS/$BYTEPS_SDIST ]]; then
    if [[ -f $ROOT/.byteps-build/dist/$BYTEPS_SDIST ]]; then
      cp "$ROOT/.byteps-build/dist/$BYTEPS_SDIST" "$WHEELS/"
    else
      "$PYTHON" -m pip download -q --no-deps --no-binary :all: --no-build-isolation -d "$WHEELS" "byteps==0.2.5.post15"
    fi
  fi
  ls "$WHEELS"/torch-2.13.0+cpu-*.whl >/dev/null 2>&1 \
    || say "warning: no torch 2.13.0+cpu wheel in docker/wheels: pip found $(cd "$WHEELS" && ls torch-* 2>/dev/null || echo none)"
}

build() {
  engine
  base
  wheels
  say "building $IMAGE (cached where unchanged; the first build compiles BytePS, several minutes)"
  local start=$SECONDS
  local build=(docker build)
  [[ $CONTAINER_ENGINE == podman ]] && build=(podman build --format docker --layers)
  (cd "$ROOT" && DOCKER_BUILDKIT=0 "${build[@]}" -q -f docker/Dockerfile --build-arg BASE="$BASE" -t "$IMAGE" . >/dev/null)
  # the image this build replaced, if any (the build stage stays: it is the cache of the BytePS build)
  "$CONTAINER_ENGINE" image prune -f --filter label=byteps-prophet.image=final >/dev/null
  say "image $IMAGE ready after $((SECONDS - start))s"
}

compose() {
  if [[ $CONTAINER_ENGINE == podman ]]; then "$PODMAN_COMPOSE" -f "$COMPOSE_FILE" "$@"
  else docker-compose -f "$COMPOSE_FILE" "$@"; fi
}

down() { compose down --remove-orphans --timeout 5 >/dev/null 2>&1 || true; }

up() {
  build
  down
  trap down EXIT
  say "up: ENGINE=${ENGINE:-byteps} BYTEPS_SCHEDULER=${BYTEPS_SCHEDULER:-prophet (training)} LINK_BANDWIDTH=${LINK_BANDWIDTH:-1gbit}"
  local rc=0
  compose up --no-build --exit-code-from worker-0 "$@" || rc=$?
  say "up ended with exit status $rc"
  return "$rc"
}

# samples/s from the training JSON line of worker 0 (torch: rank 0; MXNet: the line with "leader").
samples() { "$PYTHON" -c '
import json, sys
rate = "-"
for line in sys.stdin:
    body = line.split("|", 1)[-1].strip()
    if body.startswith("{") and "samples_per_s" in body:
        row = json.loads(body)
        if row.get("leader", row.get("rank", 0) == 0):  # MXNet: the leader (its kv rank may be 1)
            rate = "%.2f" % row["samples_per_s"]
print(rate)'; }

compare() {
  local rounds=${1:-3} i out start rc
  build
  [[ -x $PYTHON ]] || die "compare needs the project's venv ($PYTHON) for the netns cluster"
  trap down EXIT
  say "compare: $rounds rounds, ENGINE=${ENGINE:-byteps}, TRAIN_MODEL=${TRAIN_MODEL:-resnet}, TRAIN_STEPS=${TRAIN_STEPS:-10}, LINK_BANDWIDTH=${LINK_BANDWIDTH:-1gbit}"
  printf '%-6s %-8s %14s %10s %6s\n' round where samples/s wall_s rc
  for ((i = 1; i <= rounds; i++)); do
    down
    start=$SECONDS; rc=0
    out=$(compose up --no-build --no-color --exit-code-from worker-0 2>&1) || rc=$?
    printf '%-6s %-8s %14s %10s %6s\n' "$i" compose "$(samples <<<"$out")" "$((SECONDS - start))" "$rc"
    down
    start=$SECONDS; rc=0
    out=$(cd "$ROOT" && "$PYTHON" -m byteps_prophet cluster run --engine "${ENGINE:-byteps}" \
          --bandwidth "${LINK_BANDWIDTH:-1gbit}" -- python -m byteps_prophet.ab.workloads.train_entrypoint 2>&1) || rc=$?
    printf '%-6s %-8s %14s %10s %6s\n' "$i" netns "$(samples <<<"$out")" "$((SECONDS - start))" "$rc"
  done
}

cmd=${1:-}
shift || true
case $cmd in
  engine|base|wheels|build|down) "$cmd" ;;
  up) up "$@" ;;
  compare) compare "$@" ;;
  -h|--help|help) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' ;;
  *) die "unknown command '${cmd}'; valid: up, engine, base, wheels, build, down, compare" 2 ;;
esac
