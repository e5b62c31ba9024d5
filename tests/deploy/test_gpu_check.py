"""scripts/gpu_check.sh on a machine without a GPU: its argument checks, the GPU build's flags, the
steps of a dry run, and (slow) its training runs on CPU against the single-process reference."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from byteps_prophet.deploy import gpu
from byteps_prophet.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
SCRIPT = str(REPO / "scripts" / "gpu_check.sh")
GPU = [sys.executable, "-m", "byteps_prophet.deploy.gpu"]


@pytest.fixture
def toolchain(tmp_path):
    """A CUDA toolkit and an NCCL as the checks see them (files only: nothing here compiles)."""
    cuda, nccl = tmp_path / "cuda", tmp_path / "nccl"
    for path in (cuda / "bin" / "nvcc", cuda / "include" / "cuda_runtime.h", nccl / "include" / "nccl.h",
                 nccl / "lib" / "libnccl.so.2"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    (cuda / "bin" / "nvcc").chmod(0o755)
    return cuda, nccl


def test_build_flags_point_setup_py_at_the_toolkit_and_nccl(toolchain, tmp_path):
    cuda, nccl = toolchain
    home, library = gpu.check_nccl_home(str(nccl))
    shim = gpu.nccl_shim(library, home / "include", tmp_path / "shim")
    flags = gpu.build_flags(gpu.check_cuda_home(str(cuda)), shim, jobs=16, abi=1)
    assert {k: v for k, v in flags.items() if k != "PATH"} == {
        "BYTEPS_CUDA_HOME": str(cuda), "CUDA_HOME": str(cuda), "BYTEPS_NCCL_HOME": str(shim),
        "BYTEPS_NCCL_LINK": "SHARED", "BYTEPS_WITH_PYTORCH": "1", "BYTEPS_WITHOUT_MXNET": "1",
        "BYTEPS_WITHOUT_TENSORFLOW": "1", "BYTEPS_BUILD_JOBS": "16", "CFLAGS": "-g0",
        "PSLITE_ADD_CFLAGS": "-D_GLIBCXX_USE_CXX11_ABI=1"}
    assert flags["PATH"].split(":")[0] == str(cuda / "bin")
    # NCCL under the names the linker and the loader want, pointing at the real files, which stay as they were
    assert (shim / "lib" / "libnccl.so").resolve() == (nccl / "lib" / "libnccl.so.2").resolve()
    assert (shim / "lib" / "libnccl.so.2").resolve() == (nccl / "lib" / "libnccl.so.2").resolve()
    assert (shim / "include" / "nccl.h").exists()
    assert sorted(p.name for p in (nccl / "lib").iterdir()) == ["libnccl.so.2"]


@pytest.mark.parametrize("call, culprit", [
    (lambda t: gpu.check_cuda_home(None), "no CUDA toolkit: pass --cuda-home DIR or put nvcc on PATH"),
    (lambda t: gpu.check_cuda_home(str(t[1])), "no bin/nvcc, include/cuda_runtime.h there"),
    (lambda t: gpu.check_nccl_home(None), "no NCCL: pass --nccl-home DIR"),
    (lambda t: gpu.check_nccl_home(str(t[0])), "needs include/nccl.h and lib/libnccl.so*"),
])
def test_toolchain_checks_name_what_is_missing(toolchain, call, culprit):
    with pytest.raises(ConfigError, match=culprit.replace("*", r"\*")):
        call(toolchain)


def _script(*args, timeout=120):
    return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("args, culprit", [
    (("--bogus",), "unknown argument '--bogus'; valid: --python"),
    (("--jobs", "x"), "--jobs 'x' is invalid; valid: an integer >= 1"),
    (("--steps", "0"), "--steps '0' is invalid; valid: an integer >= 1"),
    (("--jobs",), "--jobs needs a value"),
    (("--skip-build", "--build-only"), "--skip-build and --build-only exclude each other"),
    (("--python", "/nonexistent/python"), "--python '/nonexistent/python' is not an interpreter here"),
    (("--python", "/usr/bin/true"), "--python '/usr/bin/true' is not a Python interpreter"),
    (("--python", "/usr/bin/python3"), "lacks torch"),
    (("--python", sys.executable, "--sdist", "/nonexistent.tar.gz"), "--sdist /nonexistent.tar.gz does not exist"),
])
def test_script_argument_errors_are_one_line_exit_2(args, culprit):
    proc = _script(*args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and culprit in lines[0] and lines[0].startswith("gpu_check.sh: error: "), proc.stderr


def test_script_refuses_a_cpu_build_of_torch(toolchain, tmp_path):
    cuda, nccl = toolchain
    proc = _script("--python", sys.executable, "--cuda-home", str(cuda), "--nccl-home", str(nccl), "--skip-build",
                   "--out", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().endswith("is a CPU build; valid: an interpreter with a CUDA build of torch (--python)")
    assert not (tmp_path / "out").exists()


def test_script_dry_run_shows_every_step(toolchain, tmp_path):
    cuda, nccl = toolchain
    sdist = REPO / ".byteps-build" / "dist" / "byteps-0.2.5.post15.tar.gz"
    if not sdist.exists():
        pytest.skip("the byteps sdist is not downloaded (scripts/setup.sh)")
    out = tmp_path / "out"
    proc = _script("--python", sys.executable, "--cuda-home", str(cuda), "--nccl-home", str(nccl), "--jobs", "8",
                   "--out", str(out), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert f"    export BYTEPS_CUDA_HOME={cuda}" in text and "    export BYTEPS_NCCL_LINK=SHARED" in text
    assert "    export BYTEPS_BUILD_JOBS=8" in text and "export BYTEPS_WITHOUT_MXNET=1" in text
    series = [line.split("#")[0].strip() for line in (REPO / "patches" / "series").read_text().splitlines()]
    for patch in filter(None, series):
        assert f"--forward -i {REPO}/patches/{patch}" in text, patch
    assert "ADD_CFLAGS=-D_GLIBCXX_USE_CXX11_ABI=" in text and f" ps WGET=" in text
    assert f"--no-index --no-cache-dir --upgrade -v --target {out}/site " in text
    assert "-m byteps_prophet.deploy.gpu run --device cuda --backends gloo\\,nccl\\,byteps" in text
    assert "--schedulers fifo\\,bytescheduler\\,prophet --steps 5" in text
    assert not out.exists()  # a dry run makes nothing


@pytest.mark.parametrize("args, culprit", [
    (("--device", "cpu", "--backends", "nccl"), "--backends nccl needs --device cuda; valid on cpu: gloo, byteps"),
    (("--device", "cuda", "--backends", "gloo"), "--device cuda: torch"),
    (("--device", "tpu"), "--device 'tpu' is invalid; valid: cuda, cpu"),
    (("--device", "cpu", "--schedulers", "fifo,lifo"), "--schedulers 'fifo,lifo' is invalid; valid: a comma-separated "
                                                       "list of fifo, bytescheduler, prophet"),
    (("--device", "cpu", "--backends", ""), "--backends '' is invalid"),
    (("--device", "cpu", "--steps", "0"), "--steps 0 is invalid"),
])
def test_run_argument_errors(tmp_path, args, culprit):
    proc = subprocess.run(GPU + ["run", "--out", str(tmp_path), *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and culprit in lines[0], proc.stderr


def test_flags_cli_prints_exports_the_shell_can_eval(toolchain, tmp_path):
    cuda, nccl = toolchain
    proc = subprocess.run(GPU + ["flags", "--cuda-home", str(cuda), "--nccl-home", str(nccl), "--shim",
                                 str(tmp_path / "shim with space"), "--jobs", "3", "--allow-cpu-torch"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    shell = subprocess.run(["bash", "-c", proc.stdout + '\nprintf "%s|%s" "$BYTEPS_NCCL_HOME" "$BYTEPS_BUILD_JOBS"'],
                           capture_output=True, text=True)
    assert shell.stdout == f"{tmp_path / 'shim with space'}|3"
    proc = subprocess.run(GPU + ["flags", "--cuda-home", str(cuda), "--nccl-home", str(nccl), "--shim",
                                 str(tmp_path / "s"), "--jobs", "0"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--jobs 0 is invalid" in proc.stderr


@pytest.mark.slow
def test_the_check_trains_to_the_reference_on_cpu(tmp_path):
    """What the GPU machine runs, with CPU tensors: gloo with 2 processes and BytePS (1 worker + 1 server,
    started by `byteps-prophet launch`) under Prophet, compared with the single-process reference."""
    probe = subprocess.run([sys.executable, "-c", "import byteps.torch"], capture_output=True, timeout=120)
    if probe.returncode != 0:
        pytest.skip("byteps is not built (scripts/build_byteps.sh)")
    proc = subprocess.run(GPU + ["run", "--device", "cpu", "--backends", "gloo,byteps", "--schedulers", "prophet",
                                 "--steps", "3", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("gloo    2 worker(s) prophet") and lines[0].endswith("OK"), proc.stdout
    assert lines[1].startswith("byteps  1 worker(s) prophet") and lines[1].endswith("OK"), proc.stdout
    assert "2 of 2 runs equal the single-process reference within 1e-06" in lines[-1]
