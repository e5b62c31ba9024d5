"""``byteps-prophet cluster run|clean``: the local multi-host cluster from the command line."""
from __future__ import annotations

import argparse
import sys
import time

from byteps_prophet.errors import ConfigError, UserError


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "cluster", help="run a BytePS cluster of namespace hosts on this machine",
        description="A scheduler, servers and workers, each its own host (network namespace, private "
                    "/dev/shm) on tc-shaped links, defined by the compose file. See docs/CLUSTER.md.")
    actions = parser.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)

    run = actions.add_parser(
        "run", help="start the cluster, run COMMAND on every worker, tear everything down",
        usage="%(prog)s [options] [-- COMMAND...]",
        description="Runs COMMAND (default: the compose file's worker command, a push/pull self-test) "
                    "on every worker with the DMLC_*/BYTEPS_* environment of a real cluster. Exits "
                    "with 0, the failing role's status, or 124 on timeout.")
    run.add_argument("--workers", type=int, metavar="N", help="worker hosts (default: as in the compose file)")
    run.add_argument("--servers", type=int, metavar="S", help="server hosts (default: as in the compose file)")
    run.add_argument("--bandwidth", metavar="RATE",
                     help="each link, each direction, in tc units: 1gbit, 200mbit, 500kbit, or none "
                          "(default: LINK_BANDWIDTH of the compose file)")
    run.add_argument("--latency", metavar="TIME",
                     help="one-way host-to-host delay: 1ms, 500us, 0 (needs netem; default: LINK_LATENCY)")
    run.add_argument("--engine", metavar="ENGINE",
                     help="parameter server: byteps or mxnet (default: ENGINE of the compose file, else byteps)")
    run.add_argument("--tcp-congestion", metavar="ALGO",
                     help="TCP congestion control of every host, e.g. cubic, bbr (namespaces; default: this "
                          "machine's, as containers get it)")
    run.add_argument("--compose", metavar="FILE", help="cluster definition (default: docker/docker-compose.yml)")
    run.add_argument("--timeout", type=float, metavar="SEC", help="stop everything after SEC seconds (exit 124)")
    run.add_argument("--no-netns", action="store_true",
                     help="plain loopback, no namespaces and no shaping (without it, a machine without "
                          "namespaces is a one-line error)")
    run.add_argument("-e", "--env", action="append", default=[], metavar="KEY=VALUE",
                     help="extra environment for every role (repeatable)")
    run.add_argument("--dry-run", action="store_true", help="print hosts, commands and environment; run nothing")
    run.add_argument("worker_command", nargs=argparse.REMAINDER, metavar="COMMAND",
                     help="after --: the command each worker runs")
    run.set_defaults(func=run_command)

    clean = actions.add_parser("clean", help="remove namespaces left by a cluster whose controller was killed")
    clean.set_defaults(func=clean_command)


def parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--env {pair!r} must be KEY=VALUE")
        env[key] = value
    return env


def _spec(args):
    from byteps_prophet.cluster.local import ClusterSpec

    if args.timeout is not None and args.timeout <= 0:
        raise ConfigError(f"--timeout {args.timeout:g} must be a positive number of seconds")
    return ClusterSpec(workers=args.workers, servers=args.servers, bandwidth=args.bandwidth,
                       latency=args.latency, engine=args.engine, compose=args.compose,
                       netns=False if args.no_netns else None, tcp_congestion=args.tcp_congestion)


def run_command(args) -> int:
    from byteps_prophet.cluster.local import Cluster

    command = list(args.worker_command or [])
    if command and command[0] == "--":
        command = command[1:]
    env = parse_env(args.env)
    cluster = Cluster(_spec(args))
    if args.dry_run:
        print(cluster.describe())
        for host in cluster.hosts:
            role_env = cluster.environment(host, env)
            shown = {k: v for k, v in sorted(role_env.items())
                     if k.startswith(("DMLC_", "BYTEPS_", "BYTESCHEDULER_", "PROPHET_", "ENGINE"))}
            print(f"{host.name}: {' '.join(cluster.command(host, command or None))}")
            for key, value in shown.items():
                print(f"    {key}={value}")
        return 0

    started = time.monotonic()
    with cluster:  # SIGTERM unwinds through here too (byteps_prophet.cli)
        up = time.monotonic() - started
        print(cluster.describe(), file=sys.stderr)
        print(f"cluster: hosts up in {up:.2f}s; running {'COMMAND' if command else 'the compose worker command'} "
              f"on {cluster.num_workers} workers", file=sys.stderr, flush=True)
        result = cluster.run(command or None, env=env, timeout=args.timeout)
    total = time.monotonic() - started
    if result.ok:
        print(f"cluster: {result.reason}; run {result.elapsed:.2f}s, torn down after {total:.2f}s",
              file=sys.stderr)
    else:
        culprit = f"{result.failed} failed: " if result.failed else ""
        print(f"cluster: {culprit}{result.reason}; everything stopped and torn down after {total:.2f}s "
              f"(exit {result.returncode})", file=sys.stderr)
    return result.returncode


def clean_command(args) -> int:
    from byteps_prophet.cluster import netns

    reason = netns.unavailable_reason()
    if reason:
        raise UserError(f"cannot inspect namespaces: {reason}")
    removed = netns.clean_stale()
    print(f"removed {len(removed)} stale namespaces" + (f": {', '.join(removed)}" if removed else ""))
    return 0
