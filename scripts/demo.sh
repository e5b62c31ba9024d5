#!/usr/bin/env bash
# The main job on defaults: set up (when needed), then
#   1. a REAL A/B on the local cluster: 2 PyTorch workers in network namespaces over tc-shaped
#      1 Gbit/s links (docs/RESULTS.md says why this rate), VGG-style
#      model, gloo all-reduce; FIFO, ByteScheduler (default and tuned credit) and Prophet in
#      interleaved rounds, with two references: every worker computing alone (compute_only, which
#      with the link bounds the best possible step, so the table says how close each schedule came
#      to it) and only synchronising (comm_only, the engine unscheduled); table on stdout, plot
#      out/demo_ab.png, progress on stderr. A few minutes on an idle machine; numbers from a
#      busy machine say little (docs/AB.md, "A fair comparison").
#   2. the simulated comparison (seconds): the same scheduler classes on ResNet-50, 2 workers, ring
#      all-reduce, 10 Gbit/s (docs/SIMULATOR.md).
# --sim-only skips part 1. Without root (no namespaces, so no shaped links) part 1 is skipped with a note.
set -Eeuo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REAL=1
for arg in "$@"; do
  case $arg in
    --sim-only) REAL=0 ;;
    --real) REAL=1 ;;  # the default; kept for scripts written against the earlier demo
    *) echo "demo.sh: unknown argument '$arg'; valid: --sim-only" >&2; exit 2 ;;
  esac
done
"$ROOT/scripts/setup.sh"
cd "$ROOT"
mkdir -p out
if [[ $REAL == 1 ]]; then
  if [[ $(id -u) == 0 ]] && ip netns list >/dev/null 2>&1; then
    echo "==> real A/B: vgg, torch/gloo, 2 workers, 1gbit (progress on stderr)"
    .venv/bin/byteps-prophet ab --framework torch --backend gloo --model vgg --workers 2 --bandwidth 1gbit \
      --steps 6 --warmup 3 --rounds 2 --tune-steps 2 --tune-probes 3,1 --plot out/demo_ab.png \
      --variants fifo,bytescheduler,bytescheduler_tuned,prophet,compute_only,comm_only
  else
    echo "==> real A/B skipped: needs root for network namespaces and tc (shaped links); simulation only"
  fi
fi
echo "==> simulated A/B: resnet50, 2 workers, ring all-reduce, 10gbit"
.venv/bin/byteps-prophet simulate --model resnet50 --workers 2 --arch allreduce --bandwidth 10gbit \
  --plot out/demo_sim.png --trace out/demo_sim_trace.json
echo "plot: out/demo_sim.png   trace (chrome://tracing): out/demo_sim_trace.json"
