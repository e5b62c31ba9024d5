"""The package installed as a user installs it (not editable, not the checkout): its commands run, and
whatever it reads at run time besides its modules (``package_data`` in setup.py) came with it.

pip builds from a copy of the checkout (so nothing is written into the repository) into a scratch
``--target``, with ``--no-deps --no-build-isolation --no-index``: nothing is downloaded; the
dependencies are the running interpreter's. The commands run from a directory outside the checkout
with only the scratch install on ``PYTHONPATH``.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the scratch install's directory, an environment that imports the package from there alone)."""
    scratch = tmp_path_factory.mktemp("install")
    source = scratch / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    source.mkdir()
    for name in ("setup.py", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "byteps_prophet", source / "byteps_prophet", ignore=ignore)
    target = scratch / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(target), str(source)],
                   check=True, cwd=scratch, capture_output=True, text=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH")}
    env["PYTHONPATH"] = str(target)
    return target, env


def _run(installed, *argv, tmp_path):
    target, env = installed
    return subprocess.run([sys.executable, str(target / "bin" / "byteps-prophet"), *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_package_imports_from_the_install_not_the_checkout(installed, tmp_path):
    target, env = installed
    out = subprocess.run([sys.executable, "-c", "import sys, byteps_prophet.cluster.compose as c; "
                          "print(c.__file__); print(c.GLOO_COMPOSE.is_file()); print(*sys.path, sep='\\n')"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout.splitlines()
    assert Path(out[0]).is_relative_to(target), out[0]
    assert out[1] == "True"  # package_data came with it
    assert str(ROOT) not in out[2:]  # the checkout is not on sys.path (the working directory is tmp_path)


def test_ab_help_runs(installed, tmp_path):
    done = _run(installed, "ab", "--help", tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: byteps-prophet ab")


def test_a_short_simulation_runs(installed, tmp_path):
    done = _run(installed, "simulate", "--model", "resnet50", "--workers", "2", "--iterations", "5",
                tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert all(name in done.stdout for name in ("fifo", "bytescheduler", "prophet")), done.stdout


def test_settings_runs(installed, tmp_path):
    done = _run(installed, "settings", tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "BYTESCHEDULER_PARTITION" in done.stdout
