"""The one entry point: ``byteps-prophet <command> ...``.

Each room of the package that offers a command has a ``cli.py`` with ``register(subparsers)``
(``command_modules`` lists them); the parser it adds sets ``func(args) -> int``. Errors a user can
fix (``UserError``) are printed as one line and exit with status 2, like argparse's own usage errors.
Ctrl-C and SIGTERM (``kill``, a CI timeout) unwind like an exception, so every command tears down what
it started (a cluster's processes, namespaces and qdiscs) before it exits with 130 or 143.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys

from byteps_prophet import __version__
from byteps_prophet.errors import UserError


def command_modules() -> tuple:
    """Each room's ``cli`` module (``register(subparsers)``), in the order ``--help`` lists them; imported
    when the parser is built, so importing this module stays cheap."""
    from byteps_prophet.ab import cli as ab
    from byteps_prophet.calibrate import cli as calibrate
    from byteps_prophet.cluster import cli as cluster
    from byteps_prophet.core import cli as settings
    from byteps_prophet.deploy import cli as deploy
    from byteps_prophet.sim import cli as simulate

    return simulate, cluster, ab, calibrate, deploy, settings


class OneLineParser(argparse.ArgumentParser):
    """argparse's usage errors as one line naming the culprit (``--help`` shows the usage)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="byteps-prophet",
        description="Predictable communication scheduling (Prophet, ByteScheduler, FIFO) for BytePS.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=OneLineParser)
    for module in command_modules():
        module.register(subparsers)
    return parser


class Terminated(BaseException):
    """SIGTERM, raised where the main thread is, so that ``with`` blocks and ``finally`` clean up."""


def _terminate(signum, frame):
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return int(args.func(args) or 0)
    except UserError as err:
        print(f"byteps-prophet {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"byteps-prophet {args.command}: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print(f"byteps-prophet {args.command}: terminated", file=sys.stderr)
        return 143
    except BrokenPipeError:
        # The reader went away (``| head``): what it wanted it has. Python's documented way out: point
        # stdout at devnull so that the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
