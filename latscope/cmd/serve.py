"""``latscope serve``: the OTLP receiver and the HTTP API in one process over one store (the
process itself: ``latscope.serve``)."""

from __future__ import annotations

import argparse

from latscope.cmd._settings import add_settings_flags, process_main

HELP = "OTLP receiver + REST API over one store (embedded chDB by default)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings_flags(parser)


def main(args: argparse.Namespace) -> int:
    from latscope.serve import run

    return process_main(args, run)
