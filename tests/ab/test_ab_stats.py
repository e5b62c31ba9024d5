"""How sure an A/B's speedup is (ab/stats.py), and several A/Bs' rounds pooled into one summary."""
import json
import math
import random
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from byteps_prophet.ab.report import format_table, pool, summarize
from byteps_prophet.ab.runner import ABConfig
from byteps_prophet.ab.stats import median_interval, paired_ratios, verdict
from byteps_prophet.errors import UserError


def test_paired_ratios_pair_within_rounds_only():
    runs = [{"variant": "prophet", "round": 0, "samples_per_s": 12.0}, {"variant": "fifo", "round": 0, "samples_per_s": 10.0},
            {"variant": "prophet", "round": 1, "samples_per_s": 9.0},  # round 1 has no fifo: no ratio
            {"variant": "fifo", "round": 2, "samples_per_s": 8.0}, {"variant": "prophet", "round": 2, "samples_per_s": 6.0}]
    assert paired_ratios(runs, "prophet", "fifo") == [1.2, 0.75]


@pytest.mark.parametrize("n, k", [(6, 1), (8, 1), (9, 2), (12, 3), (20, 6), (30, 10), (3000, 1446)])
def test_the_interval_is_the_sign_tests(n, k):
    # the k-th smallest and largest of n values: the largest k with 1 - 2 P(Bin(n, 1/2) < k) >= 95%
    # (tables of the binomial: n = 20 -> the 6th and 15th values, 95.9%)
    low, high, confidence = median_interval(list(range(n)))
    assert (low, high) == (k - 1, n - k)
    assert confidence == pytest.approx(1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n)
    assert confidence >= 0.95


@pytest.mark.parametrize("n, confidence", [(1, 0.0), (2, 0.5), (3, 0.75), (5, 0.9375)])
def test_too_few_rounds_give_their_range_and_say_how_sure(n, confidence):
    values = [1.0 + i / 10 for i in range(n)]
    assert median_interval(values) == (values[0], values[-1], pytest.approx(confidence))


@pytest.mark.parametrize("low, high, confidence, word", [
    (1.01, 1.30, 0.9375, "not settled"),  # every round faster, but 5 rounds cannot reach 95%
    (1.01, 1.08, 0.96, "win"), (0.90, 0.99, 0.96, "loss"),
    (0.96, 1.04, 0.96, "level"), (0.94, 1.04, 0.96, "not settled"),  # holds 1, but reaches past +-5%
])
def test_a_speedup_is_called_what_its_interval_allows(low, high, confidence, word):
    assert verdict(low, high, confidence) == word


@settings(max_examples=30, deadline=None)
@given(st.integers(min_value=6, max_value=25), st.integers(min_value=0, max_value=10**6))
def test_the_interval_holds_the_true_median_as_often_as_it_says(n, seed):
    # Skewed ratios with a known median (lognormal around 0.97): over many draws, the interval misses
    # the true median no more often than its confidence allows (with slack for the finite draws).
    rng = random.Random(seed)
    trials, hits, promised = 400, 0, 0.0
    for _ in range(trials):
        values = [0.97 * math.exp(rng.gauss(0, 0.06) ** 3 * 20) for _ in range(n)]
        low, high, confidence = median_interval(values)
        hits += low <= 0.97 <= high
        promised += confidence
    assert hits / trials >= promised / trials - 0.05


def _output(path, rows, tcp="bbr", **config):
    cfg = ABConfig(framework="mxnet", backend="byteps", model="resnet", batch=128, rounds=len(rows), **config)
    runs = [dict(variant=v, round=r, samples_per_s=s, param_bytes=40_000_000)
            for r, row in enumerate(rows) for v, s in row.items()]
    summary = summarize(cfg, runs, netns=True, environment={"OMP_NUM_THREADS": "1"}, tuning=None, warnings=[],
                        tcp_congestion=tcp)
    path.write_text(json.dumps(summary))
    return str(path)


