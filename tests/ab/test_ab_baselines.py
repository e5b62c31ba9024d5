"""The A/B's baselines, what a torch user runs instead: DDP (default and tuned bucket) and BytePS's own optimizer."""
import json
import socket
import subprocess
import sys

import pytest

from byteps_prophet.ab.report import format_table
from byteps_prophet.ab.runner import ABConfig, ABRunner, bench_command, parse_result, variant_env
from byteps_prophet.errors import UserError


def test_bench_commands_of_the_baselines():
    cfg = ABConfig(tune_probe_steps=2, bucket_sweep="1,25")
    ddp = bench_command(cfg, variant="ddp")
    assert "--ddp" in ddp and "--bucket-mb" not in ddp  # DDP's own default bucket
    tuned = bench_command(cfg, variant="ddp_tuned", bucket_mb=5.0)
    assert tuned[tuned.index("--bucket-mb") + 1] == "5"
    sweep = bench_command(cfg, variant="ddp", tune_bucket=True)
    assert sweep[sweep.index("--tune-bucket") + 1] == "2" and sweep[sweep.index("--bucket-sweep") + 1] == "1,25"
    assert "--ddp" not in sweep
    with pytest.raises(UserError, match="ddp_tuned needs a tuned bucket"):
        bench_command(cfg, variant="ddp_tuned")
    stock = bench_command(ABConfig(backend="byteps"), variant="byteps_stock")
    assert "--stock-byteps" in stock and stock[stock.index("--backend") + 1] == "byteps"
    for name in ("ddp", "ddp_tuned", "byteps_stock"):
        assert variant_env(name, None) == {"BYTEPS_SCHEDULER": "fifo"}


@pytest.mark.parametrize("kwargs, match", [
    (dict(backend="byteps", variants=("fifo", "ddp")), "ddp needs --framework torch --backend gloo"),
    (dict(backend="gloo", variants=("byteps_stock",)), "byteps_stock needs --framework torch --backend byteps"),
    (dict(framework="mxnet", backend="kvstore", variants=("ddp_tuned",)), "ddp_tuned needs"),
    (dict(variants=("ddp_tuned",), bucket_sweep="1,x"), "--bucket-sweep '1,x' is invalid"),
    (dict(variants=("ddp_tuned",), bucket_sweep="0"), "--bucket-sweep '0' is invalid"),
])
def test_a_baseline_on_the_wrong_backend_is_one_line(kwargs, match):
    with pytest.raises(UserError, match=match) as err:
        ABConfig(**kwargs).validate()
    assert "\n" not in str(err.value)


def test_the_sweep_runs_first_and_the_tuned_runs_get_its_bucket():
    cfg = ABConfig(tune=False, rounds=2, variants=("prophet", "ddp", "ddp_tuned"), bucket_sweep="1,5")
    runner = ABRunner(cfg, log=lambda msg: None)
    commands = []

    class Result:
        ok, reason, elapsed, failed = True, "", 1.0, None

        def __init__(self, line):
            self.output = {"worker-0": [json.dumps(line)]}

    class FakeCluster:
        use_netns = True

        def tcp_congestion(self):
            return "cubic"

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def run(self, command, env, timeout, output):
            commands.append(command)
            if "--tune-bucket" in command:
                return Result({"best_bucket_mb": 5.0, "probes": [[1.0, 0.3], [5.0, 0.2]]})
            rate = 10.0 if "--ddp" not in command else 8.0 if "--bucket-mb" not in command else 9.0
            return Result({"samples_per_s": rate})

    runner._cluster = lambda: FakeCluster()
    summary = runner.run()
    assert "--tune-bucket" in commands[0]
    tuned = [c for c in commands if "--bucket-mb" in c]
    assert len(tuned) == 2 and all(c[c.index("--bucket-mb") + 1] == "5" for c in tuned)
    assert summary["ddp_tuning"]["best_bucket_mb"] == 5.0
    assert summary["speedups"]["prophet/ddp"]["median"] == pytest.approx(10 / 8)
    assert summary["speedups"]["ddp_tuned/ddp"]["median"] == pytest.approx(9 / 8)
    table = format_table(summary)
    assert "ddp_tuned bucket: 5 MB" in table and "1 MB 0.300 s" in table
    assert parse_result([json.dumps({"best_bucket_mb": 2.0})])["best_bucket_mb"] == 2.0


