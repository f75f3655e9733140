"""The ``latscope`` command.

Each subcommand lives in its own module, listed in ``COMMANDS``; the module provides
``HELP`` (one line), ``add_arguments(parser)`` and ``main(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from dataclasses import fields

from latscope import __version__
from latscope.config import ConfigError, Settings

#: subcommand -> module implementing it, in the order ``--help`` lists them.
COMMANDS: dict[str, str] = {
    "serve": "latscope.serve",
    "collector": "latscope.collector.command",
    "api": "latscope.cmd.api",
    "report": "latscope.cmd.report",
    "tail": "latscope.cmd.tail",
    "compare": "latscope.cmd.compare",
    "diagnose": "latscope.cmd.diagnose",
    "why": "latscope.cmd.why",
    "timeline": "latscope.cmd.timeline",
    "explain": "latscope.cmd.explain",
    "slo": "latscope.cmd.slo",
    "top": "latscope.cmd.top",
    "demo": "latscope.demo.command",
}


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per ``Settings`` field; unset flags stay None so env and defaults apply."""
    for f in fields(Settings):
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            type=type(f.default),
            default=None,
            metavar=f.name.upper(),
            help=f"{f.metadata.get('help', '')} [env {Settings.env_name(f.name)}, "
            f"default {f.default!r}]",
        )


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from flags > ``LATSCOPE_*`` > defaults; raises ConfigError with a fix."""
    return Settings.from_env(**{f.name: getattr(args, f.name, None) for f in fields(Settings)})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="latscope",
        description="Tracing and latency attribution for AI inference.",
    )
    parser.add_argument("--version", action="version", version=f"latscope {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command)
        command.set_defaults(_main=module.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args._main(args) or 0)
    except ConfigError as exc:
        parser.exit(2, f"latscope: {exc}\n")
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
