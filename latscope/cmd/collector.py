"""``latscope collector``: OTLP ingest alone, for a ClickHouse server backend.

Several collectors can run side by side behind a load balancer, each with its own spool. The
collector starts even when ClickHouse is down: it spools until the server answers, then applies
the schema and replays (``latscope.collector.standalone``). With a ``chdb:///dir`` store it works
too (it then owns the store).

It also runs the continuous attributor, which turns settled traces into rows of the attribution
table that ``latscope api`` reads. Attribution is idempotent, so two attributors on one store do
the same work twice but write the same rows; with several collectors keep it on in one
(``--attributor off`` on the others).
"""

from __future__ import annotations

import argparse

from latscope.cmd._settings import add_settings_flags, process_main
from latscope.config import Settings

HELP = "OTLP collector alone (gRPC and HTTP ingest), for a ClickHouse server store"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings_flags(parser)


def main(args: argparse.Namespace) -> int:
    return process_main(args, run)


def run(settings: Settings) -> int:
    """Run until SIGTERM or SIGINT; returns the process exit code."""
    from latscope.collector.standalone import create_app, open_store
    from latscope.serve import ingest_parts
    from latscope.serve import run as run_process

    return run_process(
        settings,
        command="collector",
        make_parts=ingest_parts,
        make_app=create_app,
        open_store=open_store,
    )
