"""``latscope serve``: the OTLP receiver and the HTTP API in one process over one store (the
process itself: ``latscope.serve``)."""

from __future__ import annotations

import argparse
import logging
import sys

from latscope.cmd._settings import add_settings_flags, settings_from_args
from latscope.storage import StoreError

HELP = "OTLP receiver + REST API over one store (embedded chDB by default)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings_flags(parser)


def main(args: argparse.Namespace) -> int:
    from latscope.serve import install_rulebook, run

    settings = settings_from_args(args)
    logging.getLogger().setLevel(settings.log_level.upper())
    install_rulebook(settings)
    try:
        return run(settings)
    except (OSError, StoreError) as exc:
        print(f"latscope: {exc}", file=sys.stderr)
        return 1
