"""The cluster's processes: how roles are started, watched and stopped, and how a run ends.

A :class:`Job` is one run's roles (scheduler, servers, workers), each a :class:`RoleProcess` whose
output is drained line by line; :meth:`Job.poll` decides when the run has ended and why (a failed
role, the workers done, a role gone early, the timeout), and stops what is left. Where the roles run
(namespaces, links) is the cluster's business (``cluster/local.py``, ``cluster/shaped_network.py``).
"""
from __future__ import annotations

import collections
import concurrent.futures
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

OutputSink = Callable[[str, str], None]

# PID 1 of the role's own PID and mount namespaces: mount a private tmpfs on /dev/shm, run the role's
# command as an ordinary process (PID 1 would be immune to its own signals, e.g. a `kill -9 $$`),
# forward SIGTERM to it and exit with its status; the kernel then kills anything it left behind.
# BytePS's unix sockets (BYTEPS_SOCKET_PATH, /tmp by default, shared by every host here) go to that
# private tmpfs too, unless the run sets them: no two hosts collide and a killed role leaves none.
INIT_SCRIPT = (
    'mount -t tmpfs -o mode=1777 bpp-shm /dev/shm || exit 125\n'
    'export BYTEPS_SOCKET_PATH="${BYTEPS_SOCKET_PATH:-/dev/shm/bpp-sockets}"\n'
    'mkdir -p "$BYTEPS_SOCKET_PATH" || exit 125\n'
    '"$@" & child=$!\n'
    'trap \'kill -TERM $child 2>/dev/null\' TERM INT HUP\n'
    'while :; do wait $child; status=$?; kill -0 $child 2>/dev/null || exit $status; done\n'
)
ISOLATE = ["unshare", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc",
            "--propagation", "private", "--"]


@dataclass
class RunResult:
    returncode: int                  # 0, the failing role's status (128+signal if killed), 124 on timeout
    failed: str | None               # name of the role that ended the run, if it failed
    reason: str                      # one line: what happened
    elapsed: float                   # seconds from launch until everything had stopped
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    output: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def _status_code(code: int) -> int:
    return 128 - code if code < 0 else code


def _signal_name(number: int) -> str | None:
    try:
        return signal.Signals(number).name
    except ValueError:
        return None


def describe_exit(name: str, code: int) -> str:
    """``-9`` (Popen) or ``137`` (the shell's 128+N, as the role's init reports it) -> killed by SIGKILL."""
    if code < 0:
        return f"{name} was killed by {_signal_name(-code) or f'signal {-code}'}"
    if code > 128 and _signal_name(code - 128):
        return f"{name} was killed by {_signal_name(code - 128)} (status {code})"
    return f"{name} exited with status {code}"


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (for a scheduler, a gloo rendezvous, ...)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PrintSink:
    """Writes ``name | line`` to a stream, one whole line at a time."""

    def __init__(self, stream=None, width: int = 9):
        self._stream = stream
        self._width = width
        self._lock = threading.Lock()

    def __call__(self, name: str, line: str) -> None:
        stream = self._stream or sys.stdout
        with self._lock:
            stream.write(f"{name:<{self._width}} | {line}\n")
            stream.flush()


