#!/usr/bin/env bash
# The GPU check, for a machine with a GPU, no network, its own CUDA build of torch and nvcc (docs/DEPLOY.md,
# "GPUs"). Under 10 minutes:
#   1. checks: the interpreter (torch with CUDA, numpy, PyYAML, setuptools), the CUDA toolkit (nvcc,
#      cuda_runtime.h), NCCL (torch's nvidia-nccl wheel unless --nccl-home), the byteps sdist;
#   2. builds the patched BytePS (patches/series) against that torch, with GPU support, into a directory
#      of its own (--site, put on PYTHONPATH): the machine's environment is not changed;
#   3. trains a small model a few steps in each configuration, each under fifo, bytescheduler and
#      prophet, and compares every worker's parameters with one process averaging the same gradients:
#      gloo with CUDA tensors, 2 processes sharing the GPU; NCCL, one process per GPU (at most 2);
#      BytePS's GPU path, 1 worker + 1 server (each host started by byteps-prophet launch).
#
#   scripts/gpu_check.sh [--python PY] [--cuda-home DIR] [--nccl-home DIR] [--site DIR] [--sdist FILE]
#                        [--jobs N] [--steps N] [--backends LIST] [--schedulers LIST] [--out DIR]
#                        [--skip-build | --build-only] [--dry-run]
#
# --dry-run runs the checks (a CPU build of torch allowed) and prints the build's environment and the
# commands of every step, running none. --build-only builds and checks the import, no training (a CPU
# build of torch allowed: BytePS's core is then built with CUDA, its PyTorch plugin without CUDA ops).
# Bad arguments: one line naming them, exit 2.
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BYTEPS_VERSION=0.2.5.post15
SDIST_SHA256=9d6a3c5be4c4b5a172739744bb32725c433f9a9f63794e1885e7376ff4eea99f
PY=python3
CUDA_DIR=${CUDA_HOME:-}
NCCL_DIR=""
SDIST=$ROOT/.byteps-build/dist/byteps-$BYTEPS_VERSION.tar.gz
JOBS=$(nproc 2>/dev/null || echo 2)
STEPS=5
BACKENDS=gloo,nccl,byteps
SCHEDULERS=fifo,bytescheduler,prophet
OUT=$ROOT/out/gpu-check
SITE=""
SKIP_BUILD=0
BUILD_ONLY=0
DRY=0

die2() { echo "gpu_check.sh: error: $*" >&2; exit 2; }
need_value() { [[ $# -ge 2 && -n $2 && $2 != --* ]] || die2 "$1 needs a value"; }
while (($#)); do
  case $1 in
    --python) need_value "$@"; PY=$2; shift 2 ;;
    --cuda-home) need_value "$@"; CUDA_DIR=$2; shift 2 ;;
    --nccl-home) need_value "$@"; NCCL_DIR=$2; shift 2 ;;
    --site) need_value "$@"; SITE=$2; shift 2 ;;
    --sdist) need_value "$@"; SDIST=$2; shift 2 ;;
    --jobs) need_value "$@"; JOBS=$2; shift 2 ;;
    --steps) need_value "$@"; STEPS=$2; shift 2 ;;
    --backends) need_value "$@"; BACKENDS=$2; shift 2 ;;
    --schedulers) need_value "$@"; SCHEDULERS=$2; shift 2 ;;
    --out) need_value "$@"; OUT=$2; shift 2 ;;
    --skip-build) SKIP_BUILD=1; shift ;;
    --build-only) BUILD_ONLY=1; shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die2 "unknown argument '$1'; valid: --python --cuda-home --nccl-home --site --sdist --jobs --steps --backends --schedulers --out --skip-build --build-only --dry-run" ;;
  esac
done
((SKIP_BUILD && BUILD_ONLY)) && die2 "--skip-build and --build-only exclude each other; valid: one of them"
[[ $JOBS =~ ^[1-9][0-9]*$ ]] || die2 "--jobs '$JOBS' is invalid; valid: an integer >= 1"
[[ $STEPS =~ ^[1-9][0-9]*$ ]] || die2 "--steps '$STEPS' is invalid; valid: an integer >= 1"
command -v "$PY" >/dev/null 2>&1 || die2 "--python '$PY' is not an interpreter here; valid: the python with a CUDA build of torch"
if [[ -z $CUDA_DIR ]]; then
  if command -v nvcc >/dev/null 2>&1; then
    # nvcc says where its toolkit is (TOP), also when the nvcc on PATH is a wrapper script
    top=$(nvcc --dryrun -v -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n 1)
    if [[ -n $top && -d $top ]]; then CUDA_DIR=$(cd "$top" && pwd)
    else CUDA_DIR=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")"); fi
  elif [[ -x /usr/local/cuda/bin/nvcc ]]; then CUDA_DIR=/usr/local/cuda; fi