def test_pooled_rounds_pair_within_their_own_output(tmp_path):
    a = _output(tmp_path / "a.json", [{"fifo": 100, "prophet": 90}, {"fifo": 50, "prophet": 60}], steps=8)
    b = _output(tmp_path / "b.json", [{"fifo": 200, "prophet": 210}], steps=12)
    summary = pool([a, b])
    ratios = sorted([0.9, 1.2, 1.05])
    s = summary["speedups"]["prophet/fifo"]
    assert (s["median"], s["min"], s["max"], s["rounds"]) == (1.05, ratios[0], ratios[-1], 3)
    assert s["interval"] == {"low": 0.9, "high": 1.2, "confidence": 0.75}
    assert summary["config"]["rounds"] == 3 and summary["results"]["fifo"]["runs"] == [100, 50, 200]
    assert [src["rounds"] for src in summary["pooled_from"]] == [2, 1]
    table = format_table(summary)
    assert "a.json (2 rounds of 8 steps)" in table and "range 0.900-1.200 holds the median with 75%" in table


def test_pooling_refuses_different_experiments_in_one_line(tmp_path):
    a = _output(tmp_path / "a.json", [{"fifo": 100, "prophet": 90}], bandwidth="1gbit")
    b = _output(tmp_path / "b.json", [{"fifo": 100, "prophet": 90}], bandwidth="200mbit")
    with pytest.raises(UserError, match=r"b.json: bandwidth '200mbit' differs from .*a.json's '1gbit'"):
        pool([a, b])
    (tmp_path / "c.json").write_text("{}")
    with pytest.raises(UserError, match="c.json: not the JSON of `byteps-prophet ab --json`"):
        pool([a, str(tmp_path / "c.json")])
    with pytest.raises(UserError, match="nope.json: cannot read it"):
        pool([a, str(tmp_path / "nope.json")])


def test_pooling_refuses_outputs_run_with_other_knobs(tmp_path):
    a = _output(tmp_path / "a.json", [{"fifo": 100, "prophet": 90}])
    data = json.loads((tmp_path / "a.json").read_text())
    data["environment"] = {"BYTEPS_PROPHET_ATOM_ELEMENTS": "1000000"}
    (tmp_path / "b.json").write_text(json.dumps(data))
    with pytest.raises(UserError, match="b.json: its environment"):
        pool([a, str(tmp_path / "b.json")])


def test_pooling_refuses_outputs_run_under_other_tcp_congestion_controls(tmp_path):
    """The TCP congestion control the cluster's hosts used is part of every A/B (BytePS-MXNet's FIFO
    ran 2.1-2.7 s a step under CUBIC and 3.0-3.3 s under BBR): the table says which, and outputs under two
    do not pool."""
    a = _output(tmp_path / "a.json", [{"fifo": 100, "prophet": 90}])
    assert "TCP bbr" in format_table(json.loads((tmp_path / "a.json").read_text()))
    b = _output(tmp_path / "b.json", [{"fifo": 100, "prophet": 90}], tcp="cubic")
    with pytest.raises(UserError, match=r"different TCP congestion controls \(bbr, cubic\)"):
        pool([a, b])
    assert pool([a, _output(tmp_path / "c.json", [{"fifo": 101, "prophet": 91}])])["tcp_congestion_control"] == "bbr"


def test_cli_pool_prints_the_table_and_exit_2_on_a_bad_file(tmp_path):
    rows = [{"fifo": 100 + r, "bytescheduler": 101, "prophet": 99 + 2 * r} for r in range(4)]
    a = _output(tmp_path / "a.json", rows[:2])
    b = _output(tmp_path / "b.json", rows[2:])
    proc = subprocess.run([sys.executable, "-m", "byteps_prophet", "ab", "--pool", a, b, "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["speedups"]["prophet/fifo"]["rounds"] == 4
    proc = subprocess.run([sys.executable, "-m", "byteps_prophet", "ab", "--pool", a, str(tmp_path / "x.json")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "x.json" in proc.stderr


def test_cli_output_piped_into_a_reader_that_stops_early_ends_quietly(tmp_path):
    # `byteps-prophet ab ... --json | head -c 100`: no traceback when the reader goes away
    big = _output(tmp_path / "big.json", [{"fifo": 100.0 + r % 7, "prophet": 99.0 + r % 5} for r in range(3000)])
    proc = subprocess.Popen([sys.executable, "-m", "byteps_prophet", "ab", "--pool", big, "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.read(100)
    proc.stdout.close()
    assert proc.wait(timeout=120) == 0
    assert proc.stderr.read() == b""
