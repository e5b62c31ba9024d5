#!/usr/bin/env bash
# The main job on defaults: set up (when needed), then an A/B comparison of FIFO, ByteScheduler
# (default and best credit) and Prophet (default and the paper's rule), with a table and a plot.
set -Eeuo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$ROOT/scripts/setup.sh"
cd "$ROOT"
mkdir -p out
.venv/bin/byteps-prophet simulate --model resnet50 --workers 8 --arch ps --bandwidth 3gbit \
  --plot out/demo_sim.png --trace out/demo_sim_trace.json
echo "plot: out/demo_sim.png   trace (chrome://tracing): out/demo_sim_trace.json"
