"""The GPU check's Python half (scripts/gpu_check.sh runs it): argument checks and build flags for
BytePS with CUDA against the machine's own torch, and the training runs compared with one process.

    python -m byteps_prophet.deploy.gpu flags --cuda-home DIR [--nccl-home DIR] --shim DIR [--jobs N]
    python -m byteps_prophet.deploy.gpu run --device cuda [--backends gloo,nccl,byteps] [--schedulers ...]
    python -m byteps_prophet.deploy.gpu worker|reference ...     (what `run` starts)

``flags`` checks the CUDA toolkit (nvcc, cuda_runtime.h), NCCL (nccl.h and libnccl; by default the
nvidia-nccl wheel a CUDA build of torch depends on) and torch (a CUDA build), makes a private
directory that gives NCCL's library the plain name the linker wants (the wheel's own directory is not
touched), and prints the environment the patched setup.py reads (patches 0001, 0004), as ``export``
lines. ``run`` trains a small model a few steps in every configuration asked for, each under every
scheduler: ``gloo``, 2 processes with CUDA tensors sharing the GPUs; ``nccl``, one process per GPU (at
most 2; NCCL refuses two ranks on one device); ``byteps``, 1 worker + 1 server on BytePS's GPU path
(``BYTEPS_CPU_ONLY=0``), each host started by ``byteps-prophet launch``; and compares every worker's
parameters with one process that averages the same gradients. ``--device cpu`` runs the same on CPU
(gloo and BytePS's CPU-only mode), which is how it is tested without a GPU.
"""
from __future__ import annotations

import argparse
import glob
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from byteps_prophet.core.settings import SCHEDULERS
from byteps_prophet.errors import ConfigError, UserError

BACKENDS = ("gloo", "nccl", "byteps")
DEVICES = ("cuda", "cpu")
BATCH = 8


# ------------------------------------------------------------------------------------- build flags
def check_cuda_home(path: str | None) -> Path:
    """The CUDA toolkit: ``bin/nvcc`` and ``include/cuda_runtime.h`` (what BytePS and torch's
    CUDAExtension compile with)."""
    if not path:
        raise ConfigError("no CUDA toolkit: pass --cuda-home DIR or put nvcc on PATH; valid: the directory "
                          "holding bin/nvcc and include/cuda_runtime.h (e.g. /usr/local/cuda)")
    home = Path(path)
    missing = [p for p in ("bin/nvcc", "include/cuda_runtime.h") if not (home / p).exists()]
    if missing:
        raise ConfigError(f"--cuda-home {path}: no {', '.join(missing)} there; valid: the directory holding "
                          f"bin/nvcc and include/cuda_runtime.h (e.g. /usr/local/cuda)")
    return home


def default_nccl_home() -> str | None:
    """The nvidia-nccl wheel's directory (CUDA builds of torch depend on it), when it has the header."""
    try:
        import nvidia.nccl  # a namespace package of the wheel
    except ImportError:
        return None
    for root in getattr(nvidia.nccl, "__path__", []):
        if (Path(root) / "include" / "nccl.h").exists():
            return root
    return None


def check_nccl_home(path: str | None) -> tuple[Path, Path]:
    """(NCCL's directory, its shared library): ``include/nccl.h`` and ``lib/libnccl.so*``."""
    if not path:
        raise ConfigError("no NCCL: pass --nccl-home DIR or install torch's nvidia-nccl wheel; valid: the "
                          "directory holding include/nccl.h and lib/libnccl.so.2")
    home = Path(path)
    libraries = sorted(glob.glob(str(home / "lib" / "libnccl.so*")))
    if not (home / "include" / "nccl.h").exists() or not libraries:
        raise ConfigError(f"--nccl-home {path}: needs include/nccl.h and lib/libnccl.so*; valid: the directory "
                          f"holding both (the nvidia-nccl wheel's nvidia/nccl, or an NCCL install)")
    return home, Path(libraries[-1])


def torch_facts() -> dict:
    """What the build needs to know of this interpreter's torch."""
    try:
        import torch
    except ImportError:
        raise ConfigError(f"torch is not importable by {sys.executable}; valid: an interpreter with a CUDA "
                          f"build of torch (--python)") from None
    return {"version": torch.__version__, "cuda": torch.version.cuda,
            "abi": int(torch.compiled_with_cxx11_abi()),
            "devices": torch.cuda.device_count() if torch.version.cuda else 0}


