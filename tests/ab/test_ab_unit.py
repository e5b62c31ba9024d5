"""A/B runner pieces that need no cluster."""
import json

import pytest

from byteps_prophet.ab.report import figure, format_table, link_bytes_per_step, plot
from byteps_prophet.ab.runner import ABConfig, ABRunner, bench_command, parse_result, run_environment, variant_env
from byteps_prophet.errors import UserError


def test_variant_env():
    assert variant_env("fifo", None) == {"BYTEPS_SCHEDULER": "fifo"}
    assert variant_env("bytescheduler", 5) == {"BYTEPS_SCHEDULER": "bytescheduler"}
    assert variant_env("bytescheduler_tuned", 123) == {"BYTEPS_SCHEDULER": "bytescheduler", "BYTESCHEDULER_CREDIT": "123"}
    with pytest.raises(UserError):
        variant_env("bytescheduler_tuned", None)


def test_parse_result_takes_the_json_line():
    lines = ["#progress 1", "noise {", json.dumps({"samples_per_s": 12.5, "rank": 0}), "trailing"]
    assert parse_result(lines)["samples_per_s"] == 12.5
    assert parse_result(["nothing"]) is None


@pytest.mark.parametrize("kwargs, match", [
    (dict(framework="jax"), "--framework"),
    (dict(framework="torch", backend="kvstore"), "--backend"),
    (dict(framework="mxnet", backend="gloo"), "--backend"),
    (dict(workers=1), "--workers"),
    (dict(warmup=-1), "--warmup"),
    (dict(bandwidth="100"), "100"),
    (dict(width=0), "--width 0 is invalid"),
    (dict(framework="mxnet", backend="kvstore", model="resnet", width=0.5), "valid: --width 1.0, or --model vgg"),
])
def test_config_errors_are_one_line(kwargs, match):
    with pytest.raises(UserError, match=match) as err:
        ABConfig(**kwargs).validate()
    assert "\n" not in str(err.value)


def test_bench_command_contract():
    cfg = ABConfig(framework="mxnet", backend="kvstore", model="resnet", steps=7, batch=4)
    argv = bench_command(cfg)
    assert argv[1:3] == ["-m", "byteps_prophet.ab.workloads.mxnet_bench"]
    assert argv[argv.index("--steps") + 1] == "7" and argv[argv.index("--backend") + 1] == "kvstore"
    assert argv[argv.index("--width") + 1] == "1.0"  # both frameworks' benches take --width
    assert "--progress" in bench_command(ABConfig(), progress=True)


