"""Plain loopback launcher: N worker processes on 127.0.0.1, for tests and for the A/B runner's
fallback when network namespaces are unavailable (no shaping: bandwidth is NOT applied).

Each worker gets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` (a free port) and the
BytePS-style ``DMLC_WORKER_ID``/``DMLC_NUM_WORKER``. The run ends when all exit 0, or as soon as one
fails: the others are stopped and the result names the failed worker, e.g.
``worker-1 failed: killed by SIGKILL (status 137)``.

    python -m byteps_prophet.torch.launch -n 2 [--timeout S] -- python train.py
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from byteps_prophet.cluster.local import free_port


@dataclass
class LaunchResult:
    returncode: int
    failed: str | None
    reason: str
    elapsed: float
    output: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def _describe(name: str, code: int) -> tuple[int, str]:
    if code < 0:
        try:
            signame = signal.Signals(-code).name
        except ValueError:
            signame = f"signal {-code}"
        return 128 - code, f"{name} failed: killed by {signame} (status {128 - code})"
    return code, f"{name} failed: exited with status {code}"


def run_workers(argv: Sequence[str], workers: int, env: Mapping[str, str] | None = None,
                timeout: float | None = None, output: Callable[[str, str], None] | None = None,
                per_worker_env: Callable[[int], Mapping[str, str]] | None = None) -> LaunchResult:
    port = free_port()
    base = dict(os.environ)
    base.update(env or {})
    procs: list[tuple[str, subprocess.Popen]] = []
    lines: dict[str, list[str]] = {}
    start = time.monotonic()
    readers = []
    for rank in range(workers):
        name = f"worker-{rank}"
        role_env = dict(base, RANK=str(rank), WORLD_SIZE=str(workers), MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=str(port), DMLC_WORKER_ID=str(rank), DMLC_NUM_WORKER=str(workers),
                        LOCAL_RANK="0", PYTHONUNBUFFERED="1")
        if per_worker_env:
            role_env.update(per_worker_env(rank))
        proc = subprocess.Popen(list(argv), env=role_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        procs.append((name, proc))
        lines[name] = []

        def read(name=name, proc=proc):
            for line in proc.stdout:
                line = line.rstrip("\n")
                lines[name].append(line)
                if output:
                    output(name, line)
        t = threading.Thread(target=read, daemon=True)
        t.start()
        readers.append(t)

    def stop_all():
        for _, p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 2
        for _, p in procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()

    try:
        while True:
            codes = [(name, p.poll()) for name, p in procs]
            bad = [(name, code) for name, code in codes if code not in (None, 0)]
            if bad:
                name, code = bad[0]
                status, reason = _describe(name, code)
                stop_all()
                break
            if all(code == 0 for _, code in codes):
                status, reason, name = 0, f"all {workers} workers finished", None
                break
            if timeout is not None and time.monotonic() - start > timeout:
                stop_all()
                status, reason, name = 124, f"timeout after {timeout:g}s", None
                break
            time.sleep(0.05)
    except BaseException:
        stop_all()
        raise
    for t in readers:
        t.join(2)
    return LaunchResult(status, name, reason, time.monotonic() - start, lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m byteps_prophet.torch.launch")
    parser.add_argument("-n", "--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("a command is required after --")
    result = run_workers(command, args.workers, timeout=args.timeout,
                         output=lambda name, line: print(f"{name} | {line}", flush=True))
    if not result.ok:
        print(f"launch: {result.reason}", file=sys.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
