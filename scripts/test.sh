#!/usr/bin/env bash
# Set up (when needed) and run the whole test suite, slow cluster tests included.
#   scripts/test.sh                 # everything
#   scripts/test.sh -m "not slow"   # the quick part; any pytest arguments pass through
set -Eeuo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$ROOT/scripts/setup.sh"
cd "$ROOT"
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
