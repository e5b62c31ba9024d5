#!/usr/bin/env bash
# The main job on defaults: set up (when needed), then the simulated A/B (part 2 below).
# scripts/demo.sh --real adds, first,
#   1. a REAL A/B on the local cluster (2 workers in network namespaces, tc-shaped 200 Mbit/s links,
#      VGG-style model, PyTorch over gloo): FIFO, ByteScheduler (default and tuned credit) and Prophet,
#      interleaved rounds, table + plot. A few minutes on an idle 2-core machine. Not the default: in
#      the real runs so far Prophet did not beat ByteScheduler robustly (docs/AB.md, "Measured").
#   2. the simulated comparison (seconds): FIFO, ByteScheduler (default and best credit), Prophet
#      (default and the paper's rule) on ResNet-50, 2 workers, ring all-reduce, 10 Gbit/s: a cell where
#      the default credit is far from the best one (docs/SIMULATOR.md) and Prophet, untuned, is not.
# Without root (no network namespaces, so no shaped links) part 1 is skipped with a note.
set -Eeuo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SIM_ONLY=1
for arg in "$@"; do
  case $arg in
    --real) SIM_ONLY=0 ;;
    --sim-only) SIM_ONLY=1 ;;
    *) echo "demo.sh: unknown argument '$arg'; valid: --real, --sim-only" >&2; exit 2 ;;
  esac
done
"$ROOT/scripts/setup.sh"
cd "$ROOT"
mkdir -p out
if [[ $SIM_ONLY == 0 ]]; then
  if [[ $(id -u) == 0 ]] && ip netns list >/dev/null 2>&1; then
    echo "==> real A/B: vgg, torch/gloo, 2 workers, 200mbit (progress on stderr)"
    .venv/bin/byteps-prophet ab --framework torch --backend gloo --model vgg --workers 2 --bandwidth 200mbit \
      --steps 6 --warmup 2 --rounds 2 --tune-steps 2 --tune-probes 3,1 --plot out/demo_ab.png
  else
    echo "==> real A/B skipped: needs root for network namespaces and tc (shaped links); simulation only"
  fi
fi
echo "==> simulated A/B: resnet50, 2 workers, ring all-reduce, 10gbit"
.venv/bin/byteps-prophet simulate --model resnet50 --workers 2 --arch allreduce --bandwidth 10gbit \
  --plot out/demo_sim.png --trace out/demo_sim_trace.json
echo "plot: out/demo_sim.png   trace (chrome://tracing): out/demo_sim_trace.json"