def nccl_shim(library: Path, include: Path, shim: Path) -> Path:
    """``shim/include`` and ``shim/lib/libnccl.so(.2)``: NCCL as setup.py looks for it
    (BYTEPS_NCCL_HOME/{include,lib}, linked as -lnccl), pointing at the real files."""
    (shim / "lib").mkdir(parents=True, exist_ok=True)
    for link, target in ((shim / "include", include), (shim / "lib" / "libnccl.so", library),
                         (shim / "lib" / "libnccl.so.2", library)):
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target.resolve())
    return shim


def build_flags(cuda_home: Path, nccl: Path, jobs: int, abi: int) -> dict[str, str]:
    """The environment of the GPU build: BytePS's setup.py (patches 0001 and 0004 read the CUDA and NCCL
    locations and which plugins to build), torch's CUDAExtension (CUDA_HOME), ps-lite's make
    (the C++ ABI torch was built with)."""
    return {
        "BYTEPS_CUDA_HOME": str(cuda_home),
        "CUDA_HOME": str(cuda_home),
        "BYTEPS_NCCL_HOME": str(nccl),
        "BYTEPS_NCCL_LINK": "SHARED",
        "BYTEPS_WITH_PYTORCH": "1",
        "BYTEPS_WITHOUT_MXNET": "1",
        "BYTEPS_WITHOUT_TENSORFLOW": "1",
        "BYTEPS_BUILD_JOBS": str(jobs),
        "CFLAGS": "-g0",
        "PSLITE_ADD_CFLAGS": f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        "PATH": f"{cuda_home / 'bin'}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
    }


def flags_main(args) -> int:
    if args.jobs < 1:
        raise ConfigError(f"--jobs {args.jobs} is invalid; valid: an integer >= 1")
    cuda_home = check_cuda_home(args.cuda_home)
    nccl_home, library = check_nccl_home(args.nccl_home or default_nccl_home())
    facts = torch_facts()
    if not facts["cuda"] and not args.allow_cpu_torch:
        raise ConfigError(f"torch {facts['version']} of {sys.executable} is a CPU build; valid: an interpreter "
                          f"with a CUDA build of torch (--python)")
    shim = nccl_shim(library, nccl_home / "include", Path(args.shim))
    for key, value in build_flags(cuda_home, shim, args.jobs, facts["abi"]).items():
        print(f"export {key}={shlex.quote(value)}")
    print(f"# torch {facts['version']} (CUDA {facts['cuda'] or 'none'}, {facts['devices']} device(s)); "
          f"NCCL {library}")
    return 0


# ------------------------------------------------------------------------------------- training
def _model(device):
    import torch

    torch.manual_seed(11)
    net = torch.nn.Sequential(torch.nn.Linear(48, 160), torch.nn.ReLU(), torch.nn.Linear(160, 120),
                              torch.nn.ReLU(), torch.nn.Linear(120, 6))
    return net.to(device)


def _batch(rank: int, step: int, device):
    import torch

    gen = torch.Generator().manual_seed(7919 * rank + step)
    return torch.randn(BATCH, 48, generator=gen).to(device), torch.randn(BATCH, 6, generator=gen).to(device)


def _sgd(params):
    import torch

    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def _device(name: str, local_rank: int):
    import torch

    if name == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: torch sees no GPU here; valid: --device cpu")
        index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def worker_main(args) -> int:
    """One training process: the plugin's DistributedOptimizer on ``--backend``, tensors on ``--device``."""
    import torch

    from byteps_prophet.backends.rendezvous import rendezvous
    from byteps_prophet.torch import DistributedOptimizer

    rank, _size = rendezvous().rank_and_size()
    device = _device(args.device, rank)
    torch.set_num_threads(1)
    net = _model(device)
    opt = DistributedOptimizer(_sgd(net.parameters()), net.named_parameters(), backend=args.backend)
    for step in range(args.steps):
        x, y = _batch(rank, step, device)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    with torch.no_grad():  # the last step's updates land before this forward (layer-wise overlap)
        x, y = _batch(rank, args.steps, device)
        loss = float(torch.nn.functional.mse_loss(net(x), y))
    torch.save({k: v.detach().cpu() for k, v in net.state_dict().items()}, f"{args.out}.rank{rank}.pt")
    print(f"rank {rank} on {device}: loss {loss:.6f}", flush=True)
    opt.close()
    return 0


