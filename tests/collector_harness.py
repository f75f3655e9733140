"""An in-process collector for tests: a real gRPC server and a real uvicorn HTTP server on
loopback ports, over the embedded ClickHouse.

chDB opens one data directory per process, so every in-process test shares the session's
``store``; each harness writes under its own service names and spool directory.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import uvicorn

from latscope.collector.service import collector_parts
from latscope.collector.standalone import create_app
from latscope.config import Settings
from latscope.parts import Parts
from latscope.serve import bind_http, start_grpc, stop_components
from latscope.storage import Store, StoreUnavailable
from tests.serve_support import embedded_store


class FlakyStore:
    """The real store behind a switch: while ``down``, inserts fail as if ClickHouse were gone.

    ``fail_after`` makes the insert after that many successful ones start failing (storage
    dying mid-stream).
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self.down = False
        self.fail_after: int | None = None
        self.inserts = 0
        #: the table of each insert that succeeded, in order
        self.tables: list[str] = []
        self.failures = 0
        #: when set, inserts wait for it: ClickHouse slower than the intake
        self.gate: threading.Event | None = None
        self.blocked = False
        #: the next insert raises this unexpected error once (a bug, not an outage)
        self.bug: Exception | None = None
        #: when set, SYSTEM SYNC FILE CACHE waits for it (parts not yet on disk)
        self.sync_gate: threading.Event | None = None
        #: set when a sync reaches ``sync_gate``
        self.sync_held = threading.Event()
        self.syncs = 0
        self.embedded = store.embedded
        self.dsn = store.dsn

    def insert_arrow(self, table: str, data: pa.Table, *, dedup_token: str | None = None) -> None:
        if self.fail_after is not None and self.inserts >= self.fail_after:
            self.down = True
            self.fail_after = None
        if self.gate is not None:
            self.blocked = True
            self.gate.wait(30)
        if self.bug is not None:
            bug, self.bug = self.bug, None
            raise bug
        if self.down:
            self.failures += 1
            raise StoreUnavailable("connection refused (test)")
        self.store.insert_arrow(table, data, dedup_token=dedup_token)
        self.inserts += 1
        self.tables.append(table)

    def ping(self) -> bool:
        return not self.down

    def command(self, sql: str, parameters: dict[str, Any] | None = None) -> Any:
        if self.down:
            raise StoreUnavailable("connection refused (test)")
        if sql.startswith("SYSTEM SYNC") and self.sync_gate is not None:
            self.sync_held.set()
            self.sync_gate.wait(30)
        result = self.store.command(sql, parameters)
        if sql.startswith("SYSTEM SYNC"):
            self.syncs += 1
        return result

    def query_rows(self, sql: str, parameters: dict[str, Any] | None = None) -> list[tuple]:
        return self.store.query_rows(sql, parameters)


@dataclass
class Collector:
    settings: Settings
    store: FlakyStore
    parts: Parts
    grpc_server: Any
    grpc: str
    http: str
    _http_server: uvicorn.Server
    _http_thread: threading.Thread
    stopped: bool = False

    def stop(self, grace: float = 10.0) -> None:
        """The ``latscope serve`` shutdown order: gRPC, HTTP, then drain the writers."""
        if self.stopped:
            return
        self.stopped = True
        deadline = time.monotonic() + grace
        self.grpc_server.stop(grace).wait()
        self._http_server.should_exit = True
        self._http_thread.join(grace)
        stop_components(self.parts, deadline)

    @property
    def collector(self) -> Any:
        return self.parts.components[0]

    def wait_stored(self, timeout: float = 30) -> None:
        """Wait until every acknowledged span is in ClickHouse (acknowledged means journaled:
        the insert follows within the batch timeout)."""
        deadline = time.monotonic() + timeout
        while not self.collector.spans.drained():
            assert time.monotonic() < deadline, "acknowledged spans were not inserted"
            time.sleep(0.02)


def start_collector(store: Store | FlakyStore, spool: Path, **overrides: Any) -> Collector:
    flaky = store if isinstance(store, FlakyStore) else FlakyStore(store)
    base = Settings(
        otlp_grpc="127.0.0.1:0",
        http="127.0.0.1:0",
        store=flaky.dsn,
        spool_dir=str(spool),
        batch_timeout_s=0.05,
        store_retry_s=0.2,
        # The tests' spans are recorded at fixed times (T0), not relative to the clock.
        max_span_age_s=0,
        max_span_future_s=0,
    )
    settings = replace(base, **overrides)
    settings.validate()
    parts = collector_parts(settings, flaky)  # type: ignore[arg-type]
    for component in parts.components:
        component.start()
    grpc_server, grpc_addr = start_grpc(settings, parts)
    sock, http_addr = bind_http(settings)
    app = create_app(flaky, settings, routers=parts.http_routers)  # type: ignore[arg-type]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        time.sleep(0.01)
    return Collector(
        settings, flaky, parts, grpc_server, grpc_addr, f"http://{http_addr}", server, thread
    )


@pytest.fixture(scope="module", name="store")
def store_fixture(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return embedded_store(tmp_path_factory)


@pytest.fixture(name="collector")
def collector_fixture(store: Store, tmp_path: Path) -> Iterator[Collector]:
    c = start_collector(store, tmp_path / "spool")
    try:
        yield c
    finally:
        c.stop()


def count_spans(store: Store, service: str) -> int:
    rows = store.query_rows(
        "SELECT count() FROM otel_traces WHERE ServiceName = {s:String}", {"s": service}
    )
    return int(rows[0][0])


def distinct_spans(store: Store, service: str) -> int:
    rows = store.query_rows(
        "SELECT uniqExact(SpanId) FROM otel_traces WHERE ServiceName = {s:String}", {"s": service}
    )
    return int(rows[0][0])