def test_summary_table_and_plot(tmp_path):
    runner = ABRunner.__new__(ABRunner)
    runner.cfg = ABConfig(rounds=2)
    runner.tuning = {"best_credit": 1000, "probes": [[1000, 0.1]], "credit_bounds": [1, 2]}
    runner.warnings = []
    runner.environment = {}
    runner.runs = [{"variant": v, "round": r, "samples_per_s": s}
                   for r, row in enumerate([(100, 110, 115, 130), (90, 100, 120, 126)])
                   for v, s in zip(("fifo", "bytescheduler", "bytescheduler_tuned", "prophet"), row)]
    summary = runner.summary()
    assert summary["results"]["fifo"]["samples_per_s"] == 95
    assert summary["results"]["prophet"]["spread"] == 4
    assert summary["speedups"]["prophet/bytescheduler"]["median"] == pytest.approx((130 / 110 + 126 / 100) / 2)
    json.dumps(summary)
    assert "prophet" in format_table(summary)
    plot(summary, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_the_results_name_the_environment_every_run_inherits():
    caller = {"MXNET_CPU_WORKER_NTHREADS": "2", "OMP_NUM_THREADS": "1", "BYTEPS_PROPHET_ATOM_ELEMENTS": "1000000",
              "BYTESCHEDULER_CREDIT": "5", "BYTEPS_SCHEDULER": "prophet", "BYTEPS_SERVER_ENGINE_THREAD": "4",
              "HOME": "/root"}
    # BYTEPS_SCHEDULER is each variant's own; other BYTEPS_ variables never reach the roles (scrubbed)
    expected = {"BYTESCHEDULER_CREDIT": "5", "MXNET_CPU_WORKER_NTHREADS": "2", "OMP_NUM_THREADS": "1",
                "BYTEPS_PROPHET_ATOM_ELEMENTS": "1000000"}
    assert run_environment(caller) == expected
    runner = _summary_runner(ABConfig(rounds=1), [{"fifo": 10.0}])
    runner.environment = expected
    summary = runner.summary()
    assert json.loads(json.dumps(summary))["environment"] == expected
    assert "environment: BYTESCHEDULER_CREDIT=5 MXNET_CPU_WORKER_NTHREADS=2 OMP_NUM_THREADS=1" in format_table(summary)
    runner.environment = {}
    assert "environment" not in format_table(runner.summary())


def test_without_namespaces_an_ab_run_stops_naming_no_netns(monkeypatch, capsys):
    """No silent loopback: an unshaped run would be reported as one at --bandwidth."""
    from byteps_prophet import cli
    from byteps_prophet.cluster import netns

    monkeypatch.setattr(netns, "unavailable_reason", lambda: "network namespaces need root (test)")
    assert cli.main(["ab", "--model", "mlp", "--steps", "1", "--rounds", "1", "--no-tune"]) == 2
    err = capsys.readouterr().err
    assert "byteps-prophet ab: error: cannot build a namespace cluster" in err and "--no-netns" in err


def test_cli_variants_error_is_one_line_exit_2():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "byteps_prophet", "ab", "--variants", "fifo,nope"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "--variants" in proc.stderr and "bytescheduler_tuned" in proc.stderr and "compute_only" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_record_sets_profile_and_trace_paths(tmp_path):
    cfg = ABConfig(record=str(tmp_path / "rec"), tune=False, rounds=1)
    runner = ABRunner(cfg)

    class Result:
        ok, reason, elapsed, failed = True, "", 1.0, None
        output = {"worker-0": [json.dumps({"samples_per_s": 3.0})]}

    class FakeCluster:  # the runner's only contact with the cluster in _one(): run() and its env
        use_netns = False
        seen = {}

        def host(self, name):
            raise AssertionError("no host lookup without namespaces")

        def run(self, command, env, timeout, output):
            FakeCluster.seen = env
            return Result()

    runner._env = lambda variant: {}
    data = runner._one(FakeCluster(), "prophet", tag="_r0")
    assert FakeCluster.seen["BYTEPS_PROPHET_PROFILE"] == str(tmp_path / "rec" / "prophet_r0.profile.json")
    assert FakeCluster.seen["BYTEPS_PROPHET_TRACE"] == str(tmp_path / "rec" / "prophet_r0.trace.json")
    assert data["recorded"]["trace"].endswith("prophet_r0.trace.json") and data["samples_per_s"] == 3.0


@pytest.mark.parametrize("warmup, variants, warned", [(2, ("fifo", "prophet"), True), (3, ("fifo", "prophet"), False),
                                                     (0, ("fifo", "bytescheduler"), False)])
def test_warns_when_warmup_ends_inside_prophets_profiling(warmup, variants, warned, monkeypatch):
    monkeypatch.delenv("PROPHET_PROFILE_ITERATIONS", raising=False)  # the default: 3
    runner = ABRunner(ABConfig(warmup=warmup, variants=variants), log=lambda message: None)
    assert any("--warmup" in w and "profiling (3 iterations" in w for w in runner.warnings) == warned


def _summary_runner(cfg, rows, netns=True):
    runner = ABRunner.__new__(ABRunner)
    runner.cfg, runner.tuning, runner.warnings, runner.netns, runner.environment = cfg, None, [], netns, {}
    runner.runs = [dict(variant=v, round=r, samples_per_s=s, param_bytes=40_000_000)
                   for r, row in enumerate(rows) for v, s in row.items()]
    return runner


def test_limit_is_the_slower_of_compute_alone_and_the_link(tmp_path):
    # gloo, 2 workers: 2(n-1)/n x 40 MB = 40 MB per step on each link; at 1 Gbit/s 0.32 s -> 32 / 0.32 = 100/s
    cfg = ABConfig(workers=2, batch=16, bandwidth="1gbit", rounds=2, variants=("fifo", "prophet", "compute_only"))
    rows = [{"fifo": 60, "prophet": 66, "compute_only": 80}, {"fifo": 62, "prophet": 70, "compute_only": 84}]
    limit = _summary_runner(cfg, rows).summary()["limit"]
    assert limit["link_bytes_per_step"] == 40_000_000
    assert limit["link_samples_per_s"] == pytest.approx(100)
    assert limit["compute_samples_per_s"] == 82 and limit["samples_per_s"] == 82
    assert limit["share"] == {"fifo": pytest.approx(61 / 82), "prophet": pytest.approx(68 / 82)}
    # a slow link sets the limit instead: 200 Mbit/s -> 20/s
    cfg.bandwidth = "200mbit"
    summary = _summary_runner(cfg, rows).summary()
    assert summary["limit"]["samples_per_s"] == pytest.approx(20)
    assert "limit: 20.00 samples/s" in format_table(summary)
    plot(summary, str(tmp_path / "limit.png"))
    # nothing to say without compute_only runs and without shaping
    assert _summary_runner(cfg, [{"fifo": 1}], netns=False).summary()["limit"] is None


def test_communication_alone_is_a_reference_not_a_bound():
    """comm_only is the engine's unscheduled synchronisation, which a schedule can pass: it never sets
    the limit, even when it is the slowest of the references."""
    cfg = ABConfig(workers=2, batch=16, bandwidth="1gbit", rounds=1, variants=("prophet", "compute_only", "comm_only"))
    summary = _summary_runner(cfg, [{"prophet": 60, "compute_only": 90, "comm_only": 55}]).summary()
    limit = summary["limit"]
    assert "comm_samples_per_s" not in limit and limit["samples_per_s"] == 90
    assert limit["share"] == {"prophet": pytest.approx(60 / 90)}
    assert summary["results"]["comm_only"]["samples_per_s"] == 55 and summary["warnings"] == []


def test_a_variant_above_the_limit_is_a_defect_of_the_tool_not_a_share(tmp_path):
    """The d8168e0 case: ByteScheduler and Prophet ran faster than communication alone, and the link
    bound held. Here the link is the binding bound and a variant passes it: that is a warning naming
    the variant and the bounds, and no share above 100% is reported anywhere."""
    # byteps, 2 workers: the server's link carries 2 x 40 MB per step; at 200 Mbit/s 3.2 s -> 32 / 3.2 = 10/s
    cfg = ABConfig(backend="byteps", workers=2, batch=16, bandwidth="200mbit", rounds=2,
                   variants=("bytescheduler", "prophet", "compute_only", "comm_only"))
    rows = [{"bytescheduler": 6.9, "prophet": 10.5, "compute_only": 40, "comm_only": 6.0},
            {"bytescheduler": 6.9, "prophet": 10.7, "compute_only": 42, "comm_only": 5.9}]
    summary = _summary_runner(cfg, rows).summary()
    limit = summary["limit"]
    assert limit["link_samples_per_s"] == pytest.approx(10) and limit["samples_per_s"] == pytest.approx(10)
    assert limit["share"] == {"bytescheduler": pytest.approx(0.69)}
    [defect] = summary["warnings"]
    assert defect.startswith("limit defect: prophet ran 10.60 samples/s, 106% of the limit 10.00")
    assert "link 10.00" in defect and "\n" not in defect
    table = format_table(summary)
    assert "reached: bytescheduler 69%" in table and "prophet 106%" not in table.split("warning:")[0]
    assert f"warning: {defect}" in table
    # pooling finds the defect again without saying it twice
    from byteps_prophet.ab.report import pool

    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path in paths:
        path.write_text(json.dumps(summary))
    pooled = pool([str(path) for path in paths])
    assert len(pooled["warnings"]) == 1 and pooled["warnings"][0].startswith("limit defect: prophet ran 10.60")


def test_the_limit_is_the_least_bound_and_ignores_references_in_shares():
    cfg = ABConfig(workers=2, batch=16, bandwidth="1gbit", rounds=1, variants=("fifo", "compute_only"))
    limit = _summary_runner(cfg, [{"fifo": 50, "compute_only": 120}]).summary()["limit"]
    assert limit["samples_per_s"] == pytest.approx(100)  # the link (100/s) below compute alone (120/s)
    assert set(limit["share"]) == {"fifo"}
    # without shaping only compute alone bounds
    limit = _summary_runner(cfg, [{"fifo": 50, "compute_only": 120}], netns=False).summary()["limit"]
    assert limit["samples_per_s"] == 120 and "link_samples_per_s" not in limit


def test_comm_only_runs_the_real_backend_without_compute():
    with pytest.raises(UserError, match="comm_only needs --backend kvstore") as err:
        ABConfig(framework="mxnet", backend="byteps", variants=("fifo", "comm_only")).validate()
    assert "compute_only" in str(err.value)
    ABConfig(framework="mxnet", backend="kvstore", variants=("fifo", "comm_only")).validate()
    argv = bench_command(ABConfig(backend="byteps"), variant="comm_only")
    assert "--comm-only" in argv and argv[argv.index("--backend") + 1] == "byteps"
    assert variant_env("comm_only", None) == {"BYTEPS_SCHEDULER": "fifo"}


def test_link_bytes_per_step_by_backend():
    assert link_bytes_per_step(ABConfig(backend="gloo", workers=4), 100) == 150  # ring: 2(n-1)/n
    assert link_bytes_per_step(ABConfig(framework="mxnet", backend="kvstore", workers=3), 100) == 300  # one server


def test_compute_only_runs_every_worker_alone_and_counts_them_all():
    cfg = ABConfig(workers=3, tune=False, rounds=1, bandwidth_schedule=["200mbit"])
    runner = ABRunner(cfg)

    class Result:
        ok, reason, elapsed, failed = True, "", 1.0, None
        output = {"worker-0": [json.dumps({"samples_per_s": 5.0, "world_size": 1})]}

    class FakeCluster:
        use_netns = False
        seen = {}

        def run(self, command, env, timeout, output):
            FakeCluster.seen = {"command": command, "env": env}
            return Result()

    data = runner._one(FakeCluster(), "compute_only", tag="_r0")
    command = FakeCluster.seen["command"]
    assert command[command.index("--backend") + 1] == "local" and "--progress" not in command
    assert FakeCluster.seen["env"]["BYTEPS_SCHEDULER"] == "fifo" and "MASTER_ADDR" not in FakeCluster.seen["env"]
    assert data["samples_per_s"] == 15.0


def test_prophet_fused_and_unfused_differ_only_in_the_fusion_setting_the_plugins_read():
    from byteps_prophet.core import Settings

    fused, unfused = variant_env("prophet_fused", None), variant_env("prophet_unfused", None)
    assert fused.pop("BYTEPS_PROPHET_FUSE") == "1" and unfused.pop("BYTEPS_PROPHET_FUSE") == "0"
    assert fused == unfused == variant_env("prophet", None)
    settings = {name: Settings.from_env({**variant_env(name, None)}) for name in ("prophet_fused", "prophet_unfused")}
    assert settings["prophet_fused"].fuse and not settings["prophet_unfused"].fuse
    assert settings["prophet_fused"].scheduler == settings["prophet_unfused"].scheduler == "prophet"


def test_the_plots_variant_labels_do_not_overlap():
    """The demo's six variants (its names the longest) fit side by side under their bars."""
    variants = ("fifo", "bytescheduler", "bytescheduler_tuned", "prophet", "compute_only", "comm_only")
    cfg = ABConfig(workers=2, batch=16, bandwidth="1gbit", rounds=1, variants=variants)
    fig = figure(_summary_runner(cfg, [{v: 50 + i for i, v in enumerate(variants)}]).summary())
    fig.canvas.draw()
    boxes = [label.get_window_extent() for label in fig.axes[0].get_xticklabels()]
    assert len(boxes) == len(variants)
    assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:])), [(b.x0, b.x1) for b in boxes]


def test_importing_the_runner_loads_no_framework():
    """The runner names its workloads by import; torch and mxnet load only when a benchmark runs."""
    import subprocess
    import sys

    code = ("import sys, byteps_prophet.ab.runner, byteps_prophet.ab.workloads.train_entrypoint; "
            "print(sorted(m for m in ('torch', 'mxnet') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc
