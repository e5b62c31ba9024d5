"""The rendered Pods, played for real by `podman kube play` (slow, root, podman).

Debian's podman 4.3 plays Pods, Deployments and ConfigMaps, not Jobs, StatefulSets or Services, so the
job is rendered with `--target pods`: the scheduler, one server and two workers as Pods, each worker's
index written out, on a podman network whose DNS resolves each pod's name (the scheduler address is its
pod name). There is no image registry here: the image is a rootfs of a few symlinks imported with
`podman import`, and the pods mount this machine's /usr, the Python the venv was made from, and this
repository (hostPath volumes of the description), so each pod runs the project's .venv with real
BytePS. Each pod has its own network namespace and address. The workers train a few steps under
Prophet; their parameters must equal the single-process reference. Everything the test creates (pods,
volumes, network, image) is removed.
"""
from __future__ import annotations

import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from byteps_prophet.deploy.description import parse_description
from byteps_prophet.deploy.render import render

REPO = Path(__file__).resolve().parents[2]
TRAIN = str(Path(__file__).with_name("bps_train.py"))
STEPS = 4


def _reason() -> str | None:
    if os.geteuid() != 0:
        return "podman kube play needs root here"
    if shutil.which("podman") is None:
        return "podman is not installed (apt-get install podman runc catatonit; scripts/setup.sh does)"
    backend = subprocess.run(["podman", "info", "--format", "{{.Host.NetworkBackend}}"], capture_output=True,
                             text=True, timeout=120).stdout.strip()
    if backend != "netavark":
        return (f"podman's network backend is {backend or 'unknown'}: pods do not resolve each other's names "
                f"(needs netavark and aardvark-dns)")
    probe = subprocess.run([sys.executable, "-c", "import byteps.torch"], capture_output=True, timeout=120)
    return None if probe.returncode == 0 else "byteps is not built (scripts/build_byteps.sh)"


_REASON = _reason()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(_REASON is not None, reason=str(_REASON))]


@pytest.fixture
def podman(tmp_path):
    """``run(*args)``: podman with a configuration of this test's own (runc, cgroupfs, a file events
    log, ulimits within this host's hard limits: what scripts/compose.sh writes for the engine, here
    without touching /etc)."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    # podman drops its own process limit to 32768 before runc starts a container: ask no more
    nproc = 32768 if nproc == resource.RLIM_INFINITY or nproc > 32768 else nproc
    conf = tmp_path / "containers.conf"
    conf.write_text(f'[containers]\ndefault_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
                    f'[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n')
    env = dict(os.environ, CONTAINERS_CONF=str(conf))

    def run(*args, check=True, timeout=120):
        proc = subprocess.run(["podman", *args], capture_output=True, text=True, env=env, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip()}")
        return proc

    return run


def _rootfs_tar() -> bytes:
    """A root file system of symlinks into /usr (mounted from the host), with the loader's cache and the
    user database copied: enough for the host's binaries and the venv to run."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in ("usr", "etc", "tmp", "proc", "sys", "dev", "root", "run", "out", "var", "var/tmp"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name in ("tmp", "var/tmp") else 0o755
            tar.addfile(info)
        for name in ("bin", "lib", "lib64", "sbin"):
            target = os.readlink(f"/{name}") if os.path.islink(f"/{name}") else f"usr/{name}"
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        for path in ("/etc/ld.so.cache", "/etc/passwd", "/etc/group"):
            if os.path.exists(path):
                tar.add(path, arcname=path.lstrip("/"))
    return buffer.getvalue()


def _mounts(out: Path) -> list[dict]:
    """hostPath volumes: /usr, the interpreter the venv was made from (outside /usr, e.g. pyenv's), this
    repository (the venv and the scripts), and the directory the workers write their parameters to."""
    base = os.path.realpath(sys.base_prefix)
    mounts = [{"host": "/usr", "path": "/usr", "read_only": True}]
    if not base.startswith("/usr/"):
        mounts.append({"host": base, "path": base, "read_only": True})
    mounts.append({"host": str(REPO), "path": str(REPO), "read_only": True})
    mounts.append({"host": str(out), "path": "/out", "read_only": False})
    return mounts


def _wait_exited(podman, names: list[str], timeout: float) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        states = {}
        listing = json.loads(podman("ps", "-a", "--format", "json").stdout or "[]")
        for entry in listing:
            for name in entry.get("Names", []):
                if name in names:
                    states[name] = entry
        done = {n: e["ExitCode"] for n, e in states.items() if e.get("Exited")}
        if len(done) == len(names):
            return done
        if time.monotonic() > deadline:
            raise AssertionError(f"containers still running after {timeout:g}s: "
                                 f"{sorted(set(names) - set(done))}")
        time.sleep(0.5)


def test_the_rendered_pods_train_under_podman_kube_play(podman, tmp_path):
    import torch

    tag = f"bppk{os.getpid()}"
    image, network = f"localhost/{tag}:rootfs", f"{tag}-net"
    out = tmp_path / "out"
    out.mkdir()
    description = parse_description({
        "name": tag, "image": image, "python": sys.executable, "schedule": "prophet",
        "command": [sys.executable, TRAIN, "/out/params", str(STEPS)],
        "volumes": _mounts(out), "servers": {"count": 1}, "workers": {"count": 2},
        "scheduler": {"cpu": "500m", "memory": "1Gi"},
    }, "kube-play test")
    [(pods_file, _note)] = render(description, "pods", tmp_path / "render")
    (tmp_path / "rootfs.tar").write_bytes(_rootfs_tar())
    podman("import", str(tmp_path / "rootfs.tar"), image)
    names = [f"{tag}-scheduler-scheduler", f"{tag}-server-0-server", f"{tag}-worker-0-worker",
             f"{tag}-worker-1-worker"]
    try:
        podman("network", "create", network)
        played = podman("kube", "play", "--network", network, str(pods_file), timeout=180)
        assert played.stdout.count("Pod:") == 4, played.stdout
        codes = _wait_exited(podman, names, timeout=240)
        logs = {name: podman("logs", name).stdout + podman("logs", name).stderr for name in names}
        report = "\n".join(f"--- {n} (exit {codes[n]})\n{logs[n][-2500:]}" for n in names)
        assert codes == {name: 0 for name in names}, report
        scheduler_log = logs[names[0]]
        addresses = [line.split(" connected from ")[1].split()[0] for line in scheduler_log.splitlines()
                     if " connected from " in line]
        assert len(addresses) == 3 and len(set(addresses)) == 3, scheduler_log  # a network namespace each
        for name in names:
            assert "all 2 workers succeeded; job ended (exit 0)" in logs[name], report
    finally:
        podman("kube", "down", str(pods_file), check=False, timeout=180)
        for name in ("scheduler", "server-0", "worker-0", "worker-1"):
            podman("pod", "rm", "-f", f"{tag}-{name}", check=False)
            podman("volume", "rm", "-f", f"{tag}-{name}-shm", check=False)
        podman("network", "rm", "-f", network, check=False)
        podman("rmi", "-f", image, check=False)
    assert not [n for n in podman("volume", "ls", "--format", "{{.Name}}").stdout.split() if n.startswith(tag)]
    assert podman("image", "exists", image, check=False).returncode != 0
    subprocess.run([sys.executable, TRAIN, "--reference", "2", str(tmp_path / "ref.pt"), str(STEPS)], check=True,
                   timeout=120)
    reference = torch.load(tmp_path / "ref.pt")
    for rank in (0, 1):
        params = torch.load(out / f"params.rank{rank}.pt")
        for key in reference:
            torch.testing.assert_close(params[key], reference[key], rtol=0, atol=1e-6, msg=f"rank {rank} {key}")
