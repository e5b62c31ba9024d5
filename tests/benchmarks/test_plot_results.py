"""scripts/benchmarks/plot_results.py: README's plot from the committed simulator grid."""
import json

from tests.conftest import BENCHMARKS, load_script

SCRIPT = BENCHMARKS / "plot_results.py"
plot_results = load_script("plot_results")


def test_speedups_are_fifo_over_each_schedule_from_the_grid():
    data = json.loads((BENCHMARKS / "data" / "bench_sim_results.json").read_text())
    models, values = plot_results.speedups(data, "ps", 8, 10)
    assert models == ["resnet50", "vgg16", "alexnet", "inception_v3", "bert_base"]
    cols = data["grid_columns"]
    row = next(r for r in data["grid"] if r[:4] == ["vgg16", "ps", 8, 10])
    assert values["prophet_ms"][1] == row[cols.index("fifo_ms")] / row[cols.index("prophet_ms")]


def test_writes_the_png(tmp_path):
    out = tmp_path / "plot.png"
    assert plot_results.main(["--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_cell_not_in_the_grid_is_one_line_exit_2_naming_the_choices(tmp_path, capsys):
    assert plot_results.main(["--out", str(tmp_path / "x.png"), "--workers", "7"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("plot_results.py: error: no grid cell") and "valid workers: [2, 8, 32]" in err
    assert err.count("\n") == 1 and not (tmp_path / "x.png").exists()
