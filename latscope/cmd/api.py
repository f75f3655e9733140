"""``latscope api``: the REST API, web page and gRPC query service alone, over a ClickHouse server.

For deployments where collectors and APIs scale apart (``--store http(s)://...``): this process
ingests nothing. Watch streams and the ``/metrics`` latency histograms are fed by reading newly
attributed rows from the attribution table, which the collectors' attributors write.
"""

from __future__ import annotations

import argparse

from latscope.cmd._settings import API_SETTINGS, add_settings_flags, process_main
from latscope.config import Settings

HELP = "REST API + web page + gRPC query service alone (for a ClickHouse server store)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings_flags(parser, API_SETTINGS)
    parser.epilog = (
        "The gRPC query service listens on --otlp-grpc. An embedded chdb:// store is owned by "
        "one process: run `latscope serve` for it instead."
    )


def main(args: argparse.Namespace) -> int:
    return process_main(args, run, prefix="latscope api")


def run(settings: Settings) -> int:
    """Run until SIGTERM or SIGINT; returns the process exit code."""
    from latscope.api.grpc_service import query_parts
    from latscope.serve import run as run_process

    return run_process(settings, command="api", make_parts=query_parts, grpc_label="gRPC query")
