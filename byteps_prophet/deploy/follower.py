"""The launcher of a server or worker host: it connects to the coordinator (the scheduler host's
launcher), starts its role when told, reports how the role ended, and stops it when the job ends or
the coordinator is lost."""
from __future__ import annotations

import selectors
import socket
import time
from dataclasses import replace

from byteps_prophet.cluster.agent import Channel
from byteps_prophet.deploy.role import HEARTBEAT_S, JobEnded, Launcher, describe_status, exit_code, say


class Follower(Launcher):
    """A server's or worker's launcher, led by the coordinator."""

    def _connect(self) -> socket.socket:
        spec = self.spec
        deadline = time.monotonic() + spec.connect_timeout
        last_error = ""
        while True:
            try:
                return socket.create_connection((spec.scheduler_addr, spec.control_port), timeout=2.0)
            except OSError as err:
                last_error = str(err.strerror or err)
            if time.monotonic() > deadline:
                raise JobEnded(1, f"cannot reach the scheduler host {spec.scheduler_addr}:{spec.control_port} "
                                  f"after {spec.connect_timeout:g}s ({last_error}); is its launcher running?")
            time.sleep(0.3)

    def _launch(self) -> int:
        spec = self.spec
        name = spec.name
        channel = None
        try:
            sock = self._connect()
            node_host = spec.node_host or sock.getsockname()[0]
            sock.setblocking(False)
            channel = Channel(sock, "scheduler")
            channel.send(hello=name, role=spec.role, index=spec.worker_id if spec.role == "worker" else spec.server_id,
                         workers=spec.workers, servers=spec.servers, engine=spec.engine, node_host=node_host)
            self.selector.register(sock, selectors.EVENT_READ)
            say(f"{name} at {node_host}: connected to the scheduler host {spec.scheduler_addr}:{spec.control_port}")
            return self._follow_loop(channel, node_host)
        except JobEnded as end:
            say(f"{name}: {end.reason}; role stopped (exit {end.status})")
            return end.status
        except BaseException:
            if channel is not None:  # Ctrl-C, SIGTERM: the coordinator names this host
                self.role.stop()
                channel.send(exit=130, why="its launcher was stopped (interrupted)")
            raise

    def _follow_loop(self, channel: Channel, node_host: str) -> int:
        spec = self.spec
        heard = sent = time.monotonic()
        reported = False
        where = f"{spec.scheduler_addr}:{spec.control_port}"
        while True:
            now = time.monotonic()
            if now - sent >= HEARTBEAT_S:
                channel.send(beat=1)
                sent = now
            if now - heard > spec.heartbeat_timeout:
                raise JobEnded(1, f"scheduler lost: no word from the scheduler host {where} for "
                                  f"{spec.heartbeat_timeout:g}s (host down or unreachable)")
            if self.role.started and not reported:
                status = self.role.poll()
                if status is not None:
                    reported = True
                    channel.send(exit=status)
                    if status != 0:
                        self.role.stop()
                        say(f"{spec.name} failed: {describe_status(status)}; job ended (exit {exit_code(status)})")
                        return exit_code(status)
            for _key, _ in self.selector.select(0.1):
                try:
                    messages = channel.receive()
                except ValueError:
                    messages = []
                if messages is None:
                    raise JobEnded(1, f"scheduler lost: the scheduler host {where} closed the connection "
                                      f"(its launcher ended or was killed)")
                heard = time.monotonic()
                for message in messages:
                    if "start" in message:
                        self.spec = spec = replace(spec, server_id=int(str(message["name"]).split("-")[1])) \
                            if spec.role == "server" else spec
                        self.role.spec = spec
                        self.role.start(node_host, message["start"])
                    elif "stop" in message:
                        self.role.stop()
                        if not reported:
                            reported = True
                            channel.send(exit=0)
                    elif "end" in message:
                        self.role.stop()
                        status = int(message["end"])
                        say(f"{spec.name}: {message.get('reason', 'the job ended')}; job ended (exit {status})")
                        return status
                    elif "reject" in message:
                        raise JobEnded(2, str(message["reject"]))
