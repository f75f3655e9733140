"""The process ``latscope serve``, ``collector`` and ``api`` run (the commands are in
``latscope/cmd/``): its ports, its parts over one store, and its shutdown. ``serve`` runs the
OTLP receiver and the HTTP API in one process over one store.

Shutdown order on SIGTERM / Ctrl-C: stop gRPC intake and let in-flight Exports finish, stop the
HTTP server (the other intake), then stop the background components in reverse start order (the
collector drains what it acknowledged), then close the store.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import uvicorn
from fastapi import FastAPI

from latscope.api import create_app
from latscope.config import Settings, parse_hostport
from latscope.parts import Parts
from latscope.storage import (
    ENGINE_MEMORY_SHARE,
    Store,
    StoreOutOfMemory,
    StoreUnavailable,
    redact_dsn,
)

log = logging.getLogger("latscope.serve")

#: Seconds the gRPC port keeps answering UNAVAILABLE after intake closed on SIGTERM, at least;
#: then until no Export has arrived for QUIET_S (senders backing off), at most half the grace,
#: before gRPC's own shutdown starts.
INTAKE_CLOSED_S = 0.5
QUIET_S = 0.3
#: glibc's ``M_MMAP_THRESHOLD`` for this process: blocks at least this large are mapped on their
#: own and given back to the system when freed. By default glibc raises the threshold to the
#: largest block freed so far (up to 32 MiB), so once a few Exports of several MB have come and
#: gone, blocks of that size are carved from its arenas (one per thread, up to 8 per core), which
#: keep them when freed: ``bench/memory`` saw 600 MiB free but held in the arenas of a serve whose
#: Python heap was using 300 MiB. A fixed threshold keeps that at the small blocks' fragmentation.
MMAP_THRESHOLD_BYTES = 128 * 1024
_M_MMAP_THRESHOLD = -3


class Shutdown:
    """SIGTERM and SIGINT as a flag the main thread polls.

    Python runs a signal's handler in the main thread between bytecodes, whichever thread the
    kernel delivered the signal to, so a main thread blocked in a lock (``Event.wait()`` without a
    timeout) may never run it: a ``latscope serve`` was once seen ignoring SIGTERM that way. And a
    handler must take no lock the code it interrupts may hold (``Event.set()`` takes the lock
    ``Event.wait()`` holds between its waits). So the handler only records the signal, and the
    main thread sleeps in short steps.
    """

    def __init__(self) -> None:
        self.signum: int | None = None

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._record)
        signal.signal(signal.SIGINT, self._record)

    def _record(self, signum: int, _frame: object) -> None:
        if self.signum is None:
            self.signum = signum

    def sleep(self, seconds: float) -> None:
        """Sleep up to ``seconds``, less when a signal came."""
        if self.signum is None:
            time.sleep(seconds)

    def wait(self) -> None:
        """Until SIGTERM or SIGINT."""
        while self.signum is None:
            time.sleep(0.1)
        log.info("received %s, shutting down", signal.Signals(self.signum).name)


def install_rulebook(settings: Settings) -> None:
    """Put the rulebook with the ``--rules`` files in force for both attributors."""
    from latscope.attribution import rules

    book = settings.rulebook()
    rules.install(book)
    if settings.rule_files():
        log.info("rulebook: %s", ", ".join(f"{e.name} ({e.origin})" for e in book.engines))


@dataclass
class Bound:
    otlp_grpc: str
    http: str


#: The HTTP/2 flow-control window of an OTLP/gRPC stream (``grpc_options``).
STREAM_WINDOW_BYTES = 256 * 1024


def grpc_options(settings: Settings) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", settings.grpc_max_message_bytes),
        ("grpc.max_send_message_length", settings.grpc_max_message_bytes),
        # gRPC sets SO_REUSEPORT by default, so a second process on the same port starts without
        # complaint and takes part of the traffic (with its own store and spool). Ports are
        # exclusive: the second process must fail at start.
        ("grpc.so_reuseport", 0),
        # An Export waiting for a handler thread is held by gRPC up to its stream's flow
        # control window, which BDP probing raises towards whole messages: 24 Exports of 16 MB
        # waiting for 4 busy handlers took 245-394 MB with it on, 138-142 MB with it off (64 MB
        # of them the handlers' own Exports), uncounted by the collector's limit. Off, a waiting
        # stream's window stays small, and a handler's read opens it to its message's size.
        ("grpc.http2.bdp_probe", 0),
        # The window a stream starts with, fixed (BDP probing off): gRPC's 64 KiB made an Export
        # of the OpenTelemetry SDK's size (~300 kB) wait for a window update every 64 KiB; with
        # 256 KiB ingest took a median 0.88 of the CPU per span (bench/ingest, "small-window",
        # 12 rounds, 0.79-1.17), and an Export waiting for a handler holds at most that much,
        # uncounted.
        ("grpc.http2.lookahead_bytes", STREAM_WINDOW_BYTES),
    ]


def serve_parts(settings: Settings, store: Store) -> Parts:
    """Everything ``latscope serve`` runs over one store."""
    from latscope.api.grpc_service import query_parts

    return ingest_parts(settings, store) + query_parts(settings, store)


def ingest_parts(settings: Settings, store: Store) -> Parts:
    """What ``latscope collector`` runs: the collector's receivers, and the attributor unless
    ``--attributor off``. Over the embedded store, which no other process can open, the
    collector is its only writer, and the attributor takes its word on when ingest pauses
    (``Attributor.ingest_idle_s``)."""
    from latscope.attribution.attributor import attributor_parts
    from latscope.collector.service import Collector, collector_parts

    parts = collector_parts(settings, store)
    if settings.attributor == "on":
        (collector,) = (c for c in parts.components if isinstance(c, Collector))
        idle = collector.spans_idle_s if store.embedded else None
        parts = parts + attributor_parts(settings, store, ingest_idle_s=idle)
    return parts


def _target(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind_grpc(settings: Settings) -> tuple[grpc.Server, str]:
    """A gRPC server bound to ``--otlp-grpc`` (listening, not yet serving): a busy port fails
    here, before anything else (store, spool) is created. Raises ``OSError`` naming the address.
    """
    # Export handlers mostly wait for their batch to become durable, so more threads than
    # cores keep the batches full. Query streams (Watch) run in a pool of their own
    # (latscope.api.grpc_service), so they never take these threads from ingest.
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=settings.grpc_workers, thread_name_prefix="grpc"),
        options=grpc_options(settings),
    )
    host, port = parse_hostport(settings.otlp_grpc, name="--otlp-grpc")
    target = _target(host, port)
    try:
        if settings.tls_cert:
            credentials = grpc.ssl_server_credentials(
                [(Path(settings.tls_key).read_bytes(), Path(settings.tls_cert).read_bytes())]
            )
            bound_port = server.add_secure_port(target, credentials)
        else:
            bound_port = server.add_insecure_port(target)
    except RuntimeError:  # newer grpcio raises where older ones returned 0
        bound_port = 0
    if bound_port == 0:
        server.stop(None)
        raise OSError(
            f"cannot listen for OTLP/gRPC on {target}: the address is in use or not available "
            "(another latscope? pick a free one with --otlp-grpc HOST:PORT)"
        )
    return server, f"{host}:{bound_port}"


def start_grpc(settings: Settings, parts: Parts) -> tuple[grpc.Server, str]:
    """``bind_grpc``, then the parts' servicers registered and the server started."""
    server, addr = bind_grpc(settings)
    serve_grpc(server, parts)
    return server, addr


