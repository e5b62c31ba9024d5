"""scripts/benchmarks/results.py: every figure of docs/RESULTS.md and README's Results section is what the
committed data gives, each word follows its interval, and no declared data file can go missing unnoticed."""
import json
import shutil

import pytest

from tests.conftest import BENCHMARKS, load_script

results = load_script("results")


def test_the_documents_hold_what_the_committed_data_gives():
    assert results.differences() == [], "run: .venv/bin/python scripts/benchmarks/results.py --write"


def test_every_declared_file_exists_and_is_read(monkeypatch):
    read = set()
    load = results.load

    def recording(path):
        read.add(results.DATA / path)
        return load(path)

    monkeypatch.setattr(results, "load", recording)
    results.tables()
    declared = results.declared_files()
    assert [p for p in declared if not p.is_file()] == []
    assert set(declared) <= read, "declared but never read: " + ", ".join(str(p) for p in set(declared) - read)


def copied_data(tmp_path, monkeypatch):
    """A copy of every declared file, which the script then reads instead of the repository's."""
    for path in results.declared_files():
        target = tmp_path / path.relative_to(results.DATA)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    monkeypatch.setattr(results, "DATA", tmp_path)
    return tmp_path


@pytest.mark.parametrize("path", [p.relative_to(results.DATA) for p in results.declared_files()], ids=str)
def test_deleting_any_declared_file_fails_the_check_naming_it(path, tmp_path, monkeypatch, capsys):
    data = copied_data(tmp_path, monkeypatch)
    assert results.main(["--check"]) == 0
    (data / path).unlink()
    assert results.main(["--check"]) == 1
    assert str(path) in capsys.readouterr().err


def test_a_changed_figure_fails_the_check_naming_its_table(tmp_path, monkeypatch, capsys):
    data = copied_data(tmp_path, monkeypatch)
    file = data / "ab" / "overlap-torch-gloo-vgg-1gbit.json"
    doc = json.loads(file.read_text())
    doc["ab"]["runs"][0]["samples_per_s"] *= 1.5
    file.write_text(json.dumps(doc))
    assert results.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "ab-overlap-torch-gloo-vgg-1gbit: docs/RESULTS.md differs" in err
    assert "ab-overlap-torch-byteps-vgg-200mbit" not in err


def summary(ratios):
    return results.pair_summary([dict(variant=v, round=i, samples_per_s=r if v == "a" else 1.0)
                                 for i, r in enumerate(ratios) for v in "ab"], "a", "b")


@pytest.mark.parametrize("ratios, word", [
    ([1.2, 1.3, 1.25, 1.22, 1.21], "not settled (5 rounds)"),  # every round faster, yet under 95%
    ([1.02, 1.03, 1.05, 1.04, 1.06, 1.02], "win (6 rounds)"),
    ([0.95, 0.96, 0.97, 0.98, 0.97, 0.96], "loss (6 rounds)"),
    ([0.99, 1.01, 1.0, 0.98, 1.02, 1.03], "level (6 rounds)"),
    ([0.9, 1.1, 1.0, 0.92, 1.08, 1.2], "not settled (6 rounds)"),  # holds 1, but wider than +-5%
])
def test_words_follow_the_interval(ratios, word):
    assert results.verdict(summary(ratios)) == word


def test_a_prediction_awaits_its_measurement_then_is_scored(tmp_path, monkeypatch):
    data = copied_data(tmp_path, monkeypatch)
    path = results.PREDICTIONS[0]
    prediction = json.loads((data / path).read_text())
    target = data / prediction["measurement_file"].removeprefix("scripts/benchmarks/data/")
    target.unlink(missing_ok=True)
    assert "awaiting measurement" in results.prediction_table(path)
    # a measurement: FIFO as predicted, ByteScheduler 20% faster than predicted, Prophet 5% slower, 6 rounds
    factor = {"fifo": 1.0, "bytescheduler": 1.2, "prophet": 0.95}
    runs = [dict(variant=s, round=r, rank=0, samples_per_s=prediction["predicted"][s]["samples_per_s"] * f
                 * (1 + 0.001 * r)) for r in range(6) for s, f in factor.items()]
    measured = {"commit": "abc1234", "command": "byteps-prophet ab ...",
                "ab": {"config": {"framework": "torch", "backend": "byteps", "model": "vgg", "batch": 16,
                                  "bandwidth": "500mbit", "workers": 2}, "tcp_congestion_control": "bbr",
                       "runs": runs}}
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(measured))
    text = results.prediction_table(path)
    assert "| FIFO | 11.38 | 11.40 | -0.2% | hit |" in text
    assert "| ByteScheduler | 16.09 | 19.36 | -16.9% | miss |" in text
    assert "| Prophet | 18.89 | 17.99 | +5.0% | hit |" in text
    # measured, ByteScheduler beats Prophet in every round, which the prediction had the other way
    assert "2 of 3 within 10%; ordered as measured in 2 of the 3 pairs the measurement separates\n" in text
    assert "2 of 3 within 10%" in results.summary_table()


def test_generated_lines_fit_the_documents_limit():
    for name, (_, body) in results.tables().items():
        long = [line for line in body.splitlines() if len(line) > 120]
        assert long == [], name


def test_benchmarks_folder_is_where_the_script_looks():
    assert results.DATA == BENCHMARKS / "data"


def test_a_new_measurement_is_one_line_and_its_marker_pair(tmp_path, monkeypatch):
    data = copied_data(tmp_path / "data", monkeypatch)
    shutil.copy(data / "ab" / "overlap-torch-byteps-vgg-200mbit.json", data / "ab" / "ab-new.json")
    line = results.ABFile("ab/ab-new.json", (("prophet", "bytescheduler", True),), "after a change")
    monkeypatch.setattr(results, "AB_FILES", results.AB_FILES + (line,))
    docs = {name: tmp_path / name for name in ("README.md", "RESULTS.md")}
    for name, doc in docs.items():
        shutil.copy(getattr(results, name.removesuffix(".md")), doc)
    monkeypatch.setattr(results, "README", docs["README.md"])
    monkeypatch.setattr(results, "RESULTS", docs["RESULTS.md"])
    assert any(p.startswith("ab-new: no <!-- results:ab-new:start -->") for p in results.differences())
    docs["RESULTS.md"].write_text(docs["RESULTS.md"].read_text()
                                  + "\n<!-- results:ab-new:start -->\n<!-- results:ab-new:end -->\n")
    assert results.main(["--write"]) == 0 and results.differences() == []
    row = "| torch/BytePS vgg b16 200 Mbit/s, BBR, after a change | ByteScheduler | 1.124x |"
    assert row in docs["README.md"].read_text()


def test_variant_rates_take_each_rounds_reported_run_whatever_the_reporting_rank():
    """The KVStore's reporting worker is rank 1: its rounds count, once each, as the ratios pair them."""
    runs = [{"variant": "prophet", "round": r, "rank": 1, "samples_per_s": 10.0 + r} for r in range(3)]
    runs.append({"variant": "prophet", "round": 0, "rank": 0, "samples_per_s": 99.0})  # a second report of round 0
    assert results.variant_rates(runs, "prophet") == [10.0, 11.0, 12.0]
    assert results.variant_rates(runs, "fifo") == []
