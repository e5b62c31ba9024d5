"""``byteps-prophet launch`` (one host of a multi-host job) and ``byteps-prophet deploy render|validate``."""
from __future__ import annotations

import argparse
import sys

from byteps_prophet.cluster.cli import parse_env
from byteps_prophet.errors import ConfigError


def register(subparsers) -> None:
    launch = subparsers.add_parser(
        "launch", help="run this host's role (scheduler, server, worker) of a BytePS job on several machines",
        usage="%(prog)s [--role ROLE --scheduler-addr IP ...] [-- COMMAND...]",
        description="Run on every host of the cluster. Options fall back on the variables BytePS documents "
                    "(DMLC_ROLE, DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT, DMLC_NUM_WORKER, DMLC_NUM_SERVER, "
                    "DMLC_WORKER_ID, DMLC_NODE_HOST, DMLC_INTERFACE, BYTEPS_SCHEDULER, ENGINE). The "
                    "scheduler host's launcher supervises the job: a failed or lost host ends it on every "
                    "host, naming the role. See docs/DEPLOY.md.")
    launch.add_argument("--cluster", metavar="FILE", help="take the topology from a cluster description "
                                                          "(with --host)")
    launch.add_argument("--host", metavar="NAME", help="with --cluster: this host's place, e.g. scheduler, "
                                                       "server-0, worker-1")
    launch.add_argument("--role", help="scheduler, server or worker (DMLC_ROLE)")
    launch.add_argument("--scheduler-addr", metavar="IP", help="the scheduler host's address (DMLC_PS_ROOT_URI)")
    launch.add_argument("--scheduler-port", metavar="PORT", help="its ps-lite port (DMLC_PS_ROOT_PORT; default 9000)")
    launch.add_argument("--control-port", metavar="PORT",
                        help="the launchers' supervision port on the scheduler host (default: scheduler port + 1)")
    launch.add_argument("--workers", metavar="N", help="workers in the job (DMLC_NUM_WORKER)")
    launch.add_argument("--servers", metavar="S", help="servers in the job (DMLC_NUM_SERVER)")
    launch.add_argument("--worker-id", metavar="I", help="this worker's id, 0..N-1 (DMLC_WORKER_ID)")
    launch.add_argument("--server-id", metavar="I", help="this server's number (default: the next free one)")
    launch.add_argument("--node-host", metavar="IP", help="this host's address for the others (DMLC_NODE_HOST; "
                                                          "default: the one it reaches the scheduler from)")
    launch.add_argument("--interface", metavar="DEV", help="this host's network interface (DMLC_INTERFACE; "
                                                           "default: the one holding --node-host)")
    launch.add_argument("--engine", help="parameter server: byteps or mxnet (ENGINE; default byteps)")
    launch.add_argument("--byteps-scheduler", metavar="NAME",
                        help="communication scheduling: fifo, bytescheduler or prophet (BYTEPS_SCHEDULER)")
    launch.add_argument("-e", "--env", action="append", default=[], metavar="KEY=VALUE",
                        help="extra environment for the role (repeatable)")
    launch.add_argument("--connect-timeout", default="300", metavar="SEC",
                        help="how long hosts may take to reach the scheduler host (default 300)")
    launch.add_argument("--heartbeat-timeout", default="10", metavar="SEC",
                        help="a host silent this long is lost, and the job ends (default 10)")
    launch.add_argument("--grace", default="10", metavar="SEC",
                        help="how long scheduler and servers may run on after the workers succeeded (default 10)")
    launch.add_argument("--timeout", metavar="SEC", help="end the job after SEC seconds, exit 124 (scheduler host)")
    launch.add_argument("--dry-run", action="store_true", help="print the role's command and environment; run nothing")
    launch.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND",
                        help="after --: what this host runs (workers: required; scheduler and servers: "
                             "the engine's server by default)")
    launch.set_defaults(func=launch_command)

    deploy = subparsers.add_parser(
        "deploy", help="render a cluster description for compose, Kubernetes or podman; validate manifests",
        description="One cluster description (YAML, docs/DEPLOY.md) rendered for the machines that run it.")
    actions = deploy.add_subparsers(dest="deploy_command", metavar="ACTION", required=True)
    render = actions.add_parser(
        "render", help="write per-host compose files, Kubernetes manifests or Pods",
        description="compose: compose-<address>.yml per host (network_mode: host); k8s: kubernetes.yaml "
                    "(Deployment + Service, StatefulSet, Indexed Job); pods: pods.yaml (for podman kube play).")
    render.add_argument("--cluster", required=True, metavar="FILE", help="the cluster description (YAML)")
    render.add_argument("--target", required=True, metavar="TARGET", help="compose, k8s or pods")
    render.add_argument("--out", required=True, metavar="DIR", help="directory for the files")
    render.add_argument("--image", metavar="IMAGE", help="override the description's image")
    render.set_defaults(func=render_command)
    validate = actions.add_parser(
        "validate", help="check Kubernetes YAML against the API schema, offline (kubernetes-validate)",
        description="Every object of every file against the Kubernetes OpenAPI schema, unknown fields "
                    "included (strict). Exit 1 when any object is invalid.")
    validate.add_argument("files", nargs="+", metavar="FILE")
    validate.add_argument("--kubernetes-version", metavar="X.Y.Z", help="schema version (default: the newest known)")
    validate.set_defaults(func=validate_command)


