#!/usr/bin/env bash
# Build real BytePS (byteps==0.2.5.post15 sdist + our patches/series) into the
# project's .venv: the server module, the PyTorch plugin and the MXNet plugin.
#
#   scripts/build_byteps.sh            build if needed (a no-op when the installed
#                                      build already matches the patches)
#   scripts/build_byteps.sh --force    rebuild even if it matches
#
# Works on a CPU-only machine: CUDA headers/libcudart and NCCL come from the
# nvidia-* wheels on PyPI, and the patched BytePS runs without a GPU
# (BYTEPS_CPU_ONLY, see docs/BYTEPS.md).
#
# Environment: BYTEPS_VENV (default <repo>/.venv), BYTEPS_BUILD_JOBS (default 2,
# the number of compilers run at once), PYTHON (to create the venv; default
# python3.11).
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${BYTEPS_VENV:-$ROOT/.venv}
CACHE=$ROOT/.byteps-build
PATCHES=$ROOT/patches
SERIES=$PATCHES/series
JOBS=${BYTEPS_BUILD_JOBS:-2}

BYTEPS_VERSION=0.2.5.post15
SDIST=byteps-$BYTEPS_VERSION.tar.gz
SDIST_SHA256=9d6a3c5be4c4b5a172739744bb32725c433f9a9f63794e1885e7376ff4eea99f
# Build dependencies from PyPI: CUDA runtime headers + libcudart, NCCL.
NVIDIA_PKGS=(
  "nvidia-cuda-runtime==13.0.96"
  "nvidia-cuda-crt==13.0.88"
  "nvidia-cuda-cccl==13.0.85"
  "nvidia-nccl-cu13==2.32.3"
)
# Bump when the way this script builds changes (flags, layout): it is part of
# the cache key together with the patches.
RECIPE=3

FORCE=0
for arg in "$@"; do
  case "$arg" in
    --force) FORCE=1 ;;
    -h|--help) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done

START=$(date +%s)
STEP="start"
LOG=""
say() { printf '==> [%4ss] %s\n' "$(( $(date +%s) - START ))" "$*"; }
step() { STEP="$1"; say "$1"; }
die() { echo "build_byteps.sh: FAILED at step '$STEP': $*" >&2; exit 1; }
on_err() {
  local rc=$?
  echo "build_byteps.sh: FAILED at step '$STEP' (exit $rc)" >&2
  if [[ -n "$LOG" && -f "$LOG" ]]; then
    echo "---- last 40 lines of $LOG ----" >&2
    tail -n 40 "$LOG" >&2
    echo "---- full log: $LOG ----" >&2
  fi
  exit "$rc"
}
trap on_err ERR
# run_logged LOGFILE CMD...: run quietly into LOGFILE (shown on failure)
run_logged() { LOG=$1; shift; "$@" >"$LOG" 2>&1; LOG=""; }

mkdir -p "$CACHE/logs" "$CACHE/dist"

# ---------------------------------------------------------------- venv
step "python venv ($VENV)"
if [[ ! -x "$VENV/bin/python" ]]; then
  PY=${PYTHON:-python3.11}
  command -v "$PY" >/dev/null || die "$PY not found (set PYTHON=...)"
  say "creating $VENV and installing requirements.txt"
  "$PY" -m venv "$VENV"
  run_logged "$CACHE/logs/requirements.log" \
    "$VENV/bin/python" -m pip install -r "$ROOT/requirements.txt"
