"""Container agent: ``python -m byteps_prophet.cluster.agent COMMAND...`` (the Docker entrypoint's last step).

Under a container engine each cluster host is one container, and the engine knows nothing of the
job: a worker that dies leaves the scheduler, the servers and the other workers waiting on each other
for ever, and `docker-compose up` waits with them. The agent gives compose what the local cluster
(``byteps-prophet cluster run``) has: the run ends when it succeeded or as soon as any role failed,
naming the role, and it never hangs.

One agent runs in every container, with the role's command as its child (own process group). The
agent of ``CLUSTER_COORDINATOR`` (default ``worker-0``; the host name is ``CLUSTER_HOST``, else the
container's) is the coordinator: the others connect to it (``CLUSTER_COORDINATOR_ADDRESS``, else its
name) on ``CLUSTER_AGENT_PORT`` (9999) and report. The coordinator

* waits until every host of the topology (the scheduler, ``DMLC_NUM_SERVER`` servers,
  ``DMLC_NUM_WORKER`` workers) has connected (``CLUSTER_CONNECT_TIMEOUT``, 300 s);
* runs the job's ps-lite sessions one after the other: session 0 runs every container's command;
  when ``TRAIN_COMMAND`` is set, session 1 runs it on the workers (a shell-style string) while the
  scheduler and servers run their command again. A ps-lite job serves one session (workers
  finalize, servers and scheduler exit), so each session gets a fresh scheduler and servers, and the
  next starts only after every role of the previous one is gone;
* ends the run when every session succeeded (exit 0), or at once when a role exits non-zero, a
  container vanishes without reporting (killed, out of memory) or a scheduler/server ends while
  workers still run (after ``CLUSTER_GRACE``, 10 s); ``CLUSTER_TIMEOUT`` (seconds, none by default)
  bounds the whole run. Its last line names the culprit, e.g.
  ``agent: server-0 failed: exit status 1 in session 0 (selftest); run ended (exit 1)``, and it exits
  with that status. The others stop their role and exit 0 when told the run is over; a container
  whose own role failed exits with that role's status.

So ``docker-compose up`` always ends, and ``--exit-code-from worker-0`` (or
``--abort-on-container-exit``) makes its exit status the run's. SIGTERM (``docker stop``, compose's
abort) stops the role and exits 143, or with the run's status when it is already decided.
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time

from byteps_prophet.backends.rendezvous import rendezvous
from byteps_prophet.cluster.container import container
from byteps_prophet.errors import ConfigError

STOP_GRACE = 3.0


def say(text: str) -> None:
    print(f"agent: {text}", file=sys.stderr, flush=True)


def _describe_status(status: int) -> str:
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}"


def _exit_code(status: int) -> int:
    return 128 - status if status < 0 else status


class Role:
    """The role's command as a child in its own process group."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def start(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, start_new_session=True)

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, STOP_GRACE), (signal.SIGKILL, STOP_GRACE)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


class Channel:
    """Newline-delimited JSON over one TCP connection."""

    def __init__(self, sock: socket.socket, name: str = "?") -> None:
        self.sock, self.name, self.buffer = sock, name, b""

    def send(self, **message) -> None:
        try:
            self.sock.sendall(json.dumps(message).encode() + b"\n")
        except OSError:
            pass  # a peer that is gone is noticed by its reader

    def receive(self) -> list[dict] | None:
        """Messages now readable; None at end of stream."""
        try:
            data = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError:
            data = b""
        if not data:
            return None
        self.buffer += data
        lines = self.buffer.split(b"\n")
        self.buffer = lines.pop()
        return [json.loads(line) for line in lines if line.strip()]


