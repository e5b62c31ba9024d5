"""scripts/late_worker.py: misuse is one line and exit 2 before any cluster starts."""
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "late_worker.py"


def test_a_bad_or_unshaped_bandwidth_is_one_line_and_exit_2():
    for value, culprit in (("fast", "'fast' is not a rate"), ("none", "needs a shaped link")):
        proc = subprocess.run([sys.executable, str(SCRIPT), "--bandwidth", value], capture_output=True, text=True,
                              timeout=60)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and culprit in lines[0], proc.stderr
