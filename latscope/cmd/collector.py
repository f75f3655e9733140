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
import logging
import sys

from latscope.cmd._settings import add_settings_flags, settings_from_args
from latscope.storage import StoreError

HELP = "OTLP collector alone (gRPC and HTTP ingest), for a ClickHouse server store"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings_flags(parser)


def main(args: argparse.Namespace) -> int:
    from latscope.collector.standalone import create_app, open_store
    from latscope.serve import ingest_parts, run

    settings = settings_from_args(args)
    logging.getLogger().setLevel(settings.log_level.upper())
    try:
        return run(
            settings,
            command="collector",
            make_parts=ingest_parts,
            make_app=create_app,
            open_store=open_store,
        )
    except (OSError, StoreError) as exc:
        print(f"latscope: {exc}", file=sys.stderr)
        return 1
