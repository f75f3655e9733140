"""``latscope serve``: the OTLP receiver and the HTTP API in one process over one store.

Shutdown order on SIGTERM / Ctrl-C: stop gRPC intake and let in-flight Exports finish (each is
stored before it is acknowledged), then stop the HTTP server, then close the store.
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
import threading
from concurrent import futures
from dataclasses import dataclass

import grpc
import uvicorn
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from latscope.api import create_app
from latscope.collector import TraceReceiver
from latscope.config import Settings, parse_hostport
from latscope.storage import Store

log = logging.getLogger("latscope.serve")


@dataclass
class Bound:
    otlp_grpc: str
    http: str


def grpc_options(settings: Settings) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", settings.grpc_max_message_bytes),
        ("grpc.max_send_message_length", settings.grpc_max_message_bytes),
    ]


def start_grpc(settings: Settings, store: Store) -> tuple[grpc.Server, str]:
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="otlp-grpc"),
        options=grpc_options(settings),
        compression=None,
    )
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceReceiver(store), server)
    host, port = parse_hostport(settings.otlp_grpc, name="--otlp-grpc")
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    bound_port = server.add_insecure_port(target)
    if bound_port == 0:
        raise OSError(f"cannot listen for OTLP/gRPC on {settings.otlp_grpc}")
    server.start()
    return server, f"{host}:{bound_port}"


def bind_http(settings: Settings) -> tuple[socket.socket, str]:
    host, port = parse_hostport(settings.http, name="--http")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock, f"{host}:{sock.getsockname()[1]}"


def run(settings: Settings) -> int:
    """Run until SIGTERM or SIGINT; returns the process exit code."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    store = Store.open(settings.store)
    version = store.apply_schema()
    grpc_server, grpc_addr = start_grpc(settings, store)
    sock, http_addr = bind_http(settings)
    app = create_app(store, settings)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    http_server = uvicorn.Server(config)
    http_thread = threading.Thread(
        target=http_server.run, kwargs={"sockets": [sock]}, name="http", daemon=True
    )
    http_thread.start()
    while not http_server.started and http_thread.is_alive():
        stop.wait(0.02)
    if not http_thread.is_alive():
        grpc_server.stop(0)
        store.close()
        print("latscope: the HTTP server failed to start", file=sys.stderr)
        return 1
    print(
        f"latscope serve: store {store.dsn} (schema v{version})\n"
        f"  OTLP/gRPC  {grpc_addr}\n"
        f"  HTTP       http://{http_addr}",
        flush=True,
    )
    stop.wait()
    grpc_server.stop(settings.shutdown_grace_s).wait()
    http_server.should_exit = True
    http_thread.join(settings.shutdown_grace_s)
    store.close()
    print("latscope serve: stopped", flush=True)
    return 0
