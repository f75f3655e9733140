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

from latscope import __version__

#: subcommand -> module implementing it, in the order ``--help`` lists them.
COMMANDS: dict[str, str] = {
    "serve": "latscope.cmd.serve",
    "collector": "latscope.cmd.collector",
    "quarantine": "latscope.cmd.quarantine",
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
    "span": "latscope.cmd.span",
    "conversation": "latscope.cmd.conversation",
    "export": "latscope.cmd.export",
    "slo": "latscope.cmd.slo",
    "top": "latscope.cmd.top",
    "mcp": "latscope.cmd.mcp",
    "rules": "latscope.cmd.rules",
    "demo": "latscope.cmd.demo",
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