def reference_main(args) -> int:
    """One process: what ``--workers`` workers must end with (their gradients averaged, the same SGD)."""
    import torch

    device = _device(args.device, 0)
    net = _model(device)
    opt = _sgd(net.parameters())
    for step in range(args.steps):
        total = None
        for rank in range(args.workers):
            net.zero_grad()
            x, y = _batch(rank, step, device)
            torch.nn.functional.mse_loss(net(x), y).backward()
            grads = [p.grad.clone() for p in net.parameters()]
            total = grads if total is None else [a + b for a, b in zip(total, grads)]
        for p, g in zip(net.parameters(), total):
            p.grad = g / args.workers
        opt.step()
    torch.save({k: v.detach().cpu() for k, v in net.state_dict().items()}, args.out)
    return 0


def free_port_pair() -> int:
    """A port P on loopback with P+1 free too (a scheduler's port and the launchers' control port)."""
    import socket

    for _ in range(100):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            if port >= 65535:
                continue
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port
    raise UserError("no two free neighbouring ports on 127.0.0.1")


def _module(*args: str) -> list[str]:
    return [sys.executable, "-m", "byteps_prophet.deploy.gpu", *args]


def _run_allreduce(backend: str, workers: int, train: list[str], env: dict, timeout: float) -> tuple[bool, str]:
    from byteps_prophet.cluster.loopback_torch import run_workers

    lines: list[str] = []
    result = run_workers(train, workers, env=dict(env, BYTEPS_PROPHET_BACKEND=backend), timeout=timeout,
                         output=lambda name, line: lines.append(f"{name} | {line}"))
    return result.ok, result.reason if not result.ok else "\n".join(lines[-4:])


def _run_byteps(train: list[str], env: dict, device: str, timeout: float) -> tuple[bool, str]:
    """Scheduler, server and worker, each started by `byteps-prophet launch` on 127.0.0.1."""
    port = free_port_pair()
    launch = [sys.executable, "-m", "byteps_prophet", "launch", "--scheduler-addr", "127.0.0.1",
              "--scheduler-port", str(port), "--workers", "1", "--servers", "1", "--connect-timeout", "60", "--grace", "2",
              "--timeout", str(int(timeout))]
    cpu_only = "0" if device == "cuda" else "1"
    procs = []
    with tempfile.TemporaryDirectory(prefix="bpp-gpu-") as logs:
        for role, extra in (("scheduler", []), ("server", []),
                            ("worker", ["-e", f"BYTEPS_CPU_ONLY={cpu_only}", "--worker-id", "0", "--", *train])):
            log = open(os.path.join(logs, f"{role}.log"), "w+")
            procs.append((role, log, subprocess.Popen(launch + ["--role", role] + extra, env=env, stdout=log,
                                                      stderr=subprocess.STDOUT, start_new_session=True)))
        deadline = time.monotonic() + timeout + 60
        for role, log, proc in procs:
            try:
                proc.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        ok = all(proc.returncode == 0 for _r, _l, proc in procs)
        texts = {}
        for role, log, _proc in procs:
            log.seek(0)
            texts[role] = log.read()
            log.close()
    if ok:
        return True, "\n".join(texts["worker"].splitlines()[-2:])
    verdict = [line for line in texts["scheduler"].splitlines() if line.startswith("launch: ")]
    return False, (verdict[-1] if verdict else "") + "\n" + texts["worker"][-1500:]


def _compare(reference: dict, params: dict) -> float:
    """The largest absolute difference; a key missing or misshapen is infinitely far."""
    worst = 0.0
    for key, want in reference.items():
        got = params.get(key)
        if got is None or got.shape != want.shape:
            return float("inf")
        worst = max(worst, float((got.double() - want.double()).abs().max()))
    return worst


