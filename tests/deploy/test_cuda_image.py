"""The CUDA image's files without the CUDA wheels (several GB, not in CI): docker/build_cuda.sh's
argument checks and dry run, and docker/Dockerfile.cuda's sources and its BytePS build command (the GPU
check's, run here as a dry run with the options the Dockerfile gives it)."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = str(REPO / "docker" / "build_cuda.sh")
DOCKERFILE = REPO / "docker" / "Dockerfile.cuda"
SDIST = REPO / ".byteps-build" / "dist" / "byteps-0.2.5.post15.tar.gz"


def _instructions() -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in DOCKERFILE.read_text().splitlines()
                                          if not line.lstrip().startswith("#")))
    return [line.strip() for line in text.splitlines() if line.strip()]


def test_every_copy_source_is_in_the_repository():
    copies = [line.split()[1:-1] for line in _instructions() if line.startswith("COPY ") and "--from" not in line]
    assert copies
    for sources in copies:
        for source in sources:
            assert (REPO / source).exists(), source
    stages = [line.split()[-1] for line in _instructions() if line.startswith("FROM ")]
    assert stages == ["cuda-build", "cuda"]  # the last stage is the image


def test_the_in_image_build_is_the_gpu_checks_and_its_options_hold(tmp_path):
    if not SDIST.exists():
        pytest.skip("the byteps sdist is not downloaded (scripts/setup.sh)")
    run = next(line for line in _instructions() if "bash scripts/gpu_check.sh" in line)
    command = run.split("bash scripts/gpu_check.sh", 1)[1].split("&&")[0]
    args = shlex.split(command.replace('"$site/$CUDA_HOME_IN_VENV"', str(tmp_path / "cuda"))
                       .replace('"$site"', str(tmp_path / "site"))
                       .replace("/tmp/wheels/byteps-0.2.5.post15.tar.gz", str(SDIST))
                       .replace("/tmp/gpu-build", str(tmp_path / "out"))
                       .replace("--python python", f"--python {sys.executable}"))
    assert "--build-only" in args
    for path in ("cuda/bin/nvcc", "cuda/include/cuda_runtime.h"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), *args, "--dry-run"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"export BYTEPS_CUDA_HOME={tmp_path / 'cuda'}" in proc.stdout
    assert f"--target {tmp_path / 'site'} " in proc.stdout
    assert "done (--build-only)" in proc.stdout and "deploy.gpu run" not in proc.stdout


def test_build_script_dry_run_downloads_torch_with_cuda_then_builds():
    if not SDIST.exists():
        pytest.skip("the byteps sdist is not downloaded (scripts/setup.sh)")
    proc = subprocess.run(["bash", BUILD, "--dry-run", "--engine", "podman", "--tag", "x:cuda"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "-m pip download --isolated --only-binary :all: -d" in out and " torch==2.13.0 -r " in out
    assert "would run: podman build --format docker --layers -f" in out
    assert f"{REPO}/docker/Dockerfile.cuda --build-arg BASE=byteps-prophet-base:bookworm -t x:cuda {REPO}" in out


@pytest.mark.parametrize("args, culprit", [
    (("--engine", "rkt"), "--engine 'rkt' is not an engine; valid: docker, podman"),
    (("--tag",), "--tag needs a value"),
    (("--fast",), "unknown argument '--fast'; valid: --engine"),
])
def test_build_script_argument_errors(args, culprit):
    proc = subprocess.run(["bash", BUILD, *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and culprit in lines[0], proc.stderr


def test_the_wheels_directory_is_never_committed():
    ignore = (REPO / "docker" / "wheels-cuda" / ".gitignore").read_text().split()
    assert "*" in ignore and "!.gitignore" in ignore
