"""The collector's parts for a latscope process: receivers, writers and spools over a store."""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

from latscope.collector import mapping
from latscope.collector.http import otlp_http_router
from latscope.collector.mapping import EXPONENTIAL_HISTOGRAM_TABLE, HISTOGRAM_TABLE, Limits
from latscope.collector.memory import MemoryLimit
from latscope.collector.receiver import Ingest, MetricsReceiver, TraceReceiver
from latscope.collector.spool import Spool, SpoolError
from latscope.collector.writer import BatchWriter, JournalWriter, WriterConfig
from latscope.config import Settings
from latscope.parts import Parts
from latscope.storage import METRICS_TABLE, SPANS_TABLE, Store

log = logging.getLogger("latscope.collector")


def spool_dir(settings: Settings, store: Store) -> Path:
    """Where the spool lives: the setting, else beside an embedded store, else ./latscope-spool."""
    if settings.spool_dir:
        return Path(settings.spool_dir).expanduser().resolve()
    if store.embedded:
        # Store.open resolved the DSN to chdb:///absolute/dir.
        return Path(store.dsn[len("chdb://") :] + "-spool")
    return Path("latscope-spool").resolve()


class Collector:
    """Both writers as one ``Component``: stop drains spans and metrics before the deadline."""

    name = "collector"

    def __init__(self, settings: Settings, store: Store) -> None:
        root = self.root = spool_dir(settings, store)
        config = WriterConfig(
            max_queue_rows=settings.queue_max_spans,
            batch_rows=settings.batch_max_spans,
            batch_timeout_s=settings.batch_timeout_s,
            retry_backoff_s=settings.store_retry_s,
        )
        spool_share = settings.spool_max_bytes // 8  # metrics are small; spans get the rest
        # The metric tables split the metrics' share: gauges and sums half, each histogram kind
        # a quarter.
        shares = {
            "traces": settings.spool_max_bytes - spool_share,
            "metrics": spool_share // 2,
            HISTOGRAM_TABLE: spool_share // 4,
            EXPONENTIAL_HISTOGRAM_TABLE: spool_share // 4,
        }
        spools: dict[str, Spool] = {}
        try:
            for name, size in shares.items():
                spools[name] = Spool(root / name, size)
        except SpoolError as exc:
            for opened in spools.values():
                opened.close()
            raise OSError(str(exc)) from None  # the commands report OSError and exit 1
        span_spool, metric_spool = spools["traces"], spools["metrics"]
        limits = Limits(
            max_attributes=settings.max_span_attributes,
            max_attribute_value=settings.max_attribute_value_bytes,
        )
        self.memory = MemoryLimit(settings.memory_limit_bytes)
        self.spans = JournalWriter(
            store, SPANS_TABLE, span_spool, config, signal="traces", limits=limits,
            memory=self.memory,
        )  # fmt: skip
        self.metrics = BatchWriter(store, METRICS_TABLE, metric_spool, config, signal="metrics")
        self.histograms = {
            table: BatchWriter(store, table, spools[table], config, signal="metrics")
            for table in (HISTOGRAM_TABLE, EXPONENTIAL_HISTOGRAM_TABLE)
        }
        self.ingest = Ingest(
            self.spans,
            self.metrics,
            limits,
            settings.token,
            histograms=self.histograms,
            memory=self.memory,
            span_window=(settings.max_span_age_s, settings.max_span_future_s),
        )
        if not mapping.NATIVE:
            log.warning(
                "collector: the C OTLP decoder (latscope.collector._otlp) is not built here; "
                "decoding spans in Python, several times slower. Reinstall with a C compiler "
                "and the Python headers to build it."
            )

    def start(self) -> None:
        self.spans.start()
        self.metrics.start()
        for writer in self.histograms.values():
            writer.start()

    def close_intake(self) -> None:
        """Refuse new Exports (UNAVAILABLE / 503); what was taken is still stored."""
        self.spans.close_intake()
        for writer in (self.metrics, *self.histograms.values()):
            writer.close_intake()

    def quiet_s(self) -> float:
        """Seconds since the last Export arrived (over gRPC or HTTP)."""
        return time.monotonic() - self.ingest.last_arrival

    def spans_idle_s(self) -> float:
        """Seconds since the last Export arrived once every span acknowledged is in the store;
        0 while one waits (received, journaled, or spooled): how long span ingest has been
        idle, for the attributor of a store this collector alone writes."""
        return self.quiet_s() if self.spans.drained() else 0.0

    def stop(self, deadline: float) -> None:
        # Stop every intake at once, then drain; the deadline is shared.
        self.close_intake()
        self.spans.stop(deadline)
        for writer in (self.metrics, *self.histograms.values()):
            writer.stop(max(deadline, time.monotonic() + 0.5))
        # The spools removed their directories if empty; the root goes too then, so a clean
        # stop (every test, every demo) leaves no empty <store>-spool folder behind.
        with contextlib.suppress(OSError):
            self.root.rmdir()


def collector_parts(settings: Settings, store: Store) -> Parts:
    """OTLP/gRPC servicers, the OTLP/HTTP router and the writers, over ``store``."""
    collector = Collector(settings, store)
    return Parts(
        grpc_servicers=[
            TraceReceiver(collector.ingest).register,
            MetricsReceiver(collector.ingest).register,
        ],
        http_routers=[
            otlp_http_router(
                collector.ingest, settings.grpc_max_message_bytes, settings.http_body_timeout_s
            )
        ],
        components=[collector],
    )
