"""scripts/bench_shares.py: two workers' bursts read on their shared clock, and the real run."""
import importlib.util
import json
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_shares.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_shares", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_burst_is_read_on_the_clock_both_workers_share(bench):
    """Worker 1 started its burst 0.01 s after worker 0; its answers, 1.0 and 2.5 s into its own burst,
    came 0.21 and 0.41 s after worker 0's (0.8 and 2.1 s into worker 0's)."""
    first = [{"start": 100.0, "done_s": [0.8, 1.5, 2.1]}, {"start": 200.0, "done_s": [1.0, 3.0]}]
    second = [{"start": 100.01, "done_s": [1.0, 1.7, 2.5]}, {"start": 200.0, "done_s": [0.9, 2.6]}]
    rows = bench.later_s(first, second)
    assert rows[0] == {"first_later_s": pytest.approx(0.21), "last_later_s": pytest.approx(0.41),
                       "both_done_s": pytest.approx(2.51)}
    assert rows[1]["last_later_s"] == pytest.approx(-0.4) and rows[1]["both_done_s"] == pytest.approx(3.0)
    summary = bench.summary(rows)
    assert summary["bursts"] == 2 and summary["last_later_mean_s"] == pytest.approx(0.005)
    assert summary["last_later_abs_median_s"] == pytest.approx(0.405)
    assert summary["last_later_sd_s"] == pytest.approx(0.405)


def test_misuse_is_one_line_and_exit_2(bench, capsys):
    for argv, culprit in ((["--reps", "0"], "--reps 0"), (["--clusters", "0"], "--clusters 0"), (["--tcp", ","], "--tcp")):
        with pytest.raises(SystemExit) as exit_:
            bench.main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_.value.code == 2 and culprit in err[-1], err


@pytest.mark.slow
def test_two_real_workers_burst_and_both_report(bench, tmp_path):
    """Two bursts on the one-machine cluster under this machine's TCP: both workers' answers come back
    (nine 2 MiB push_pulls each, both ways through one 200 Mbit/s server link: at least 1.5 s), and the
    simulator's equal shares finish both workers together."""
    tcp = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    out = tmp_path / "shares.json"
    assert bench.main(["--tcp", tcp, "--reps", "2", "--clusters", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())["tcp"][tcp]
    assert len(result["clusters"]) == 1 and len(result["clusters"][0]["bursts"]) == 2
    for burst in result["clusters"][0]["bursts"]:
        assert 1.5 < burst["both_done_s"] < 10 and math.isfinite(burst["last_later_s"])
    assert result["simulated"]["last_later_s"] == 0 and 2.5 < result["simulated"]["both_done_s"] < 4
