"""A tiny real A/B on the cluster (namespaces when root, loopback otherwise)."""
import json
import subprocess
import sys

import pytest


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ab_json_contract(tmp_path):
    png = tmp_path / "ab.png"
    proc = subprocess.run([sys.executable, "-m", "byteps_prophet", "ab", "--model", "mlp", "--steps", "3",
                           "--warmup", "1", "--rounds", "1", "--tune-probes", "2,0", "--tune-steps", "1",
                           "--bandwidth", "200mbit", "--json", "--plot", str(png)],
                          capture_output=True, text=True, timeout=850)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in ("fifo", "bytescheduler", "bytescheduler_tuned", "prophet"):
        assert data["results"][name]["samples_per_s"] > 0
        assert "spread" in data["results"][name]
    assert png.exists()
