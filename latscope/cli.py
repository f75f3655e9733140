"""The ``latscope`` command.

Each subcommand lives in its own module, listed in ``COMMANDS``; the module provides
``HELP`` (one line), ``add_arguments(parser)`` and ``main(args) -> int``.

The command needs the ``server`` extra (``pip install "latscope[server]"``); a plain
``pip install latscope`` is the SDK alone, so this module imports nothing of the server at import
time and says which extra to install instead of a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import re
import sys
from dataclasses import fields
from typing import TYPE_CHECKING

from latscope import __version__

if TYPE_CHECKING:
    from latscope.config import Settings

#: subcommand -> module implementing it, in the order ``--help`` lists them.
COMMANDS: dict[str, str] = {
    "serve": "latscope.serve",
    "collector": "latscope.collector.command",
    "quarantine": "latscope.collector.quarantine",
    "api": "latscope.cmd.api",
    "report": "latscope.cmd.report",
    "tail": "latscope.cmd.tail",
    "compare": "latscope.cmd.compare",
    "diagnose": "latscope.cmd.diagnose",
    "why": "latscope.cmd.why",
    "timeline": "latscope.cmd.timeline",
    "heatmap": "latscope.cmd.heatmap",
    "coldstart": "latscope.cmd.coldstart",
    "explain": "latscope.cmd.explain",
    "conversation": "latscope.cmd.conversation",
    "export": "latscope.cmd.export",
    "slo": "latscope.cmd.slo",
    "top": "latscope.cmd.top",
    "mcp": "latscope.cmd.mcp",
    "rules": "latscope.cmd.rules",
    "demo": "latscope.demo.command",
}

#: The settings ``latscope api`` reads (it ingests nothing: no collector or attributor flags).
API_SETTINGS = (
    "otlp_grpc", "http", "store", "token_file", "token", "grpc_max_message_bytes",
    "shutdown_grace_s", "log_level", "stall_threshold_ms", "tls_cert", "tls_key", "grpc_workers",
    "slo_objectives", "slo_interval_s", "rules",
)  # fmt: skip

#: How a flag's value is written in --help, as the docs write it.
_METAVARS = {
    "otlp_grpc": "HOST:PORT",
    "http": "HOST:PORT",
    "store": "DSN",
    "token_file": "PATH",
    "token": "TOKEN",
    "tls_cert": "PATH",
    "tls_key": "PATH",
    "spool_dir": "PATH",
    "log_level": "LEVEL",
    "attributor": "on|off",
}

#: Flags whose value may be a relative time written with a minus (``--since -5m``).
_TIME_FLAGS = frozenset(
    ("--since", "--until", "--before-since", "--before-until", "--after-since", "--after-until")
)
_MINUS_SPAN = re.compile(r"^-(\d+\s*(?:ms|s|m|h|d|w))$")

#: What the console script says when the server extra is not installed.
SERVER_EXTRA_MISSING = (
    "latscope: the command line needs the server extra ({missing} is not installed).\n"
    "`pip install latscope` is the SDK alone; for the collector, store, API and CLI run:\n"
    '    pip install "latscope[server]"\n'
)


def _metavar(name: str, default: object) -> str:
    if name in _METAVARS:
        return _METAVARS[name]
    if name.endswith("_ms"):
        return "MS"
    if name.endswith("_s"):
        return "SECONDS"
    if name.endswith("_bytes"):
        return "BYTES"
    return "N" if isinstance(default, int | float) else name.upper()


def add_settings_flags(parser: argparse.ArgumentParser, only: tuple[str, ...] = ()) -> None:
    """One flag per ``Settings`` field (or per field in ``only``); unset flags stay None so
    environment variables and defaults apply."""
    from latscope.config import Settings

    for f in fields(Settings):
        if only and f.name not in only:
            continue
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            type=type(f.default),
            default=None,
            metavar=_metavar(f.name, f.default),
            help=f"{f.metadata.get('help', '')} [env {Settings.env_name(f.name)}, "
            f"default {f.default!r}]",
        )


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from flags > ``LATSCOPE_*`` > defaults; raises ConfigError with a fix."""
    from latscope.config import Settings

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


def normalize_argv(argv: list[str]) -> list[str]:
    """``--since -5m`` and ``--since=-5m`` mean ``--since 5m`` (5 minutes before now).

    argparse takes ``-5m`` for an unknown option, and the time ranges count spans back from
    now anyway, so the minus people naturally write is accepted and dropped.
    """
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        flag, eq, value = arg.partition("=")
        if flag in _TIME_FLAGS and eq and (m := _MINUS_SPAN.match(value)):
            out.append(f"{flag}={m.group(1)}")
        elif arg in _TIME_FLAGS and i + 1 < len(argv) and (m := _MINUS_SPAN.match(argv[i + 1])):
            out.append(f"{arg}={m.group(1)}")
            i += 1
        else:
            out.append(arg)
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    try:
        from latscope.config import ConfigError

        parser = build_parser()
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top == "latscope" or not top:
            raise
        sys.stderr.write(SERVER_EXTRA_MISSING.format(missing=top))
        return 2
    args = parser.parse_args(normalize_argv(sys.argv[1:] if argv is None else list(argv)))
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