class Spawner:
    """Starts every role from one long-lived thread.

    The roles carry a parent-death signal (setpriv --pdeathsig), which the kernel ties to the thread
    that forked them; forking from this thread makes them die with the controller process, not with
    whichever caller thread happened to launch them.
    """

    def __init__(self):
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="bpp-cluster-spawner", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, future = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as err:  # noqa: BLE001 - handed to the caller
                    future.set_exception(err)

    def call(self, fn):
        """Run ``fn`` on the spawner thread; if the caller is interrupted, still wait for ``fn`` to end
        (so that nothing it starts can be missed by the clean-up that follows) before re-raising."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((fn, future))
        try:
            return future.result()
        except BaseException:
            concurrent.futures.wait([future], timeout=60)
            raise

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)


class RoleProcess:
    def __init__(self, host, proc: subprocess.Popen, sink: OutputSink | None, keep: int = 2000):
        self.host = host  # the cluster's Host: its name and role
        self.proc = proc
        self.lines: collections.deque[str] = collections.deque(maxlen=keep)
        self._sink = sink
        self.reader = threading.Thread(target=self._read, name=f"bpp-{host.name}-output", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        stream = self.proc.stdout
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            self.lines.append(line)
            if self._sink is not None:
                try:
                    self._sink(self.host.name, line)
                except Exception:  # noqa: BLE001 - a broken sink must not stop the draining
                    self._sink = None
        stream.close()

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


@dataclass(frozen=True)
class Ending:
    """How a job ends its roles (``ClusterSpec``'s fields of the same names) and what it sweeps after."""

    grace: float              # how long scheduler/servers may linger after the workers
    exit_grace: float         # how long workers may run on after the scheduler or a server exited cleanly
    stop_grace: float         # SIGTERM -> SIGKILL
    sweep_groups: bool        # no PID namespace per role: kill each role's process group after it
    kill_leftovers: Callable[[], None]  # kill whatever is left in the hosts


class Job:
    """One run of scheduler, servers and workers on the cluster's hosts."""

    def __init__(self, roles: list[RoleProcess], timeout: float | None, ending: Ending):
        self._ending = ending
        self.roles = roles
        self.started = time.monotonic()
        self.timeout = timeout
        self.result: RunResult | None = None
        self._early_since: float | None = None
        self._workers_done_at: float | None = None
        self._lock = threading.Lock()

    @property
    def names(self) -> list[str]:
        return [role.host.name for role in self.roles]

    def _finish(self, returncode: int, failed: str | None, reason: str) -> RunResult:
        self._stop_all()
        self.result = RunResult(
            returncode=returncode, failed=failed, reason=reason,
            elapsed=time.monotonic() - self.started,
            exit_codes={r.host.name: r.proc.returncode for r in self.roles},
            output={r.host.name: list(r.lines) for r in self.roles},
        )
        return self.result

    def _stop_all(self) -> None:
        grace = self._ending.stop_grace
        running = [r for r in self.roles if r.proc.poll() is None]
        for role in running:
            role.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while running and time.monotonic() < deadline:
            running = [r for r in running if r.proc.poll() is None]
            time.sleep(0.02)
        for role in running:
            role.signal(signal.SIGKILL)
        for role in self.roles:
            try:
                role.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self._ending.sweep_groups:
            # No PID namespace to collapse: sweep each role's process group for children that
            # outlived the role's main process.
            for role in self.roles:
                role.signal(signal.SIGKILL)
        self._ending.kill_leftovers()
        for role in self.roles:
            role.reader.join(timeout=2)

    def poll(self) -> RunResult | None:
        """Check the roles once; returns the result when the run has ended (and stops what is left)."""
        with self._lock:
            if self.result is not None:
                return self.result
            now = time.monotonic()
            codes = {r.host.name: r.proc.poll() for r in self.roles}
            order = sorted(self.roles, key=lambda r: {"worker": 0, "server": 1, "scheduler": 2}[r.host.role])
            for role in order:
                code = codes[role.host.name]
                if code not in (None, 0):
                    return self._finish(_status_code(code), role.host.name,
                                        describe_exit(role.host.name, code))
            workers = [r for r in self.roles if r.host.role == "worker"]
            others = [r for r in self.roles if r.host.role != "worker"]
            if all(codes[r.host.name] == 0 for r in workers):
                if self._workers_done_at is None:
                    self._workers_done_at = now
                lingering = [r.host.name for r in others if codes[r.host.name] is None]
                if not lingering:
                    return self._finish(0, None, f"all {len(workers)} workers succeeded")
                if now - self._workers_done_at > self._ending.grace:
                    return self._finish(0, None, f"all {len(workers)} workers succeeded "
                                                 f"(stopped {', '.join(lingering)} after {self._ending.grace:g}s)")
                return None
            early = [r.host.name for r in others if codes[r.host.name] == 0]
            if early:
                if self._early_since is None:
                    self._early_since = now
                elif now - self._early_since > self._ending.exit_grace:
                    running = [r.host.name for r in workers if codes[r.host.name] is None]
                    return self._finish(1, early[0], f"{early[0]} exited before the workers finished "
                                                     f"({', '.join(running)} still running)")
            if self.timeout is not None and now - self.started > self.timeout:
                running = [name for name, code in codes.items() if code is None]
                return self._finish(124, None, f"timed out after {self.timeout:g}s "
                                               f"(still running: {', '.join(running)})")
            return None

    def wait(self, timeout: float | None = None) -> RunResult:
        """Block until the run ends. ``timeout`` (seconds) overrides the launch timeout; Ctrl-C stops all."""
        if timeout is not None:
            self.timeout = timeout
        try:
            while True:
                result = self.poll()
                if result is not None:
                    return result
                time.sleep(0.05)
        except BaseException:
            self.stop("interrupted")
            raise

    def stop(self, reason: str = "stopped") -> RunResult:
        with self._lock:
            if self.result is not None:
                return self.result
            return self._finish(130 if reason == "interrupted" else 143, None, reason)
