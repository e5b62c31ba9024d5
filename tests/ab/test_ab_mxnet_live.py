"""A tiny real MXNet A/B on the cluster: `byteps-prophet ab --framework mxnet --backend kvstore --json`."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("mxnet")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ab_mxnet_kvstore_json_contract(tmp_path):
    png = tmp_path / "ab.png"
    proc = subprocess.run([sys.executable, "-m", "byteps_prophet", "ab", "--framework", "mxnet", "--backend", "kvstore",
                           "--model", "mlp", "--batch", "8", "--steps", "3", "--warmup", "1", "--rounds", "1",
                           "--tune-probes", "2,0", "--tune-steps", "1", "--bandwidth", "200mbit", "--timeout", "240",
                           "--json", "--plot", str(png)],
                          capture_output=True, text=True, timeout=560,
                          env={**os.environ, "MXNET_CPU_WORKER_NTHREADS": "1"})  # MXNet's default, named
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    assert data["config"]["framework"] == "mxnet" and data["config"]["backend"] == "kvstore"
    assert data["environment"]["MXNET_CPU_WORKER_NTHREADS"] == "1"
    for name in ("fifo", "bytescheduler", "bytescheduler_tuned", "prophet"):
        result = data["results"][name]
        assert result["samples_per_s"] > 0
        assert result["spread"] >= 0
    # the tuned variant really ran with the credit the tuning job found
    tuning = data["tuning"]
    lo, hi = tuning["credit_bounds"]
    assert lo <= tuning["best_credit"] <= hi and len(tuning["probes"]) == 2
    tuned = [r for r in data["runs"] if r["variant"] == "bytescheduler_tuned"]
    assert tuned and all(r["credit"] == tuning["best_credit"] for r in tuned)
    assert all(r["framework"] == "mxnet" and r["scheduler"] in ("fifo", "bytescheduler", "prophet") for r in data["runs"])
    assert png.exists() and png.stat().st_size > 0
    assert "ab:" in proc.stderr  # the progress bar
