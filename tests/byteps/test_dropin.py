"""The drop-in promise, tested as users run it: unmodified byteps.torch scripts on the local cluster
with real BytePS, under BYTEPS_SCHEDULER=fifo, bytescheduler and prophet.

Every scenario of user_script.py must end with the single-process reference's parameters (to 1e-6,
wherever the script observes them) and bit-identical ones on every rank; every exit path must end as
the stock path does. The stress form (scripts/stress_pushpull.py) checks the server never loses an
update. Needs root (namespaces) and BytePS built by scripts/build_byteps.sh.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.byteps.test_byteps_cluster import needs_byteps

pytestmark = [pytest.mark.slow, needs_byteps,
              pytest.mark.skipif(os.geteuid() != 0, reason="the local cluster needs root")]

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / ".venv" / "bin" / "byteps-prophet"
SCRIPT = Path(__file__).with_name("user_script.py")
SCHEDULERS = ("fifo", "bytescheduler", "prophet")
LINE = re.compile(r"rank (\d) scenario (\w+) sum (\S+) diff (\S+)")
RUN_SECONDS = re.compile(r"torn down after ([0-9.]+)s")


def cluster_run(scheduler: str, scenario: str, timeout: float = 90) -> tuple[int, str]:
    cmd = [str(CLI), "cluster", "run", "--workers", "2", "--servers", "1", "--bandwidth", "500mbit",
           "--timeout", str(timeout), "-e", f"SCENARIO={scenario}", "--", sys.executable, str(SCRIPT)]
    proc = subprocess.run(cmd, env={**os.environ, "BYTEPS_SCHEDULER": scheduler}, cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout + 60)
    return proc.returncode, proc.stdout


def ranks(output: str) -> dict[int, tuple[str, float]]:
    return {int(m.group(1)): (m.group(3), float(m.group(4))) for m in LINE.finditer(output)}


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("scenario", ["observe", "accumulate", "fp16", "broadcast", "clip", "pushpull"])
def test_user_script_gets_stock_parameters(scenario, scheduler):
    rc, out = cluster_run(scheduler, scenario)
    tail = "\n".join(out.splitlines()[-6:])
    assert rc == 0, tail
    seen = ranks(out)
    assert sorted(seen) == [0, 1], tail
    assert seen[0][0] == seen[1][0], f"ranks ended apart: {seen}"
    assert all(diff <= 1e-6 for _, diff in seen.values()), f"left the single-process reference: {seen}"


def _run_seconds(out: str) -> float:
    found = RUN_SECONDS.findall(out)
    assert found, out[-400:]
    return float(found[-1])


@pytest.mark.parametrize("scenario", ["no_shutdown", "raise", "sigint"])
def test_exit_paths_end_as_stock_does(scenario):
    """Each scheduler's run ends within 5 s of the stock path's, the same way (success, or the failing
    worker named), with nothing left behind (the cluster's own teardown checks and reports it)."""
    stock_rc, stock = cluster_run("fifo", scenario)
    for scheduler in ("bytescheduler", "prophet"):
        rc, out = cluster_run(scheduler, scenario)
        tail = "\n".join(out.splitlines()[-4:])
        if scenario == "no_shutdown":
            assert rc == stock_rc == 0, tail
            assert sorted(ranks(out)) == [0, 1], tail
        else:
            assert rc != 0 and stock_rc != 0, tail
            assert "worker-1" in out.splitlines()[-1], tail
        assert "SIGSEGV" not in out and "SIGABRT" not in out and "terminate called" not in out, tail
        assert _run_seconds(out) <= _run_seconds(stock) + 5, f"{scheduler}: {tail}\nstock: {stock[-300:]}"


@pytest.mark.parametrize("scheduler", ["bytescheduler", "prophet"])
def test_distributed_data_parallel_is_refused_in_one_line(scheduler):
    code = ("import torch, byteps.torch.parallel as p; "
            "p.DistributedDataParallel(torch.nn.Linear(2, 2), device_ids=[0])")
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "BYTEPS_SCHEDULER": scheduler},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "DistributedOptimizer" in lines[0] and "fifo" in lines[0], proc.stderr


def test_stress_no_update_lost(tmp_path):
    """The CI form of the stress test: every scheduler, fifo twice, fresh clusters, every step checked."""
    out = tmp_path / "stress.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "stress_pushpull.py"), "--runs", "4",
                           "--backoff", "on", "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    runs = json.loads(out.read_text())["runs"]
    assert [r["scheduler"] for r in runs] == ["fifo", "bytescheduler", "prophet", "fifo"]
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert all(r["matched"] and len(r["ranks"]) == 2 for r in runs), runs


@pytest.mark.parametrize("path", ["byteps-mxnet", "kvstore"])
def test_stress_mxnet_paths(tmp_path, path):
    """The MXNet paths once under each scheduler: BytePS's DistributedTrainer, and Gluon over MXNet's
    dist_sync parameter server (wrapped by ScheduledKVStore under a scheduler), each script left to
    end on its own (no close): every step equals the reference and every worker exits cleanly."""
    out = tmp_path / "stress.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "stress_pushpull.py"), "--path", path,
                           "--runs", "3", "--steps", "100", "--backoff", "on", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    runs = json.loads(out.read_text())["runs"]
    assert [r["scheduler"] for r in runs] == list(SCHEDULERS)
    assert proc.returncode == 0 and all(r["matched"] for r in runs), runs