def launch_command(args) -> int:
    from byteps_prophet.deploy import launch

    command = list(args.command or [])
    if command and command[0] == "--":
        command = command[1:]
    timing = {"connect_timeout": args.connect_timeout, "heartbeat_timeout": args.heartbeat_timeout,
              "grace": args.grace, "timeout": args.timeout}
    if args.cluster or args.host:
        if not (args.cluster and args.host):
            raise ConfigError("--cluster and --host go together; valid: both, or neither (then --role ...)")
        clash = [f"--{name.replace('_', '-')}" for name in ("role", "scheduler_addr", "scheduler_port", "control_port",
                                                            "workers", "servers", "worker_id", "server_id",
                                                            "engine", "byteps_scheduler")
                 if getattr(args, name) is not None]
        if clash:
            raise ConfigError(f"{', '.join(clash)} cannot be combined with --cluster (the description says "
                              f"them); valid: --cluster FILE --host NAME [-- COMMAND]")
        from byteps_prophet.deploy.description import load_description

        spec = launch.spec_from_description(load_description(args.cluster), args.host, command,
                                            env=parse_env(args.env), **timing)
        if args.node_host or args.interface:
            from dataclasses import replace

            spec = replace(spec, node_host=args.node_host or spec.node_host, interface=args.interface)
    else:
        spec = launch.build_spec(
            role=args.role, scheduler_addr=args.scheduler_addr, scheduler_port=args.scheduler_port,
            control_port=args.control_port, workers=args.workers, servers=args.servers,
            worker_id=args.worker_id, server_id=args.server_id, node_host=args.node_host,
            interface=args.interface, engine=args.engine, schedule=args.byteps_scheduler, command=command,
            env=parse_env(args.env), **timing)
    if args.dry_run:
        print(launch.dry_run(spec))
        return 0
    return launch.run(spec)


def render_command(args) -> int:
    from dataclasses import replace

    from byteps_prophet.deploy.description import load_description
    from byteps_prophet.deploy.render import render

    description = load_description(args.cluster)
    if args.image is not None:
        if not args.image.strip() or any(c.isspace() for c in args.image):
            raise ConfigError(f"--image {args.image!r} is not an image name")
        description = replace(description, image=args.image)
    for path, note in render(description, args.target, args.out):
        print(f"wrote {path}: {note}")
    return 0


def validate_command(args) -> int:
    from byteps_prophet.deploy.render import validate_file

    bad = 0
    for path in args.files:
        count, problems = validate_file(path, args.kubernetes_version)
        for line in problems:
            print(line, file=sys.stderr)
        bad += len(problems)
        print(f"{path}: {count - len(problems)} of {count} objects valid")
    return 1 if bad else 0