fi
facts=$("$PY" -c '
import importlib.util
print("python-ok", *(m for m in ("torch", "numpy", "yaml", "setuptools") if importlib.util.find_spec(m) is None))' \
  2>/dev/null) || true
[[ $facts == python-ok* ]] || die2 "--python '$PY' is not a Python interpreter; valid: the python with a CUDA build of torch"
missing=${facts#python-ok}; missing=${missing# }
[[ -z $missing ]] || die2 "$PY lacks $missing; valid: an interpreter with torch (a CUDA build), numpy, PyYAML and setuptools"
if ((SKIP_BUILD == 0)); then
  [[ -f $SDIST ]] || die2 "--sdist $SDIST does not exist; valid: byteps-$BYTEPS_VERSION.tar.gz (scripts/setup.sh downloads it into .byteps-build/dist/; copy it along)"
  echo "$SDIST_SHA256  $SDIST" | sha256sum -c --quiet - >/dev/null 2>&1 \
    || die2 "--sdist $SDIST is not byteps-$BYTEPS_VERSION (sha256 differs)"
fi

START=$(date +%s)
say() { printf '==> [%4ss] %s\n' "$(( $(date +%s) - START ))" "$*"; }
# run CMD...: run it, or print it in a dry run
run() { if ((DRY)); then printf '    would run:'; printf ' %q' "$@"; printf '\n'; else "$@"; fi; }
SITE=${SITE:-$OUT/site}
# this package from the checkout, BytePS from --site: nothing is installed into the machine's python
export PYTHONPATH=$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}
VPY=$PY

# ------------------------------------------------------------------ 1. checks and the build's environment
SHIM=$SITE/byteps-nccl   # the build's rpath points here: it stays with the build
if ((DRY)); then SHIM=$(mktemp -d); trap 'rm -rf "$SHIM"' EXIT; fi
flags=(--shim "$SHIM" --jobs "$JOBS")
[[ -n $CUDA_DIR ]] && flags+=(--cuda-home "$CUDA_DIR")
[[ -n $NCCL_DIR ]] && flags+=(--nccl-home "$NCCL_DIR")
((DRY || BUILD_ONLY)) && flags+=(--allow-cpu-torch)
exports=$("$VPY" -m byteps_prophet.deploy.gpu flags "${flags[@]}") || exit $?
eval "$exports"
say "checks passed; the GPU build's environment:"
sed 's/^/    /' <<<"$exports"

# ------------------------------------------------------------------ 2. build
if ((SKIP_BUILD == 0)); then
  BUILD=$OUT/build
  LOGS=$OUT/logs
  ((DRY)) || mkdir -p "$LOGS"
  fail() { echo "gpu_check.sh: $1 failed; last lines of $2:" >&2; tail -n 40 "$2" >&2; exit 1; }
  say "unpack byteps $BYTEPS_VERSION and apply patches/series"
  SRC=$BUILD/byteps-$BYTEPS_VERSION
  run rm -rf "$BUILD"
  run mkdir -p "$BUILD"
  run tar -xzf "$SDIST" -C "$BUILD"
  while read -r patch; do
    [[ -z $patch ]] && continue
    if ((DRY)); then run patch -d "$SRC" -p1 --batch --forward -i "$ROOT/patches/$patch"
    else patch -d "$SRC" -p1 --batch --forward -i "$ROOT/patches/$patch" >>"$LOGS/patch.log" 2>&1 \
      || fail "patch $patch" "$LOGS/patch.log"; fi
  done < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' "$ROOT/patches/series")
  say "ps-lite and zeromq (make -j$JOBS)"
  pslite=(env -u LDFLAGS -u CFLAGS -u CXXFLAGS make -C "$SRC/3rdparty/ps-lite" -j"$JOBS" ps
          "WGET=cp -t ." "ZMQ_URL=$SRC/zeromq-4.1.4.tar.gz" "ADD_CFLAGS=$PSLITE_ADD_CFLAGS")
  if ((DRY)); then run "${pslite[@]}"; else "${pslite[@]}" >"$LOGS/ps-lite.log" 2>&1 || fail "ps-lite" "$LOGS/ps-lite.log"; fi
  say "byteps with CUDA and NCCL, the PyTorch plugin (-j$JOBS; the longest step)"
  install=("$VPY" -m pip install --no-deps --no-build-isolation --no-index --no-cache-dir --upgrade -v
           --target "$SITE" "$SRC")
  if ((DRY)); then run "${install[@]}"; else "${install[@]}" >"$LOGS/byteps.log" 2>&1 || fail "the byteps build" "$LOGS/byteps.log"; fi
  run env -u DMLC_ROLE "$VPY" -c 'import byteps.torch'
  say "built into $SITE"
fi
if ((BUILD_ONLY)); then say "done (--build-only)"; exit 0; fi

# ------------------------------------------------------------------ 3. training against the reference
say "training: $BACKENDS under $SCHEDULERS, $STEPS steps each"
run "$VPY" -m byteps_prophet.deploy.gpu run --device cuda --backends "$BACKENDS" --schedulers "$SCHEDULERS" \
  --steps "$STEPS" --out "$OUT/params"
say "done"
