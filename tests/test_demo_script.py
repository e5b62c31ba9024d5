"""scripts/demo.sh: argument handling (the demo itself is the real A/B, run by hand or in the A/B tests)."""
import subprocess
from pathlib import Path

DEMO = Path(__file__).resolve().parents[1] / "scripts" / "demo.sh"


def test_unknown_argument_is_one_line_exit_2_before_any_setup():
    proc = subprocess.run(["bash", str(DEMO), "--fast"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["demo.sh: unknown argument '--fast'; valid: --sim-only"]
    assert proc.stdout == ""  # setup.sh never ran


def test_the_demo_runs_without_warning_about_its_own_settings():
    """The demo's A/B, configured as demo.sh configures it, raises no warning (its warm-up covers
    Prophet's profiling: a shorter one warned on every demo run)."""
    import re
    import shlex

    from byteps_prophet.ab.runner import ABConfig, ABRunner

    text = DEMO.read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if "byteps-prophet ab " in line)
    argv = shlex.split(line.split("byteps-prophet ab ", 1)[1])
    options = dict(zip(argv[::2], argv[1::2]))
    cfg = ABConfig(framework=options["--framework"], backend=options["--backend"], model=options["--model"],
                   workers=int(options["--workers"]), bandwidth=options["--bandwidth"], steps=int(options["--steps"]),
                   warmup=int(options["--warmup"]), rounds=int(options["--rounds"]),
                   variants=tuple(options["--variants"].split(",")))
    said = []
    runner = ABRunner(cfg, log=said.append)
    assert "prophet" in cfg.variants and re.search(r"--warmup \d", line)
    assert runner.warnings == [] and said == []