def run_main(args) -> int:
    import torch

    backends = _choices(args.backends, BACKENDS, "--backends")
    schedulers = _choices(args.schedulers, SCHEDULERS, "--schedulers")
    if args.device not in DEVICES:
        raise ConfigError(f"--device {args.device!r} is invalid; valid: {', '.join(DEVICES)}")
    if args.steps < 1:
        raise ConfigError(f"--steps {args.steps} is invalid; valid: an integer >= 1")
    if args.device == "cpu" and "nccl" in backends:
        raise ConfigError("--backends nccl needs --device cuda; valid on cpu: gloo, byteps")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device cuda: torch {torch.__version__} sees no GPU here; valid: --device cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tolerance = 1e-6 if args.device == "cpu" else 1e-5
    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_SCHEDULER"))}
    references: dict[int, dict] = {}
    rows, failed = [], 0
    started = time.monotonic()
    for backend in backends:
        workers = 1 if backend == "byteps" else (min(2, gpus) if backend == "nccl" else 2)
        if workers not in references:
            path = out / f"reference-{workers}.pt"
            subprocess.run(_module("reference", "--workers", str(workers), "--device", args.device, "--steps",
                                   str(args.steps), "--out", str(path)), check=True, timeout=args.timeout)
            references[workers] = torch.load(path)
        for scheduler in schedulers:
            stem = out / f"{backend}-{scheduler}"
            train = _module("worker", "--backend", backend, "--device", args.device, "--steps", str(args.steps),
                            "--out", str(stem))
            env = dict(base_env, BYTEPS_SCHEDULER=scheduler)
            began = time.monotonic()
            if backend == "byteps":
                ok, detail = _run_byteps(train, env, args.device, args.timeout)
            else:
                ok, detail = _run_allreduce(backend, workers, train, env, args.timeout)
            worst = float("inf")
            if ok:
                try:
                    worst = max(_compare(references[workers], torch.load(f"{stem}.rank{r}.pt"))
                                for r in range(workers))
                except FileNotFoundError as err:
                    ok, detail = False, f"no parameters: {err.filename}"
            good = ok and worst <= tolerance
            failed += not good
            rows.append((backend, workers, scheduler, worst, time.monotonic() - began, good))
            print(f"{backend:<7} {workers} worker(s) {scheduler:<14} max |param - reference| "
                  f"{worst:.2e}  {time.monotonic() - began:5.1f}s  {'OK' if good else 'FAILED'}", flush=True)
            if not ok:
                print("    " + detail.replace("\n", "\n    "), flush=True)
    print(f"gpu check on {args.device} ({gpus} GPU(s), torch {torch.__version__}): {len(rows) - failed} of "
          f"{len(rows)} runs equal the single-process reference within {tolerance:g}, "
          f"{time.monotonic() - started:.0f}s")
    return 1 if failed else 0


def _choices(text: str, valid: tuple[str, ...], what: str) -> list[str]:
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    bad = [part for part in chosen if part not in valid]
    if bad or not chosen:
        raise ConfigError(f"{what} {text!r} is invalid; valid: a comma-separated list of {', '.join(valid)}")
    return chosen


# ------------------------------------------------------------------------------------- command line
class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m byteps_prophet.deploy.gpu", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="action", required=True, parser_class=_Parser)
    flags = sub.add_parser("flags", help="check the toolchain and print the GPU build's environment")
    flags.add_argument("--cuda-home", help="the CUDA toolkit (bin/nvcc, include/cuda_runtime.h)")
    flags.add_argument("--nccl-home", help="NCCL (include/nccl.h, lib/libnccl.so*; default: torch's nvidia-nccl wheel)")
    flags.add_argument("--shim", required=True, help="a directory for NCCL under the names the linker wants")
    flags.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="compilers at once")
    flags.add_argument("--allow-cpu-torch", action="store_true", help="a dry run on a machine without CUDA torch")
    flags.set_defaults(func=flags_main)
    run = sub.add_parser("run", help="train in every configuration and compare with one process")
    run.add_argument("--device", default="cuda", help="cuda or cpu (default cuda)")
    run.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated: gloo, nccl, byteps")
    run.add_argument("--schedulers", default=",".join(SCHEDULERS), help="comma-separated: fifo, bytescheduler, prophet")
    run.add_argument("--steps", type=int, default=5, help="training steps (default 5)")
    run.add_argument("--timeout", type=float, default=180.0, help="seconds per run (default 180)")
    run.add_argument("--out", required=True, help="directory for parameters")
    run.set_defaults(func=run_main)
    worker = sub.add_parser("worker", help="one training process (started by run)")
    worker.add_argument("--backend", required=True, choices=BACKENDS)
    worker.add_argument("--device", required=True, choices=DEVICES)
    worker.add_argument("--steps", type=int, required=True)
    worker.add_argument("--out", required=True)
    worker.set_defaults(func=worker_main)
    reference = sub.add_parser("reference", help="the single-process reference (started by run)")
    reference.add_argument("--workers", type=int, required=True)
    reference.add_argument("--device", required=True, choices=DEVICES)
    reference.add_argument("--steps", type=int, required=True)
    reference.add_argument("--out", required=True)
    reference.set_defaults(func=reference_main)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as err:
        print(f"{parser.prog} {args.action}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
