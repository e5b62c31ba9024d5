"""Start the hosts of a multi-host job as separate `byteps-prophet launch` processes and watch them.

Attached hosts are children of the test (loopback tests). Detached ones (the namespace test) are
started by `setsid --fork` inside their namespace: each is its own process tree, no parent shared
with the others or the test; their exit status comes back through a file.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from byteps_prophet.deploy.gpu import free_port_pair  # noqa: F401 - the tests take it from here

LAUNCH = [sys.executable, "-m", "byteps_prophet", "launch"]


@dataclass
class HostProc:
    name: str
    log: str
    proc: subprocess.Popen | None = None   # attached
    rc_file: str | None = None             # detached
    ended_at: float | None = None

    def poll(self) -> int | None:
        if self.proc is not None:
            return self.proc.poll()
        try:
            with open(self.rc_file) as f:
                text = f.read().strip()
        except OSError:
            return None
        return int(text) if text else None

    def output(self) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def last_line(self) -> str:
        lines = [line for line in self.output().splitlines() if line.startswith("launch: ")]
        return lines[-1] if lines else ""


@dataclass
class Hosts:
    tmp: str
    hosts: dict[str, HostProc] = field(default_factory=dict)

    def start(self, name: str, argv: list[str], env=None) -> HostProc:
        log = os.path.join(self.tmp, f"{name}.log")
        with open(log, "w") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env=env)
        self.hosts[name] = HostProc(name, log, proc=proc)
        return self.hosts[name]

    def start_detached(self, name: str, netns: str, argv: list[str]) -> HostProc:
        log = os.path.join(self.tmp, f"{name}.log")
        rc = os.path.join(self.tmp, f"{name}.rc")
        script = f"{shlex.join(argv)} >{shlex.quote(log)} 2>&1; echo $? >{shlex.quote(rc)}.tmp; " \
                 f"mv {shlex.quote(rc)}.tmp {shlex.quote(rc)}"
        subprocess.run(["ip", "netns", "exec", netns, "setsid", "--fork", "sh", "-c", script], check=True,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.hosts[name] = HostProc(name, log, rc_file=rc)
        return self.hosts[name]

    def wait(self, timeout: float, names=None) -> dict[str, int | None]:
        chosen = [self.hosts[n] for n in (names or self.hosts)]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for host in chosen:
                if host.ended_at is None and host.poll() is not None:
                    host.ended_at = time.monotonic()
            if all(h.ended_at is not None for h in chosen):
                break
            time.sleep(0.05)
        return {h.name: h.poll() for h in chosen}

    def kill_all(self) -> None:
        for host in self.hosts.values():
            if host.proc is not None and host.proc.poll() is None:
                try:
                    os.killpg(host.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                host.proc.wait(10)

    def report(self) -> str:
        return "\n".join(f"--- {h.name} (exit {h.poll()})\n{h.output()[-3000:]}" for h in self.hosts.values())