def serve_grpc(server: grpc.Server, parts: Parts) -> None:
    for register in parts.grpc_servicers:
        register(server)
    server.start()


def bind_http(settings: Settings) -> tuple[socket.socket, str]:
    """A listening socket on ``--http``; raises ``OSError`` naming the address when it is busy."""
    host, port = parse_hostport(settings.http, name="--http")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted connections only for sockets
    # that say so, and without it a keep-alive client waits ~40 ms (Nagle + delayed ACK) on
    # every response written in two parts.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        # SO_REUSEADDR (not SO_REUSEPORT): a restart may bind over connections in TIME_WAIT, but
        # a second listener on the same port is still refused.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise OSError(
            exc.errno, f"cannot listen for HTTP on {_target(host, port)}: {exc.strerror}"
        ) from None
    sock.set_inheritable(True)
    return sock, f"{host}:{sock.getsockname()[1]}"


def close_intake(parts: Parts) -> None:
    """Tell every component that takes data in to refuse more (UNAVAILABLE / 503)."""
    for component in parts.components:
        close = getattr(component, "close_intake", None)
        if close is not None:
            close()


def wait_quiet(parts: Parts, deadline: float) -> None:
    """After intake closed: answer UNAVAILABLE / 503 for INTAKE_CLOSED_S, then until senders have
    gone QUIET_S without an Export (they back off after UNAVAILABLE), or ``deadline``.

    gRPC's own shutdown cancels the calls it has received but not yet handed to a handler
    (CANCELLED, seen under load about half a second after SIGTERM), and the HTTP server's exit
    closes idle keep-alive connections under a request a client may send just then: both are
    avoided by stopping the servers only once no Export is arriving."""
    time.sleep(max(0.0, min(INTAKE_CLOSED_S, deadline - time.monotonic())))
    quiet = [c for c in parts.components if hasattr(c, "quiet_s")]
    while time.monotonic() < deadline and any(c.quiet_s() < QUIET_S for c in quiet):
        time.sleep(0.02)


