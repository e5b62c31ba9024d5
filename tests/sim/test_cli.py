"""The simulate command as a user runs it: JSON contract, files, one-line errors with exit 2."""
import json
import subprocess
import sys

import pytest

from byteps_prophet.cli import main


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "byteps_prophet", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_json_reports_every_variant_with_the_bound(capsys, tmp_path, perfetto_check):
    trace, png = tmp_path / "t.json", tmp_path / "p.png"
    assert main(["simulate", "--model", "alexnet", "--workers", "2", "--bandwidth", "3gbit", "--iterations", "12",
                 "--json", "--trace", str(trace), "--plot", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "alexnet" and out["tensors"] == 16 and out["params"] == 61_100_840
    assert set(out["results"]) == {"fifo", "bytescheduler", "bytescheduler_best", "prophet", "prophet_paper"}
    best = out["results"]["bytescheduler_best"]
    assert best["credit"] > 0 and best["iter_ms"] == min(out["credit_sweep_ms"].values())
    assert all(r["iter_ms"] >= out["lower_bound_ms"] * 0.999 for r in out["results"].values())
    perfetto_check(trace)  # the plugins' one trace format
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["cat"] for e in events if e["ph"] == "X"} >= {"comm", "compute"}
    assert len({e["pid"] for e in events}) == len(out["results"])  # one process per scheduler
    assert png.stat().st_size > 1000


def test_profile_replay(capsys, tmp_path):
    from byteps_prophet.profile import ProfileRecorder, ProfileTensor

    tensors = [ProfileTensor(f"w{i}", (256, 256), "float32") for i in range(4)]
    rec = ProfileRecorder(tensors, model="toy", framework="pytorch", batch=8)
    for it in range(3):
        rec.begin_iteration(10.0 * it)
        for i in reversed(range(4)):
            rec.gradient_ready(f"w{i}", 10.0 * it + 0.01 * (1, 1, 4)[it] * (4 - i))  # the third 4x as slow
        rec.end_iteration(10.0 * it + 0.2)
    path = tmp_path / "profile.json"
    rec.profile().save(path)
    iter_ms = {}
    for compute in ("recorded", "median"):
        assert main(["simulate", "--profile", str(path), "--scheduler", "fifo", "--iterations", "9",
                     "--compute", compute, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["model"] == "toy" and out["tensors"] == 4
        iter_ms[compute] = out["results"]["fifo"]["iter_ms"]
    # The median iteration's backward is 40 ms, the three in turn average 80 ms; no forward recorded,
    # each takes half its backward: 20 ms against 40.
    assert iter_ms["recorded"] - iter_ms["median"] == pytest.approx(40 + 20, rel=0.05)
    # Timed as the benchmarks: the timed steps replay the recorded iterations from the first (60, 60
    # and 240 ms of compute), each from a synchronised start, whatever the warm-up.
    for steps, compute_ms in ((1, 60), (3, 120)):
        assert main(["simulate", "--profile", str(path), "--scheduler", "fifo", "--steps", str(steps),
                     "--warmup", "2", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["measure"] == {"timed_steps": steps, "warmup": 2}
        assert out["results"]["fifo"]["iter_ms"] == pytest.approx(compute_ms, rel=0.05)
        assert len(out["results"]["fifo"]["steps_ms"]) == steps


@pytest.mark.parametrize("args, env, culprit", [
    (["--model", "resnet51"], {}, "resnet51"),
    (["--model", "vgg16", "--scheduler", "lifo"], {}, "lifo"),
    (["--model", "vgg16", "--bandwidth", "fast"], {}, "fast"),
    (["--model", "vgg16"], {"BYTESCHEDULER_CREDIT": "-5"}, "BYTESCHEDULER_CREDIT"),
    (["--model", "vgg16"], {"BYTESCHEDULER_PARTITION": "0"}, "BYTESCHEDULER_PARTITION"),
    (["--model", "vgg16"], {"BYTESCHEDULER_CREDIT": "lots"}, "BYTESCHEDULER_CREDIT"),
    (["--model", "vgg16"], {"PROPHET_MODE": "magic"}, "PROPHET_MODE"),
    (["--profile", "/nonexistent/profile.json"], {}, "profile.json"),
    (["--model", "vgg16", "--compute", "median"], {}, "--compute"),
    (["--model", "vgg16", "--steps", "2", "--iterations", "5"], {}, "--steps"),
    (["--model", "vgg16", "--iterations", "5", "--warmup", "4"], {}, "--warmup"),
    (["--model", "vgg16", "--steps", "0"], {}, "--steps"),
])
def test_bad_input_is_one_line_and_exit_2(args, env, culprit, tmp_path):
    import os

    proc = run_cli("simulate", *args, env={**os.environ, **env})
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and culprit in lines[0] and "Traceback" not in proc.stderr


def test_malformed_profile_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "byteps-prophet-profile", "version": 99}')
    proc = run_cli("simulate", "--profile", str(bad))
    assert proc.returncode == 2 and "bad.json" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