class Agent:
    def __init__(self, argv: list[str], environ=None) -> None:
        job, where = container(environ), rendezvous(environ)
        self.argv = argv
        self.name = job.host or socket.gethostname()
        self.role_name = where.role
        self.coordinator = job.coordinator
        self.coordinator_address = job.coordinator_address or self.coordinator
        self.port = job.agent_port
        self.connect_timeout = job.connect_timeout
        self.grace = job.grace
        self.timeout = job.timeout
        self.train = (job.train_command or []) if self.role_name == "worker" else []
        self.workers = where.num_workers(1)
        self.servers = where.num_servers(1)
        self.role = Role()
        self.verdict: int | None = None
        signal.signal(signal.SIGTERM, self._on_term)

    # ------------------------------------------------------------------ both sides
    def _on_term(self, signum, frame) -> None:
        self.role.stop()
        status = self.verdict if self.verdict is not None else 128 + signum
        say(f"{self.name}: stopped from outside (SIGTERM); exit {status}")
        raise SystemExit(status)  # unwinds the main thread (it has no other) from wherever it waits

    def command(self, session: int) -> list[str]:
        if session == 0 or self.role_name != "worker":
            return self.argv
        return self.train

    @staticmethod
    def session_name(session: int) -> str:
        return "selftest" if session == 0 else "training"

    # ------------------------------------------------------------------ peers
    def run_peer(self) -> int:
        deadline = time.monotonic() + self.connect_timeout
        sock = None
        while sock is None:
            try:
                sock = socket.create_connection((self.coordinator_address, self.port), timeout=2.0)
            except OSError as err:
                if time.monotonic() > deadline:
                    say(f"{self.name}: cannot reach the coordinator {self.coordinator}:{self.port} after "
                        f"{self.connect_timeout:g}s ({err}); is its container running?")
                    return 1
                time.sleep(0.3)
        sock.setblocking(False)
        channel = Channel(sock, self.coordinator)
        channel.send(hello=self.name, role=self.role_name)
        selector = selectors.DefaultSelector()
        selector.register(sock, selectors.EVENT_READ)
        session, reported, told_to_stop = -1, True, False
        while True:
            if not reported:
                status = self.role.poll()
                if status is not None:
                    channel.send(exit=status, session=session)
                    reported = True
                    if status != 0 and not told_to_stop:  # the failing container ends first: compose names it
                        say(f"{self.name}: role {_describe_status(status)} in session {session}")
                        selector.close()
                        return _exit_code(status)
            for _key, _ in selector.select(0.2):
                messages = channel.receive()
                if messages is None:
                    self.role.stop()
                    say(f"{self.name}: lost the coordinator {self.coordinator} (its container ended); "
                        f"role stopped")
                    return 1
                for message in messages:
                    if "run" in message:
                        session, reported, told_to_stop = int(message["run"]), False, False
                        self.role.start(self.command(session))
                    elif "stop" in message:
                        told_to_stop = True
                        self.role.stop()
                    elif "end" in message:
                        self.verdict = 0
                        self.role.stop()
                        return 0

    # ------------------------------------------------------------------ coordinator
    def expected(self) -> int:
        return 1 + self.servers + self.workers - 1  # scheduler, servers, the other workers

    def run_coordinator(self) -> int:
        listener = socket.create_server(("", self.port), reuse_port=False)
        listener.setblocking(False)
        selector = selectors.DefaultSelector()
        selector.register(listener, selectors.EVENT_READ, None)
        peers: dict[str, Channel] = {}
        roles: dict[str, str] = {self.name: self.role_name}
        start = time.monotonic()
        sessions = 2 if self.train else 1

        def fail(status: int, reason: str) -> int:
            self.verdict = status
            for channel in peers.values():
                channel.send(end=status, reason=reason)
            self.role.stop()
            say(f"{reason}; run ended (exit {status})")
            return status

        def overdue() -> bool:
            return self.timeout is not None and time.monotonic() - start > self.timeout

        # 1. every host connects
        deadline = start + self.connect_timeout
        while len(peers) < self.expected():
            if time.monotonic() > deadline:
                missing = self.expected() - len(peers)
                return fail(1, f"{missing} host(s) never reached the coordinator in "
                               f"{self.connect_timeout:g}s (connected: {', '.join(sorted(peers)) or 'none'})")
            for key, _ in selector.select(0.2):
                if key.data is None:
                    conn, _addr = listener.accept()
                    conn.setblocking(False)
                    channel = Channel(conn)
                    selector.register(conn, selectors.EVENT_READ, channel)
                    continue
                channel = key.data
                messages = channel.receive()
                if messages is None:
                    selector.unregister(channel.sock)
                    if channel.name in peers:
                        return fail(1, f"{channel.name} failed: its container ended before the job started")
                    continue
                for message in messages:
                    if "hello" in message:
                        channel.name = str(message["hello"])
                        roles[channel.name] = str(message.get("role", ""))
                        peers[channel.name] = channel
        say(f"all {len(peers) + 1} hosts connected after {time.monotonic() - start:.1f}s")

        # 2. the sessions
        for session in range(sessions):
            what = self.session_name(session)
            status: dict[str, int | None] = {name: None for name in roles}
            stopped: set[str] = set()
            servers_done_at: float | None = None
            workers_done_at: float | None = None
            for channel in peers.values():
                channel.send(run=session)
            self.role.start(self.command(session))
            began = time.monotonic()
            while any(status[name] is None for name in status):
                if overdue():
                    return fail(124, f"the run took longer than CLUSTER_TIMEOUT={self.timeout:g}s "
                                     f"(in session {session}, {what})")
                own = self.role.poll()
                if own is not None and status[self.name] is None:
                    status[self.name] = own
                for key, _ in selector.select(0.2):
                    if key.data is None:
                        conn, _addr = listener.accept()  # a stray connection: not part of the job
                        conn.close()
                        continue
                    channel = key.data
                    messages = channel.receive()
                    if messages is None:
                        selector.unregister(channel.sock)
                        if status.get(channel.name) in (None, 0):
                            return fail(1, f"{channel.name} failed: its container ended without "
                                           f"reporting (killed?) in session {session} ({what})")
                        continue
                    for message in messages:
                        if "exit" in message and int(message.get("session", -1)) == session:
                            status[channel.name] = int(message["exit"])
                for name, code in status.items():
                    if code is not None and code != 0 and name not in stopped:
                        return fail(_exit_code(code), f"{name} failed: {_describe_status(code)} in session "
                                                      f"{session} ({what})")
                workers = [n for n, r in roles.items() if r == "worker"]
                others = [n for n in roles if n not in workers]
                now = time.monotonic()
                if all(status[n] is not None for n in workers):
                    workers_done_at = workers_done_at or now
                    lingering = [n for n in others if status[n] is None and n not in stopped]
                    if lingering and now - workers_done_at > self.grace:
                        say(f"{', '.join(lingering)} still running {self.grace:g}s after the workers "
                            f"finished session {session}: stopped")
                        for name in lingering:
                            stopped.add(name)
                            peers[name].send(stop=session)
                elif any(status[n] is not None for n in others):
                    servers_done_at = servers_done_at or now
                    if now - servers_done_at > self.grace:
                        ended = [n for n in others if status[n] is not None]
                        return fail(1, f"{', '.join(ended)} ended while workers still run in session "
                                       f"{session} ({what})")
            say(f"session {session} ({what}) done in {time.monotonic() - began:.1f}s")
        self.verdict = 0
        for channel in peers.values():
            channel.send(end=0, reason="done")
        say(f"run succeeded: {sessions} session(s) on {len(roles)} hosts in {time.monotonic() - start:.1f}s")
        return 0

    def run(self) -> int:
        if self.name == self.coordinator:
            return self.run_coordinator()
        return self.run_peer()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        say("usage: python -m byteps_prophet.cluster.agent COMMAND...")
        return 2
    try:
        agent = Agent(argv)
    except ConfigError as err:
        say(f"error: {err}")
        return 2
    if agent.role_name not in ("scheduler", "server", "worker"):
        say(f"error: DMLC_ROLE={agent.role_name!r} is not a role; valid: scheduler, server, worker")
        return 2
    status = agent.run()
    # The run is decided. A SIGTERM from now on (compose stopping the containers of a finished run)
    # must not end the exit with 143: the interpreter restores the default action of a handled signal
    # as it shuts down, but leaves an ignored one ignored.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return status


if __name__ == "__main__":
    sys.exit(main())
