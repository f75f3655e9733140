"""``latscope api``: the REST API, web page and gRPC query service alone, over a ClickHouse server.

For deployments where collectors and APIs scale apart (``--store http(s)://...``): this process
ingests nothing. Watch streams and the ``/metrics`` latency histograms are fed by reading newly
attributed rows from the attribution table, which the collectors' attributors write.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from urllib.parse import urlsplit

import uvicorn

from latscope.config import Settings
from latscope.storage import Store, StoreError

HELP = "REST API + web page + gRPC query service alone (for a ClickHouse server store)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from latscope.cli import add_settings_flags

    add_settings_flags(parser)
    parser.epilog = (
        "The gRPC query service listens on --otlp-grpc. An embedded chdb:// store is owned by "
        "one process: run `latscope serve` for it instead."
    )


def main(args: argparse.Namespace) -> int:
    from latscope.cli import settings_from_args

    settings = settings_from_args(args)
    logging.getLogger().setLevel(settings.log_level.upper())
    try:
        return run(settings)
    except StoreError as exc:
        print(f"latscope api: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"latscope api: {exc}", file=sys.stderr)
        return 1


def _redact(dsn: str) -> str:
    parts = urlsplit(dsn)
    return dsn.replace(f":{parts.password}@", ":***@") if parts.password else dsn


def run(settings: Settings) -> int:
    """Run until SIGTERM or SIGINT; returns the process exit code."""
    from latscope.api import create_app
    from latscope.api.grpc_service import query_parts
    from latscope.serve import Shutdown, bind_http, start_grpc, stop_components

    stop = Shutdown()
    stop.install()

    store = Store.open(settings.store)
    version = store.apply_schema()
    parts = query_parts(settings, store)
    for component in parts.components:
        component.start()
    grpc_server, grpc_addr = start_grpc(settings, parts)
    sock, http_addr = bind_http(settings)
    app = create_app(store, settings, routers=parts.http_routers)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    http_server = uvicorn.Server(config)
    http_thread = threading.Thread(
        target=http_server.run, kwargs={"sockets": [sock]}, name="http", daemon=True
    )
    http_thread.start()
    while not http_server.started and http_thread.is_alive():
        stop.sleep(0.02)
    if not http_thread.is_alive():
        grpc_server.stop(0)
        stop_components(parts, time.monotonic() + settings.shutdown_grace_s)
        store.close()
        print("latscope api: the HTTP server failed to start", file=sys.stderr)
        return 1
    print(
        f"latscope api: store {_redact(store.dsn)} (schema v{version})\n"
        f"  gRPC query {grpc_addr}\n"
        f"  HTTP       http://{http_addr}",
        flush=True,
    )
    stop.wait()
    deadline = time.monotonic() + settings.shutdown_grace_s
    grpc_server.stop(settings.shutdown_grace_s).wait()
    http_server.should_exit = True
    http_thread.join(max(0.0, deadline - time.monotonic()))
    stop_components(parts, deadline)
    store.close()
    print("latscope api: stopped", flush=True)
    return 0
