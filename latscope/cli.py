"""The ``latscope`` command."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import fields

from latscope import __version__
from latscope.config import ConfigError, Settings


def _add_settings_flags(parser: argparse.ArgumentParser) -> None:
    for f in fields(Settings):
        flag = "--" + f.name.replace("_", "-")
        parser.add_argument(
            flag,
            dest=f.name,
            type=type(f.default) if not isinstance(f.default, bool) else None,
            default=None,
            metavar=f.name.upper(),
            help=f"{f.metadata.get('help', '')} [env {Settings.env_name(f.name)}, "
            f"default {f.default!r}]",
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="latscope",
        description="Tracing and latency attribution for AI inference.",
    )
    parser.add_argument("--version", action="version", version=f"latscope {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser(
        "serve", help="OTLP receiver + REST API over one store (embedded chDB by default)"
    )
    _add_settings_flags(serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    overrides = {f.name: getattr(args, f.name, None) for f in fields(Settings)}
    try:
        settings = Settings.from_env(**overrides)
    except ConfigError as exc:
        parser.exit(2, f"latscope: {exc}\n")
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.command == "serve":
        from latscope import serve

        try:
            return serve.run(settings)
        except OSError as exc:
            print(f"latscope: {exc}", file=sys.stderr)
            return 1
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
