"""The collector's own Prometheus metrics, registered once in the process registry.

``signal`` is ``traces`` (counted in spans) or ``metrics`` (counted in data points).
``dropped`` counts acknowledged items that were lost after all (an unreadable spool file); it
must stay 0, and every increment is logged as an error.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from latscope.metrics import REGISTRY

_L = ("signal",)

RECEIVED = Counter(
    "latscope_collector_received", "Items that arrived in Exports", _L, registry=REGISTRY
)
ACCEPTED = Counter(
    "latscope_collector_accepted",
    "Items acknowledged: stored in ClickHouse or in the spool",
    _L,
    registry=REGISTRY,
)
REJECTED = Counter(
    "latscope_collector_rejected", "Invalid items rejected (OTLP partial success)", _L,
    registry=REGISTRY,
)  # fmt: skip
REFUSED = Counter(
    "latscope_collector_refused",
    "Valid items refused for backpressure (queue or spool full); the client retries them",
    _L,
    registry=REGISTRY,
)
SPOOLED = Counter(
    "latscope_collector_spooled", "Items written to the on-disk spool", _L, registry=REGISTRY
)
REPLAYED = Counter(
    "latscope_collector_replayed", "Spooled items replayed into ClickHouse", _L, registry=REGISTRY
)
DROPPED = Counter(
    "latscope_collector_dropped", "Acknowledged items lost (must stay 0)", _L, registry=REGISTRY
)
QUARANTINED = Counter(
    "latscope_collector_quarantined",
    "Acknowledged items ClickHouse refused alone, kept in the spool's quarantine to replay "
    "(latscope quarantine)",
    _L,
    registry=REGISTRY,
)
QUEUE_DEPTH = Gauge(
    "latscope_collector_queue_depth", "Items waiting in the batch queue", _L, registry=REGISTRY
)
SPOOL_BYTES = Gauge(
    "latscope_collector_spool_bytes", "Bytes held in the on-disk spool", _L, registry=REGISTRY
)
WRITE_SECONDS = Histogram(
    "latscope_collector_write_seconds",
    "Time to insert one batch into ClickHouse",
    _L,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)

# Export every series from the start, so a dashboard sees dropped = 0 rather than nothing.
for _signal in ("traces", "metrics"):
    for _metric in (RECEIVED, ACCEPTED, REJECTED, REFUSED, SPOOLED, REPLAYED, DROPPED,
                    QUARANTINED):  # fmt: skip
        _metric.labels(_signal)
MEMORY_HELD = Gauge(
    "latscope_collector_memory_bytes",
    "Bytes Exports hold (being received, decoded, or waiting for ClickHouse)",
    registry=REGISTRY,
)
MEMORY_LIMIT = Gauge(
    "latscope_collector_memory_limit_bytes",
    "The collector's memory limit (--memory-limit-bytes)",
    registry=REGISTRY,
)
MEMORY_REFUSED = Counter(
    "latscope_collector_memory_refused",
    "Exports refused (RESOURCE_EXHAUSTED / 429) because they did not fit the memory limit",
    _L,
    registry=REGISTRY,
)
for _signal in ("traces", "metrics"):
    MEMORY_REFUSED.labels(_signal)