fi
PYBIN=$VENV/bin/python
SITE=$("$PYBIN" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
VERSIONS=$("$PYBIN" -c 'import sys, importlib.metadata as m
print(sys.version.split()[0], *(m.version(p) for p in ("torch", "mxnet")))' 2>/dev/null) \
  || die "torch and mxnet must be installed in $VENV (pip install -r requirements.txt)"

# ---------------------------------------------------------------- key
step "patch series"
[[ -f "$SERIES" ]] || die "$SERIES not found"
mapfile -t SERIES_PATCHES < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' "$SERIES" | grep -v '^$' || true)
for p in "${SERIES_PATCHES[@]}"; do
  [[ -f "$PATCHES/$p" ]] || die "patches/series lists $p, which does not exist"
done
say "${#SERIES_PATCHES[@]} patches in patches/series"
KEY=$( {
  echo "recipe=$RECIPE sdist=$SDIST_SHA256 versions=$VERSIONS nvidia=${NVIDIA_PKGS[*]}"
  for p in "${SERIES_PATCHES[@]}"; do echo "== $p"; cat "$PATCHES/$p"; done
} | sha256sum | cut -c1-16)
say "build key $KEY"

STAMP=$SITE/byteps/.byteps-prophet-build
if [[ $FORCE == 0 && -f "$STAMP" && "$(cat "$STAMP")" == "$KEY" ]] \
   && ls "$SITE"/byteps/server/c_lib*.so "$SITE"/byteps/torch/c_lib*.so \
         "$SITE"/byteps/mxnet/c_lib*.so >/dev/null 2>&1; then
  say "installed byteps matches build key $KEY: nothing to do"
  exit 0
fi

# ---------------------------------------------------------------- system deps
step "system packages (libnuma-dev, g++, make, patch)"
need_apt=()
[[ -f /usr/include/numa.h ]] || need_apt+=(libnuma-dev)
command -v g++ >/dev/null || need_apt+=(g++)
command -v make >/dev/null || need_apt+=(make)
command -v patch >/dev/null || need_apt+=(patch)
if (( ${#need_apt[@]} )); then
  [[ $(id -u) == 0 ]] || die "need ${need_apt[*]}: run 'sudo apt-get install -y ${need_apt[*]}' first"
  say "apt-get install ${need_apt[*]}"
  run_logged "$CACHE/logs/apt.log" bash -c \
    "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ${need_apt[*]}"
fi

# ---------------------------------------------------------------- pip deps
step "CUDA runtime and NCCL wheels into the venv"
NV=$SITE/nvidia
if ! "$PYBIN" -m pip show -q "${NVIDIA_PKGS[@]%%==*}" >/dev/null 2>&1 \
   || [[ ! -f $NV/cu13/include/cuda_runtime.h || ! -f $NV/nccl/include/nccl.h ]]; then
  run_logged "$CACHE/logs/pip-nvidia.log" \
    "$PYBIN" -m pip install --no-deps "${NVIDIA_PKGS[@]}"
fi
# the wheels ship only versioned sonames; the linker wants the plain names
[[ -f $NV/cu13/lib/libcudart.so.13 && -f $NV/nccl/lib/libnccl.so.2 ]] \
  || die "libcudart.so.13 / libnccl.so.2 missing under $NV"
ln -sfn libcudart.so.13 "$NV/cu13/lib/libcudart.so"
ln -sfn libnccl.so.2 "$NV/nccl/lib/libnccl.so"

# ---------------------------------------------------------------- sdist
step "byteps $BYTEPS_VERSION sdist"
if [[ ! -f "$CACHE/dist/$SDIST" ]]; then
  run_logged "$CACHE/logs/download.log" \
    "$PYBIN" -m pip download --no-deps --no-binary :all: --no-build-isolation \
      -d "$CACHE/dist" "byteps==$BYTEPS_VERSION"
fi
echo "$SDIST_SHA256  $CACHE/dist/$SDIST" | sha256sum -c --quiet - \
  || die "sha256 of $CACHE/dist/$SDIST does not match"

# ---------------------------------------------------------------- source tree
step "unpack and apply patches"
SRC=$CACHE/src
rm -rf "$SRC" "$CACHE/src.tmp"
mkdir -p "$CACHE/src.tmp"
tar -xzf "$CACHE/dist/$SDIST" -C "$CACHE/src.tmp"
mv "$CACHE/src.tmp/byteps-$BYTEPS_VERSION" "$SRC"
rmdir "$CACHE/src.tmp"
for p in "${SERIES_PATCHES[@]}"; do
  STEP="apply patch $p"
  run_logged "$CACHE/logs/patch.log" patch -d "$SRC" -p1 --batch --forward -i "$PATCHES/$p"
  say "  applied $p"
done

# ---------------------------------------------------------------- ps-lite
# ps-lite + zeromq do not depend on most patches: cache them on their own key.
ABI=$("$PYBIN" -c 'import torch; print(int(torch.compiled_with_cxx11_abi()))')
PSKEY=$( {
  echo "recipe=$RECIPE sdist=$SDIST_SHA256 abi=$ABI"
  for p in "${SERIES_PATCHES[@]}"; do
    if grep -q '^+++ b/3rdparty/ps-lite/' "$PATCHES/$p"; then echo "== $p"; cat "$PATCHES/$p"; fi
  done
} | sha256sum | cut -c1-16)
PSCACHE=$CACHE/ps-lite-$PSKEY
step "ps-lite + zeromq (key $PSKEY)"
if [[ ! -f "$PSCACHE/build/libps.a" || ! -f "$PSCACHE/deps/lib/libzmq.a" ]]; then
  say "building ps-lite and the bundled zeromq-4.1.4 (make -j$JOBS, about 1-2 minutes)"
  # ps-lite's deps.mk would wget zeromq from GitHub: hand it the tarball the
  # sdist bundles instead ('cp -t . <tarball>' in place of 'wget <url>').
  run_logged "$CACHE/logs/ps-lite.log" \
    env -u LDFLAGS -u CFLAGS -u CXXFLAGS make -C "$SRC/3rdparty/ps-lite" -j"$JOBS" ps \
      WGET="cp -t ." ZMQ_URL="$SRC/zeromq-4.1.4.tar.gz" \
      ADD_CFLAGS="-D_GLIBCXX_USE_CXX11_ABI=$ABI"
  rm -rf "$PSCACHE.tmp" && mkdir -p "$PSCACHE.tmp"
  cp -a "$SRC/3rdparty/ps-lite/build" "$SRC/3rdparty/ps-lite/deps" "$PSCACHE.tmp/"
  rm -rf "$PSCACHE" && mv "$PSCACHE.tmp" "$PSCACHE"
  # drop ps-lite builds for other keys
  find "$CACHE" -maxdepth 1 -name 'ps-lite-*' ! -name "ps-lite-$PSKEY" -exec rm -rf {} +
else
  say "using cached ps-lite"
  cp -a "$PSCACHE/build" "$PSCACHE/deps" "$SRC/3rdparty/ps-lite/"
fi

# ---------------------------------------------------------------- byteps
step "compile byteps: server, PyTorch and MXNet plugins (-j$JOBS, several minutes)"
say "log: $CACHE/logs/byteps.log"
# setup.py reads these (see patches 0001 and docs/BYTEPS.md).
# CFLAGS=-g0 only appends to Python's flags: no debug info, a faster compile.
run_logged "$CACHE/logs/byteps.log" env -u LDFLAGS \
  CFLAGS="-g0" \
  BYTEPS_BUILD_JOBS="$JOBS" \
  BYTEPS_CUDA_INCLUDE="$NV/cu13/include" \
  BYTEPS_CUDA_LIB="$NV/cu13/lib" \
  BYTEPS_NCCL_HOME="$NV/nccl" \
  BYTEPS_NCCL_LINK=SHARED \
  BYTEPS_WITHOUT_TENSORFLOW=1 \
  BYTEPS_WITH_PYTORCH=1 \
  BYTEPS_WITH_MXNET=1 \
  "$PYBIN" -m pip install --no-deps --no-build-isolation --no-cache-dir -v "$SRC"

# ---------------------------------------------------------------- check
step "check the installed modules load"
for m in server torch mxnet; do
  ls "$SITE"/byteps/$m/c_lib*.so >/dev/null 2>&1 || die "byteps/$m/c_lib*.so was not built"
done
# One process per plugin: each carries its own copy of the BytePS core, and
# loading both in one process crashes at exit (see docs/BYTEPS.md).
# Importing byteps.server would start a server: load its library only.
: > "$CACHE/logs/check.log"
for probe in \
  'import ctypes, glob, os, byteps; ctypes.CDLL(glob.glob(os.path.join(os.path.dirname(byteps.__file__), "server", "c_lib*.so"))[0])' \
  'import byteps.torch' \
  'import byteps.mxnet'; do
  LOG=$CACHE/logs/check.log
  echo "\$ python -c '$probe'" >> "$LOG"
  env -u DMLC_ROLE timeout 120 "$PYBIN" -c "$probe" >> "$LOG" 2>&1
  LOG=""
done
echo "$KEY" > "$STAMP"
rm -rf "$SRC"   # the installed copy is what counts; keep the cache small
say "byteps $BYTEPS_VERSION built and installed into $VENV (key $KEY)"