def stop_components(parts: Parts, deadline: float) -> None:
    for component in reversed(parts.components):
        try:
            component.stop(deadline)
        except Exception:
            log.exception("stopping %s failed", component.name)


def give_back_large_blocks() -> None:
    """Have glibc map large blocks on their own (``MMAP_THRESHOLD_BYTES``); a no-op elsewhere."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to set
        return
    mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


def open_store(settings: Settings) -> tuple[Store, int]:
    """The store with its schema applied, and the schema version."""
    store = Store.open(
        settings.store,
        query_timeout_s=settings.query_timeout_s,
        memory_limit_bytes=settings.memory_limit_bytes,
    )
    return store, store.apply_schema()


def _memory_hint(exc: Exception, settings: Settings) -> str:
    """What to do when the embedded store refused to start for its memory limit."""
    if not isinstance(exc, StoreOutOfMemory) or not settings.store.startswith("chdb:"):
        return ""
    engine = ENGINE_MEMORY_SHARE * settings.memory_limit_bytes
    return (
        f"\nlatscope: the embedded ClickHouse's memory limit ({ENGINE_MEMORY_SHARE} x "
        f"--memory-limit-bytes: {engine / 2**20:,.1f} MiB) is less than it takes to open the "
        "store; raise --memory-limit-bytes"
    )


def run(
    settings: Settings,
    *,
    command: str = "serve",
    make_parts: Callable[[Settings, Store], Parts] = serve_parts,
    make_app: Callable[..., FastAPI] = create_app,
    open_store: Callable[[Settings], tuple[Store, int | None]] = open_store,
    grpc_label: str = "OTLP/gRPC",
) -> int:
    """Run until SIGTERM or SIGINT; returns the process exit code.

    ``latscope collector`` and ``latscope api`` run the same loop with their own parts (and the
    collector its own store opener); ``grpc_label`` names what the gRPC port serves.
    """
    give_back_large_blocks()
    stop = Shutdown()
    stop.install()

    # Ports first: a busy one is reported (with its address) before a store or a spool exists.
    try:
        grpc_server, grpc_addr = bind_grpc(settings)
    except OSError as exc:
        print(f"latscope {command}: {exc}", file=sys.stderr)
        return 1
    try:
        sock, http_addr = bind_http(settings)
    except OSError as exc:
        grpc_server.stop(None)
        print(f"latscope {command}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    try:
        store, version = open_store(settings)
    except (StoreUnavailable, StoreOutOfMemory) as exc:
        grpc_server.stop(None)
        sock.close()
        print(f"latscope: {exc}{_memory_hint(exc, settings)}", file=sys.stderr)
        return 1
    parts = make_parts(settings, store)
    for component in parts.components:
        component.start()
    serve_grpc(grpc_server, parts)
    app = make_app(store, settings, routers=parts.http_routers)
    tls: dict[str, Any] = {}
    if settings.tls_cert:
        tls = {"ssl_certfile": settings.tls_cert, "ssl_keyfile": settings.tls_key}
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", **tls)
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
        print("latscope: the HTTP server failed to start", file=sys.stderr)
        return 1
    scheme = "https" if settings.tls_cert else "http"
    schema = f"schema v{version}" if version is not None else "unreachable, spooling"
    print(
        f"latscope {command}: store {redact_dsn(store.dsn)} ({schema})\n"
        f"  {grpc_label:<10} {grpc_addr}\n"
        f"  {'HTTP':<10} {scheme}://{http_addr}",
        flush=True,
    )
    stop.wait()
    deadline = time.monotonic() + settings.shutdown_grace_s
    # Intake closes before the gRPC server stops: every Export still waiting for a handler
    # thread, or arriving now, is answered UNAVAILABLE ("shutting down", retry elsewhere) at
    # once, instead of being cancelled when the grace runs out (OTLP exporters retry CANCELLED
    # too, but not every gRPC client does). Exports already journaled are still acknowledged.
    close_intake(parts)
    # The port stays open a moment after intake closed: Exports arriving now get latscope's own
    # UNAVAILABLE and their exporters back off, instead of racing gRPC's shutdown, which cancels
    # calls it received but had not handed to a handler yet (CANCELLED). A call that reaches the
    # port in the instant the server stops can still be cancelled: gRPC offers no way to stop
    # admitting calls without cancelling those it has not handed on.
    wait_quiet(parts, time.monotonic() + settings.shutdown_grace_s / 2)
    grpc_server.stop(max(0.0, deadline - time.monotonic())).wait()
    http_server.should_exit = True
    http_thread.join(max(0.0, deadline - time.monotonic()))
    stop_components(parts, deadline)
    store.close()
    print(f"latscope {command}: stopped", flush=True)
    return 0
