"""scripts/demo.sh: argument handling (the demo itself is the real A/B, run by hand or in the A/B tests)."""
import subprocess
from pathlib import Path

DEMO = Path(__file__).resolve().parents[1] / "scripts" / "demo.sh"


def test_unknown_argument_is_one_line_exit_2_before_any_setup():
    proc = subprocess.run(["bash", str(DEMO), "--fast"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["demo.sh: unknown argument '--fast'; valid: --sim-only"]
    assert proc.stdout == ""  # setup.sh never ran
