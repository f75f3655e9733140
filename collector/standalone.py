"""The collector run on its own (``latscope collector``, ``latscope/cmd/collector.py``): a store
that may be down at start, and the collector's HTTP side.

The collector starts even when ClickHouse is down: ``open_store`` gives a ``DeferredStore`` that
spools until the server answers, then applies the schema and replays.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from fastapi import APIRouter, FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from latscope import __version__
from latscope.config import Settings
from latscope.metrics import REGISTRY
from latscope.storage import Store, StoreError, StoreUnavailable

log = logging.getLogger("latscope.collector")


class DeferredStore(Store):
    """A store that was unreachable at start: every call first tries to open it (rate-limited).

    Until it opens, calls raise ``StoreUnavailable``, which the writers answer by spooling.
    """

    def __init__(self, dsn: str, retry_s: float, *, query_timeout_s: float = 60.0) -> None:
        super().__init__(client=None, dsn=dsn, query_timeout_s=query_timeout_s)
        self._retry_s = retry_s
        self._next_try = 0.0
        self._open_lock = threading.Lock()
        self._inner: Store | None = None

    def _store(self) -> Store:
        with self._open_lock:
            if self._inner is None:
                now = time.monotonic()
                if now < self._next_try:
                    raise StoreUnavailable(f"store {self.safe_dsn} still unreachable")
                self._next_try = now + self._retry_s
                inner = Store.open(self.dsn, query_timeout_s=self.query_timeout_s)
                version = inner.apply_schema()
                log.info("store %s reachable again (schema v%d)", self.safe_dsn, version)
                self._inner = inner
            return self._inner

    def command(self, sql: str, parameters: dict[str, Any] | None = None) -> Any:
        return self._store().command(sql, parameters)

    def query_rows(self, sql: str, parameters: dict[str, Any] | None = None) -> list[tuple]:
        return self._store().query_rows(sql, parameters)

    def query_arrow(self, sql: str, parameters: dict[str, Any] | None = None) -> pa.Table:
        return self._store().query_arrow(sql, parameters)

    def insert_arrow(self, table: str, data: pa.Table, *, dedup_token: str | None = None) -> None:
        self._store().insert_arrow(table, data, dedup_token=dedup_token)

    def close(self) -> None:
        if self._inner is not None:
            self._inner.close()


def open_store(settings: Settings) -> tuple[Store, int | None]:
    """The store and its schema version, or a ``DeferredStore`` (version None) when down."""
    try:
        store = Store.open(
            settings.store,
            query_timeout_s=settings.query_timeout_s,
            memory_limit_bytes=settings.memory_limit_bytes,
        )
        return store, store.apply_schema()
    except StoreUnavailable as exc:
        if settings.store.startswith("chdb:"):
            raise
        log.warning("store unreachable at start (%s); spooling until it answers", exc)
        deferred = DeferredStore(
            settings.store, settings.store_retry_s, query_timeout_s=settings.query_timeout_s
        )
        return deferred, None
    except StoreError:
        raise


def create_app(store: Store, settings: Settings, *, routers: Sequence[APIRouter] = ()) -> FastAPI:
    """The collector's HTTP side: OTLP/HTTP routes, ``/healthz`` and ``/metrics``."""
    app = FastAPI(title="latscope collector", version=__version__)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """Liveness: the process answers. Needs no token."""
        return {"status": "ok"}

    @app.get("/metrics", tags=["health"], response_class=Response)
    def metrics() -> Response:
        """Prometheus text exposition of the collector's metrics."""
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    for router in routers:
        app.include_router(router)
    return app
