"""The launcher of the scheduler host: the job's coordinator (``deploy/launch.py`` says what it does).

It gathers every server's and worker's launcher on the control port, checks they agree on the
topology, starts the job, and ends it: every worker done, a role failed, a host lost, the timeout.
"""
from __future__ import annotations

import selectors
import socket
import time
from dataclasses import dataclass, field
from typing import Mapping

from byteps_prophet.backends.rendezvous import ORDER_CHANNEL_PORT
from byteps_prophet.cluster.agent import Channel
from byteps_prophet.cluster.roles import host_name
from byteps_prophet.deploy.role import (
    EXIT_GRACE, HEARTBEAT_S, JobEnded, Launcher, describe_status, exit_code, say, source_address,
)
from byteps_prophet.errors import ConfigError


@dataclass
class Peer:
    channel: Channel
    address: str
    name: str = "?"
    role: str = ""
    node_host: str = ""
    last_heard: float = field(default_factory=time.monotonic)
    status: int | None = None
    stopped: bool = False

    @property
    def label(self) -> str:
        return f"{self.name} ({self.node_host or self.address})"


class Coordinator(Launcher):
    """The scheduler host's launcher: runs the scheduler role and decides the job."""

    def _launch(self) -> int:
        spec = self.spec
        try:
            node_host = spec.node_host or source_address(spec.scheduler_addr, spec.port)
        except OSError as err:
            raise ConfigError(f"--scheduler-addr {spec.scheduler_addr!r} does not resolve here ({err}); "
                              f"valid: this host's address or a name for it") from None
        try:
            listener = socket.create_server(("", spec.control_port))
        except OSError as err:
            raise ConfigError(f"--control-port {spec.control_port}: cannot listen ({err.strerror or err}); "
                              f"valid: a free port on the scheduler host") from None
        listener.setblocking(False)
        self.selector.register(listener, selectors.EVENT_READ, None)
        peers: list[Peer] = []
        started = time.monotonic()
        expected = spec.servers + spec.workers
        say(f"scheduler at {node_host}:{spec.port}: waiting for {spec.servers} server(s) and {spec.workers} "
            f"worker(s) on control port {spec.control_port}")
        try:
            try:
                self._gather(listener, peers, started, expected)
                self._start_all(peers, node_host)
                status, reason = self._supervise(listener, peers, started)
            except JobEnded as end:
                status, reason = end.status, end.reason
            for peer in peers:
                peer.channel.send(end=status, reason=reason)
            self.role.stop()
            say(f"{reason}; job ended (exit {status})")
            return status
        except BaseException:  # Ctrl-C, SIGTERM: every host stops its role
            for peer in peers:
                peer.channel.send(end=130, reason="the scheduler host's launcher was stopped")
            raise
        finally:
            listener.close()

    def _beat(self, peers: list[Peer], last: list[float]) -> None:
        now = time.monotonic()
        if now - last[0] >= HEARTBEAT_S:
            for peer in peers:
                peer.channel.send(beat=1)
            last[0] = now
        for peer in peers:
            if now - peer.last_heard > self.spec.heartbeat_timeout and not (peer.status is not None and peer.stopped):
                raise JobEnded(1, f"{peer.label} lost: no word from its launcher for "
                                  f"{self.spec.heartbeat_timeout:g}s (host down or unreachable)")

    def _receive(self, listener, peers: list[Peer], accepting: bool) -> list[tuple[Peer, dict]]:
        got: list[tuple[Peer, dict]] = []
        for key, _ in self.selector.select(0.1):
            if key.data is None:
                try:
                    conn, addr = listener.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                if not accepting:  # a host launched after the job started: tell it, not part of this job
                    Channel(conn).send(reject="the job had already started without it (every host must be "
                                              "launched before the scheduler host starts the job)")
                    conn.close()
                    continue
                conn.setblocking(False)
                peer = Peer(Channel(conn), addr[0])
                peers.append(peer)
                self.selector.register(conn, selectors.EVENT_READ, peer)
                continue
            peer = key.data
            try:
                messages = peer.channel.receive()
            except ValueError:  # not our wire format: a stranger's connection is dropped, a host's line ignored
                messages = None if peer.name == "?" else []
            if messages is None:
                self.selector.unregister(peer.channel.sock)
                peers.remove(peer)
                peer.channel.sock.close()
                if peer.name == "?":
                    continue  # never said hello: a stray connection
                if peer.status not in (None, 0):
                    raise JobEnded(exit_code(peer.status), f"{peer.label} failed: {describe_status(peer.status)}")
                if peer.status == 0 and peer.stopped:
                    continue
                raise JobEnded(1, f"{peer.label} lost: its launcher's connection closed (killed?)")
            peer.last_heard = time.monotonic()
            got += [(peer, message) for message in messages]
        return got

    def _gather(self, listener, peers: list[Peer], started: float, expected: int) -> None:
        spec = self.spec
        last = [0.0]
        taken: dict[str, Peer] = {}
        while len(taken) < expected:
            if time.monotonic() - started > spec.connect_timeout:
                missing = self._missing(taken)
                raise JobEnded(1, f"{', '.join(missing)} never reached the scheduler host in "
                                  f"{spec.connect_timeout:g}s (connected: {', '.join(sorted(taken)) or 'none'})")
            try:
                messages = self._receive(listener, peers, accepting=True)
            except JobEnded as end:
                raise JobEnded(end.status, end.reason.replace(" lost:", " left before the job started:"))
            for peer, message in messages:
                if "hello" in message and peer.name == "?":
                    try:
                        self._welcome(peer, message, taken)
                    except (TypeError, ValueError):  # a hello we cannot read: not one of our launchers
                        self.selector.unregister(peer.channel.sock)
                        peer.channel.sock.close()
                        peers.remove(peer)
            self._beat([p for p in peers if p.name != "?"], last)

    def _missing(self, taken: Mapping[str, Peer]) -> list[str]:
        names = [host_name("server", i) for i in range(self.spec.servers)]
        names += [host_name("worker", i) for i in range(self.spec.workers)]
        return [name for name in names if name not in taken]

    def _welcome(self, peer: Peer, hello: dict, taken: dict[str, Peer]) -> None:
        spec = self.spec
        role = str(hello.get("role", ""))
        peer.role, peer.node_host = role, str(hello.get("node_host") or peer.address)
        where = f"{role} at {peer.node_host}"
        mine = {"workers": spec.workers, "servers": spec.servers, "engine": spec.engine}
        for key, value in mine.items():
            if hello.get(key) != value:
                raise JobEnded(2, f"{where} was launched with {key} {hello.get(key)!r}, the scheduler with "
                                  f"{value!r}: every host must be launched with the same --workers, "
                                  f"--servers and --engine")
        if role == "worker":
            name = host_name("worker", int(hello.get("index", 0)))
        elif role == "server":
            index = hello.get("index")
            if index is None:  # the next free server number
                index = next(i for i in range(spec.servers + 1) if host_name("server", i) not in taken)
            name = host_name("server", int(index))
        else:
            raise JobEnded(2, f"{where} is a second scheduler; valid: one scheduler per job")
        if name in taken:
            other = taken[name]
            raise JobEnded(2, f"{name} was launched twice ({other.node_host or other.address} and "
                              f"{peer.node_host}); valid: each worker id (and server id) once")
        if role == "server" and int(name.split("-")[1]) >= spec.servers:
            raise JobEnded(2, f"{where} is one server more than --servers {spec.servers}")
        peer.name = name
        taken[name] = peer
        say(f"{name} connected from {peer.node_host} ({len(taken)}/{spec.servers + spec.workers})")

    def _start_all(self, peers: list[Peer], node_host: str) -> None:
        for stray in [p for p in peers if p.name == "?"]:  # connected, never said hello: not a host
            self.selector.unregister(stray.channel.sock)
            stray.channel.sock.close()
            peers.remove(stray)
        worker0 = next(p for p in peers if p.name == "worker-0")
        extra = {"MASTER_ADDR": worker0.node_host, "MASTER_PORT": str(ORDER_CHANNEL_PORT)}
        self.role.start(node_host)
        for peer in peers:
            peer.channel.send(start=extra if peer.role == "worker" else {}, name=peer.name)
        say(f"all {len(peers) + 1} hosts connected; job started")

    def _supervise(self, listener, peers: list[Peer], started: float) -> tuple[int, str]:
        spec = self.spec
        last = [0.0]
        workers_done_at = None
        early_since = None
        everyone = list(peers)
        own: int | None = None
        while True:
            if spec.timeout is not None and time.monotonic() - started > spec.timeout:
                running = [p.name for p in everyone if p.status is None]
                raise JobEnded(124, f"the job took longer than --timeout {spec.timeout:g}s (still running: "
                                    f"{', '.join(running) or 'none'})")
            for peer, message in self._receive(listener, peers, accepting=False):
                if "exit" in message:
                    peer.status = int(message["exit"])
                    if peer.status != 0:
                        why = message.get("why")
                        raise JobEnded(exit_code(peer.status), f"{peer.label} failed: "
                                                               f"{why or describe_status(peer.status)}")
            if own is None:
                own = self.role.poll()
                if own not in (None, 0):
                    raise JobEnded(exit_code(own), f"scheduler failed: {describe_status(own)}")
            self._beat(peers, last)
            now = time.monotonic()
            workers = [p for p in everyone if p.role == "worker"]
            if all(p.status == 0 for p in workers):
                workers_done_at = workers_done_at or now
                lingering = [p for p in everyone if p.role == "server" and p.status is None]
                if own is None or lingering:
                    if now - workers_done_at <= spec.grace:
                        continue
                    for peer in lingering:
                        peer.stopped = True
                        peer.channel.send(stop=1)
                    say(f"{', '.join([p.name for p in lingering] + (['scheduler'] if own is None else []))} "
                        f"still running {spec.grace:g}s after the workers finished: stopped")
                return 0, f"all {len(workers)} workers succeeded"
            ended = (["scheduler"] if own == 0 else []) + [p.name for p in everyone
                                                          if p.role == "server" and p.status == 0]
            if ended:
                early_since = early_since or now
                if now - early_since > EXIT_GRACE:
                    raise JobEnded(1, f"{ended[0]} ended while workers still run")