def _bench(*args, env=None):
    import os

    with socket.socket() as probe:  # a free port: two suites at once must not share a rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base = dict(os.environ, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return subprocess.run([sys.executable, "-m", "byteps_prophet.ab.workloads.torch_bench", "--model", "mlp", "--steps", "2",
                           "--warmup", "1", *args], capture_output=True, text=True, timeout=300, env={**base, **(env or {})})


def test_bench_ddp_on_a_real_gloo_group_of_one():
    proc = _bench("--backend", "gloo", "--ddp", "--bucket-mb", "0.01")
    assert proc.returncode == 0, proc.stderr[-1500:]
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    assert data["scheduler"] == "ddp" and data["bucket_mb"] == 0.01 and data["samples_per_s"] > 0


@pytest.mark.parametrize("args, match", [
    (("--backend", "local", "--ddp"), "--ddp needs a torch.distributed backend"),
    (("--backend", "gloo", "--ddp", "--bucket-mb", "-1"), "--bucket-mb -1 is invalid"),
    (("--backend", "gloo", "--tune-bucket", "1", "--bucket-sweep", "a"), "--bucket-sweep 'a' is invalid"),
    (("--backend", "local", "--stock-byteps"), "--stock-byteps needs --backend byteps"),
])
def test_bench_misuse_is_one_line_exit_2(args, match):
    proc = _bench(*args)
    assert proc.returncode == 2 and match in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ab_ddp_on_the_cluster(tmp_path):
    """Real DDP beside Prophet on the cluster: the sweep's bucket is one it tried, every run reports."""
    proc = subprocess.run([sys.executable, "-m", "byteps_prophet", "ab", "--model", "mlp", "--steps", "3",
                           "--warmup", "3", "--rounds", "1", "--no-tune", "--tune-steps", "1", "--bucket-sweep",
                           "0.01,1", "--bandwidth", "200mbit", "--variants", "prophet,ddp,ddp_tuned", "--json"],
                          capture_output=True, text=True, timeout=850)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    assert data["ddp_tuning"]["best_bucket_mb"] in (0.01, 1.0)
    assert [p[0] for p in data["ddp_tuning"]["probes"]] == [0.01, 1.0]
    for name in ("prophet", "ddp", "ddp_tuned"):
        assert data["results"][name]["samples_per_s"] > 0
    assert {run["bucket_mb"] for run in data["runs"] if run["variant"] == "ddp"} == {25.0}


def _byteps_built() -> bool:
    import glob
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("byteps")
    return bool(spec and spec.submodule_search_locations
                and glob.glob(str(Path(list(spec.submodule_search_locations)[0]) / "torch" / "c_lib*.so")))


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(not _byteps_built(), reason="byteps is not built: run scripts/build_byteps.sh")
def test_ab_byteps_stock_runs_bytepss_own_optimizer():
    proc = subprocess.run([sys.executable, "-m", "byteps_prophet", "ab", "--backend", "byteps", "--model", "mlp",
                           "--steps", "3", "--warmup", "1", "--rounds", "1", "--no-tune", "--bandwidth", "200mbit",
                           "--variants", "fifo,byteps_stock", "--json"], capture_output=True, text=True, timeout=850)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    stock = [run for run in data["runs"] if run["variant"] == "byteps_stock"]
    assert stock[0]["optimizer"].startswith("byteps.torch.") and stock[0]["samples_per_s"] > 0
    assert "optimizer" not in [run for run in data["runs"] if run["variant"] == "fifo"][0]  # byteps_prophet's own
