#!/usr/bin/env bash
# Build byteps-prophet:cuda (docker/Dockerfile.cuda): BytePS with GPU support against torch 2.13.0's CUDA
# build. Needs the CUDA wheels of torch (several GB, downloaded once into docker/wheels-cuda/ with pip's
# default index); the image build itself is offline. Not part of CI (docs/DEPLOY.md, "GPUs").
#
#   docker/build_cuda.sh [--engine docker|podman] [--base IMAGE] [--tag TAG] [--wheels DIR]
#                        [--skip-download] [--dry-run]
#
# 1. wheels: torch==2.13.0 from pip's default index (`pip download --isolated`: not this machine's
#    configuration, whose find-links serve the CPU build), the requirements, and the CUDA toolkit wheels
#    of torch's CUDA release (nvcc, crt, cccl, runtime: the versions torch's own metadata pins, written
#    to cuda-toolkit.txt), plus the byteps sdist from .byteps-build/dist/;
# 2. the image, with the engine's classic build; prints its size and how long the build took.
# The base (default byteps-prophet-base:bookworm) is made offline by `scripts/compose.sh base`.
# Bad arguments: one line naming them, exit 2.
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ENGINE=docker
BASE=byteps-prophet-base:bookworm
TAG=byteps-prophet:cuda
WHEELS=$ROOT/docker/wheels-cuda
DOWNLOAD=1
DRY=0
SDIST=$ROOT/.byteps-build/dist/byteps-0.2.5.post15.tar.gz
PYTHON=${PYTHON:-python3.11}

die2() { echo "build_cuda.sh: error: $*" >&2; exit 2; }
need_value() { [[ $# -ge 2 && -n $2 && $2 != --* ]] || die2 "$1 needs a value"; }
while (($#)); do
  case $1 in
    --engine) need_value "$@"; ENGINE=$2; shift 2 ;;
    --base) need_value "$@"; BASE=$2; shift 2 ;;
    --tag) need_value "$@"; TAG=$2; shift 2 ;;
    --wheels) need_value "$@"; WHEELS=$2; shift 2 ;;
    --skip-download) DOWNLOAD=0; shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die2 "unknown argument '$1'; valid: --engine --base --tag --wheels --skip-download --dry-run" ;;
  esac
done
case $ENGINE in docker|podman) ;; *) die2 "--engine '$ENGINE' is not an engine; valid: docker, podman" ;; esac
[[ -f $SDIST ]] || die2 "$SDIST does not exist; valid: run scripts/setup.sh first (it downloads the byteps sdist)"
((DRY)) || command -v "$ENGINE" >/dev/null 2>&1 || die2 "--engine $ENGINE is not installed; valid: docker, podman"

START=$(date +%s)
say() { printf '==> [%4ss] %s\n' "$(( $(date +%s) - START ))" "$*"; }
run() { if ((DRY)); then printf '    would run:'; printf ' %q' "$@"; printf '\n'; else "$@"; fi; }

# ------------------------------------------------------------------ 1. wheels
if ((DOWNLOAD)); then
  say "wheels into $WHEELS: torch 2.13.0 with CUDA (several GB), the requirements, the CUDA toolkit"
  run mkdir -p "$WHEELS"
  run "$PYTHON" -m pip download --isolated --only-binary :all: -d "$WHEELS" torch==2.13.0 -r "$ROOT/requirements.txt"
fi
if ((DRY == 0)); then
  torch_wheel=$(ls "$WHEELS"/torch-2.13.0-*.whl 2>/dev/null | grep -v '+cpu' | head -n 1 || true)
  [[ -n $torch_wheel ]] || die2 "$WHEELS has no CUDA build of torch 2.13.0 (torch-2.13.0-*.whl without +cpu); valid: run without --skip-download"
  # the CUDA toolkit wheels of torch's release: the versions its metadata pins for the runtime
  runtime=$("$PYTHON" - "$torch_wheel" <<'EOF'
import re, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    text = wheel.read(meta).decode()
found = re.search(r"^Requires-Dist: nvidia-cuda-runtime(?:-cu\d+)?==([0-9.]+)", text, re.M)
print(found.group(1) if found else "")
EOF
)
  [[ -n $runtime ]] || die2 "$torch_wheel does not pin nvidia-cuda-runtime; valid: a CUDA 13 build of torch 2.13.0"
  release=${runtime%.*}   # 13.0.96 -> 13.0: nvcc and headers of the same release
  printf '%s\n' "nvidia-cuda-runtime==$runtime" "nvidia-cuda-nvcc~=$release.0" "nvidia-cuda-crt~=$release.0" \
    "nvidia-cuda-cccl~=$release.0" > "$WHEELS/cuda-toolkit.txt"
  if ((DOWNLOAD)); then
    "$PYTHON" -m pip download --isolated --only-binary :all: -d "$WHEELS" -r "$WHEELS/cuda-toolkit.txt"
  fi
  cp "$SDIST" "$WHEELS/"
  say "wheels: $(du -sh "$WHEELS" | cut -f1); CUDA toolkit $(tr '\n' ' ' < "$WHEELS/cuda-toolkit.txt")"
else
  echo "    would write $WHEELS/cuda-toolkit.txt from the torch wheel's pins and copy $SDIST there"
fi

# ------------------------------------------------------------------ 2. image
say "image $TAG from $BASE (BytePS compiled with CUDA: the long step)"
build=("$ENGINE" build -f "$ROOT/docker/Dockerfile.cuda" --build-arg "BASE=$BASE" -t "$TAG")
[[ $ENGINE == podman ]] && build=(podman build --format docker --layers -f "$ROOT/docker/Dockerfile.cuda" --build-arg "BASE=$BASE" -t "$TAG")
began=$(date +%s)
run "${build[@]}" "$ROOT"
if ((DRY == 0)); then
  size=$("$ENGINE" image inspect --format '{{.Size}}' "$TAG")
  say "built $TAG: $((size / 1000000)) MB in $(( $(date +%s) - began ))s"
fi
