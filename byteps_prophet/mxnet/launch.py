"""Run an MXNet ps-lite job on 127.0.0.1 (scheduler, servers, workers as local processes).

For tests and quick runs without namespaces or shaping (``byteps-prophet cluster run --engine mxnet``
is the shaped, multi-host version). ``run_local`` picks a free port, starts every role in its own
process group, ends the whole job as soon as any role exits non-zero (naming it), at the timeout, or
when every worker has exited 0, and leaves no process behind.

``python -m byteps_prophet.mxnet.launch -w 2 -s 1 [--timeout S] -- COMMAND...``
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

from byteps_prophet.cluster.local import free_port

SERVER_CODE = "import mxnet"  # with DMLC_ROLE=scheduler/server, importing mxnet runs the role


@dataclass
class LocalResult:
    returncode: int
    failed: str | None  # the role that ended the run ("worker-1"), None when all went well
    reason: str
    elapsed: float
    output: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def lines(self, role: str) -> list[str]:
        return self.output.get(role, [])


def _describe(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name} (status {128 - rc})"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited with status {rc}"


def run_local(command: list[str], workers: int = 2, servers: int = 1, env: dict | None = None,
              timeout: float = 300.0, grace: float = 10.0, echo: bool = False) -> LocalResult:
    port = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith("DMLC_")}
    base.update(env or {})
    base.update(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(port), DMLC_NUM_WORKER=str(workers),
                DMLC_NUM_SERVER=str(servers), PYTHONUNBUFFERED="1", DMLC_NODE_HOST="127.0.0.1")
    roles: list[tuple[str, list[str], dict]] = [("scheduler", [sys.executable, "-c", SERVER_CODE],
                                                 dict(base, DMLC_ROLE="scheduler"))]
    roles += [(f"server-{i}", [sys.executable, "-c", SERVER_CODE], dict(base, DMLC_ROLE="server"))
              for i in range(servers)]
    roles += [(f"worker-{i}", list(command), dict(base, DMLC_ROLE="worker", DMLC_WORKER_ID=str(i)))
              for i in range(workers)]
    output: dict[str, list[str]] = {name: [] for name, _, _ in roles}
    procs: dict[str, subprocess.Popen] = {}
    readers = []
    start = time.monotonic()

    def pump(name: str, stream) -> None:
        for raw in stream:
            line = raw.rstrip("\n")
            output[name].append(line)
            if echo:
                print(f"{name:10s}| {line}", flush=True)

    try:
        for name, argv, role_env in roles:
            proc = subprocess.Popen(argv, env=role_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, text=True, start_new_session=True)
            procs[name] = proc
            thread = threading.Thread(target=pump, args=(name, proc.stdout), daemon=True)
            thread.start()
            readers.append(thread)
        failed, reason, rc = None, "", 0
        workers_done_at = service_gone_at = None
        while True:
            now = time.monotonic()
            for name, proc in procs.items():
                code = proc.poll()
                if code is not None and code != 0 and failed is None:
                    failed, rc = name, (128 - code if code < 0 else code)
                    reason = f"{name} {_describe(code)}"
            if failed:
                break
            worker_codes = [procs[n].poll() for n in procs if n.startswith("worker-")]
            if all(c == 0 for c in worker_codes):
                workers_done_at = workers_done_at or now
                if all(p.poll() is not None for p in procs.values()) or now - workers_done_at > grace:
                    reason = "all workers exited 0"
                    break
            else:
                gone = [n for n, p in procs.items() if not n.startswith("worker-") and p.poll() is not None]
                if gone:  # workers may be finishing; a stuck one is ended after ``grace``
                    service_gone_at = service_gone_at or now
                    if now - service_gone_at > grace:
                        failed, rc, reason = gone[0], 1, f"{gone[0]} exited while workers still ran"
                        break
            if now - start > timeout:
                failed, rc, reason = "timeout", 124, f"timed out after {timeout:.0f}s"
                break
            time.sleep(0.05)
    finally:
        _stop_all(procs)
        for thread in readers:
            thread.join(timeout=2)
    return LocalResult(rc, failed, reason, time.monotonic() - start, output)


def _stop_all(procs: dict[str, subprocess.Popen], grace: float = 2.0) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in procs.values():
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in procs.values():
        _signal_group(proc, signal.SIGKILL)  # the group: children a role started go too
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m byteps_prophet.mxnet.launch", description=__doc__.split("\n")[0])
    parser.add_argument("-w", "--workers", type=int, default=2)
    parser.add_argument("-s", "--servers", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("a worker COMMAND is required after --")
    result = run_local(command, args.workers, args.servers, timeout=args.timeout, echo=True)
    if not result.ok:
        print(f"launch: {result.failed} failed: {result.reason}; everything stopped after {result.elapsed:.2f}s "
              f"(exit {result.returncode})", file=sys.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
