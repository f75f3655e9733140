"""Attributed requests as they complete: Prometheus histograms and the live feed behind Watch.

:func:`observe` takes a batch of newly attributed requests and feeds the per-bucket latency
histograms on ``/metrics`` (labelled by service and model) and every open ``Watch`` stream in
this process::

    from latscope.api.live import observe
    observe(table)  # pyarrow.Table / polars.DataFrame in the attribution table's columns

:class:`TablePoller` calls it with the rows the attributor wrote to ``latscope_attribution``, so
the feed works the same whether the attributor runs in this process (``latscope serve``) or in
collectors elsewhere (``latscope api`` over a ClickHouse server); nothing else needs to call it.

Bounded everywhere: each Watch subscriber has a queue of ``SUBSCRIBER_QUEUE`` requests (a slow
reader loses the oldest, counted in ``latscope_watch_dropped_total``), and the histograms keep at
most ``MAX_LABEL_SETS`` service/model pairs (later pairs are counted under ``service="_other"``).
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from prometheus_client import Counter, Histogram

from latscope.api.schemas import Live
from latscope.attribution.table import BUCKET_COLUMNS
from latscope.metrics import REGISTRY
from latscope.parts import Poller
from latscope.semconv import BUCKETS
from latscope.storage import ATTRIBUTION_TABLE, Store, StoreError

log = logging.getLogger(__name__)

SUBSCRIBER_QUEUE = 1000
MAX_SUBSCRIBERS = 64
#: The newest requests the hub keeps for polling clients (``GET /v1/live``, ``latscope top``);
#: a poller that falls further behind is told how many it missed.
RECENT_KEPT = 5000
#: Requests one ``GET /v1/live`` answers with at most.
MAX_LIVE = 1000
MAX_LABEL_SETS = 1000
#: Latency histogram bounds (s): LLM requests run from milliseconds (a cached reply) to minutes.
LATENCY_BOUNDS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip

BUCKET_SECONDS = Histogram(
    "latscope_request_bucket_seconds",
    "Time attributed requests spent in each latency bucket",
    ["service", "model", "bucket"],
    buckets=LATENCY_BOUNDS,
    registry=REGISTRY,
)
E2E_SECONDS = Histogram(
    "latscope_request_e2e_seconds",
    "End-to-end latency of attributed requests (client view when known)",
    ["service", "model"],
    buckets=LATENCY_BOUNDS,
    registry=REGISTRY,
)
TTFT_SECONDS = Histogram(
    "latscope_request_ttft_seconds",
    "Time to first token of attributed requests",
    ["service", "model"],
    buckets=LATENCY_BOUNDS,
    registry=REGISTRY,
)
WATCH_DROPPED = Counter(
    "latscope_watch_dropped_total",
    "Attributed requests a slow Watch subscriber did not receive",
    registry=REGISTRY,
)
LABELS_OVERFLOW = Counter(
    "latscope_metrics_label_overflow_total",
    "Attributed requests counted under service=_other because of the label-set cap",
    registry=REGISTRY,
)


def _ms(v: Any) -> float | None:
    return None if v is None else float(v) / 1e6


def row_to_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """One ``latscope_attribution`` row (column name -> value) in the REST attribution shape."""
    ttft = row.get("TtftClientNs")
    if ttft is None:
        ttft = row.get("TtftServerNs")
    gpu: dict[str, dict[str, float]] = {}
    for key, value in dict(row.get("Gpu") or {}).items():
        phase, _, name = str(key).partition(".")
        gpu.setdefault(phase, {})[name or phase] = float(value)
    start = row.get("Timestamp")
    start_ns = int(start.timestamp() * 1e9) if isinstance(start, datetime) else int(start or 0)
    trace_id = row.get("TraceId", "")
    return {
        "trace_id": trace_id,
        "request_id": f"{trace_id}-{row.get('RequestSpanId', '')}",
        "service": row.get("ServiceName", ""),
        "model": row.get("Model", ""),
        "start_unix_nano": start_ns,
        "e2e_ms": _ms(row.get("E2eNs")) or 0.0,
        "buckets_ms": {b: _ms(row.get(col)) for b, col in BUCKET_COLUMNS.items()},
        "ttft_ms": _ms(ttft),
        "ttft_server_ms": _ms(row.get("TtftServerNs")),
        "tpot_ms": _ms(row.get("TpotNs")),
        "itl_ms": {
            "p50": _ms(row.get("ItlP50Ns")),
            "p99": _ms(row.get("ItlP99Ns")),
            "max": _ms(row.get("ItlMaxNs")),
        },
        "stalls": int(row.get("Stalls") or 0),
        "input_tokens": row.get("InputTokens"),
        "output_tokens": row.get("OutputTokens"),
        "clock_skew_ms": _ms(row.get("ClockSkewNs")) or 0.0,
        "attempts": int(row.get("Attempts") or 1),
        # The attribution table has no column for it: live rows say false, the request's own
        # answer (/v1/requests/{id}/attribution) knows.
        "client_headers_only": False,
        "kv_transfer_ms": _ms(row.get("KvTransferNs")),
        "gpu": gpu,
    }


def _rows(batch: Any) -> list[dict[str, Any]]:
    """Attribution rows (column name -> value) from whatever the attributor holds."""
    if hasattr(batch, "to_pylist"):  # pyarrow.Table
        return batch.to_pylist()
    if hasattr(batch, "to_dicts"):  # polars.DataFrame
        return batch.to_dicts()
    out = []
    for item in batch:
        if isinstance(item, Mapping):
            out.append(dict(item))
        else:  # a RequestAttribution
            b = item.buckets_ns
            out.append(
                {
                    "TraceId": item.trace_id,
                    "ServiceName": item.service,
                    "Model": item.model,
                    "Timestamp": item.start_ns,
                    "E2eNs": item.e2e_ns,
                    **{col: b.get(name) for name, col in BUCKET_COLUMNS.items()},
                    "TtftClientNs": item.ttft_client_ns,
                    "TtftServerNs": item.ttft_server_ns,
                    "TpotNs": item.tpot_ns,
                    "ItlP50Ns": item.itl_ns.get("p50"),
                    "ItlP99Ns": item.itl_ns.get("p99"),
                    "ItlMaxNs": item.itl_ns.get("max"),
                    "Stalls": item.stalls,
                    "InputTokens": item.input_tokens,
                    "OutputTokens": item.output_tokens,
                    "ClockSkewNs": item.clock_skew_ns,
                    "KvTransferNs": item.kv_transfer_ns,
                    "Attempts": item.attempts,
                    "Gpu": {
                        f"{phase}.{k}": v
                        for phase, figs in item.gpu.items()
                        for k, v in figs.items()
                    },
                }
            )
    return out


@dataclass(frozen=True)
class WatchFilter:
    service: str = ""
    model: str = ""
    min_e2e_ms: float = 0.0

    def matches(self, request: Mapping[str, Any]) -> bool:
        return (
            (not self.service or request["service"] == self.service)
            and (not self.model or request["model"] == self.model)
            and request["e2e_ms"] >= self.min_e2e_ms
        )


class Subscription:
    """One Watch stream's bounded queue; iterate it to receive matching requests."""

    def __init__(self, hub: LiveHub, flt: WatchFilter) -> None:
        self.hub = hub
        self.filter = flt
        self.queue: queue.Queue[dict[str, Any]] = queue.Queue(SUBSCRIBER_QUEUE)
        self.closed = threading.Event()

    def offer(self, request: dict[str, Any]) -> None:
        if not self.filter.matches(request):
            return
        while True:
            try:
                self.queue.put_nowait(request)
                return
            except queue.Full:
                try:  # a slow reader keeps the newest requests
                    self.queue.get_nowait()
                    WATCH_DROPPED.inc()
                except queue.Empty:
                    pass

    def get(self, timeout: float) -> dict[str, Any] | None:
        try:
            return self.queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self) -> None:
        self.closed.set()
        self.hub.unsubscribe(self)


class LiveHub:
    """Fans attributed requests out to the Watch subscribers of this process, and keeps the
    newest ``RECENT_KEPT`` for polling clients (``since``), numbered in arrival order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: list[Subscription] = []
        self._recent: deque[tuple[int, dict[str, Any]]] = deque(maxlen=RECENT_KEPT)
        self._seq = 0
        #: Names this process's numbering: a poller that sees another one starts over.
        self.epoch = uuid.uuid4().hex[:16]

    def subscribe(self, flt: WatchFilter) -> Subscription | None:
        """A new subscription, or None when ``MAX_SUBSCRIBERS`` are already open."""
        with self._lock:
            if len(self._subscribers) >= MAX_SUBSCRIBERS:
                return None
            sub = Subscription(self, flt)
            self._subscribers.append(sub)
            return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subscribers:
                self._subscribers.remove(sub)

    @property
    def subscribers(self) -> int:
        with self._lock:
            return len(self._subscribers)

    def publish(self, requests: Iterable[dict[str, Any]]) -> None:
        requests = list(requests)
        with self._lock:
            for request in requests:
                self._seq += 1
                self._recent.append((self._seq, request))
            subs = list(self._subscribers)
        if not subs:
            return
        for request in requests:
            for sub in subs:
                sub.offer(request)

    def since(
        self, after: int | None, flt: WatchFilter, limit: int
    ) -> tuple[list[dict[str, Any]], int, int]:
        """``(requests, cursor, missed)``: the kept requests numbered after ``after`` that match
        ``flt``, oldest first, at most ``limit``; the cursor to ask from next; how many after
        ``after`` are no longer kept. ``after=None`` asks for the cursor alone (start now)."""
        with self._lock:
            rows = list(self._recent)
            last = self._seq
        if after is None:
            return [], last, 0
        if after > last:  # a cursor this process never gave (another process's numbering)
            after = rows[0][0] - 1 if rows else last
        oldest = rows[0][0] if rows else last + 1
        missed = max(0, oldest - after - 1)
        out: list[dict[str, Any]] = []
        cursor = last
        for n, request in rows:
            if n > after and flt.matches(request):
                out.append(request)
                if len(out) == limit:
                    cursor = n
                    break
        return out, cursor, missed


#: The process's hub: the attributor (through observe) or a TablePoller feeds it.
HUB = LiveHub()


def since(
    *,
    after: int | None = None,
    epoch: str | None = None,
    service: str = "",
    model: str = "",
    min_e2e_ms: float = 0.0,
    limit: int = 500,
    hub: LiveHub = HUB,
) -> Live:
    """``GET /v1/live``: requests attributed since the cursor ``after`` of an earlier answer
    (of the same ``epoch``; another epoch starts over from the oldest kept)."""
    if after is not None and epoch is not None and epoch != hub.epoch:
        after = 0
    requests, cursor, missed = hub.since(
        after, WatchFilter(service, model, min_e2e_ms), max(1, min(limit, MAX_LIVE))
    )
    return Live.model_validate(
        {"epoch": hub.epoch, "cursor": cursor, "missed": missed, "requests": requests}
    )


_label_sets: set[tuple[str, str]] = set()
_label_lock = threading.Lock()


def _labels(service: str, model: str) -> tuple[str, str]:
    key = (service, model)
    with _label_lock:
        if key in _label_sets:
            return key
        if len(_label_sets) < MAX_LABEL_SETS:
            _label_sets.add(key)
            return key
    LABELS_OVERFLOW.inc()
    return ("_other", "_other")


def record_metrics(requests: Iterable[Mapping[str, Any]]) -> None:
    """Add attributed requests (REST shape) to the Prometheus histograms."""
    for r in requests:
        service, model = _labels(r["service"], r["model"])
        E2E_SECONDS.labels(service, model).observe(r["e2e_ms"] / 1e3)
        if r.get("ttft_ms") is not None:
            TTFT_SECONDS.labels(service, model).observe(r["ttft_ms"] / 1e3)
        for bucket in BUCKETS:
            value = r["buckets_ms"].get(bucket)
            if value is not None:  # network is unknown without a client span, not zero
                BUCKET_SECONDS.labels(service, model, bucket).observe(value / 1e3)


def observe(batch: Any, *, hub: LiveHub = HUB) -> int:
    """Feed a batch of newly attributed requests to ``/metrics`` and to Watch; returns how many.

    ``batch``: a pyarrow Table or polars DataFrame with ``latscope_attribution``'s columns, or
    an iterable of such rows (dicts) or of ``RequestAttribution``. Never raises into the caller:
    a failure here must not stop attribution, so it is logged and counted as 0.
    """
    try:
        rows = _rows(batch)
        usable = [r for r in rows if r.get("TraceId") and r.get("E2eNs") is not None]
        if len(usable) < len(rows):
            log.warning(
                "observe: %d row(s) without TraceId or E2eNs skipped", len(rows) - len(usable)
            )
        requests = [row_to_json(row) for row in usable]
        record_metrics(requests)
        hub.publish(requests)
        return len(requests)
    except Exception:
        log.exception("observing attributed requests failed")
        return 0


#: Attribution rows written recently. ``SpansIngestedAt`` (when the newest span of the request
#: reached the store) bounds when the attributor can have written the row, so re-reading a
#: trailing ``POLL_LAG`` of it catches every row, including ones written out of order.
RECENT_ROWS = f"""
SELECT *
FROM {ATTRIBUTION_TABLE}
WHERE SpansIngestedAt >= fromUnixTimestamp64Micro({{after_us:Int64}}) AND IsDeleted = 0
  AND Timestamp >= now64() - INTERVAL {{horizon_h:UInt32}} HOUR
ORDER BY SpansIngestedAt
LIMIT {{limit:UInt32}}
"""
LATEST_INGEST = f"SELECT toUnixTimestamp64Micro(max(SpansIngestedAt)) FROM {ATTRIBUTION_TABLE}"
#: The attributor writes a request within its settle window of the last span's arrival; this
#: covers that window with a wide margin.
POLL_LAG_US = 120 * 1_000_000
#: Live means requests that started within this many hours (a backfill of old spans is history,
#: not news); the bound lets ClickHouse skip older partitions on every poll.
LIVE_HORIZON_H = 24


class TablePoller(Poller):
    """Feeds ``observe`` from the attribution table: newly attributed requests, once each.

    A background ``Poller`` (every ``poll_s``); it works the same whether the attributor
    runs in this process (``latscope serve``) or in another (``latscope api`` beside collectors).
    A request re-attributed later (late spans) is not fed again: the histograms count it once.
    Memory is bounded by the requests written within ``POLL_LAG_US``, capped at ``max_seen``.
    """

    name = "attribution-poller"

    def __init__(
        self,
        store: Store,
        *,
        poll_s: float = 1.0,
        batch: int = 20_000,
        max_seen: int = 1_000_000,
        hub: LiveHub = HUB,
        from_start: bool = False,
    ) -> None:
        super().__init__(poll_s)
        self.store = store
        self.batch = batch
        self.max_seen = max_seen
        self.hub = hub
        self.from_start = from_start
        self._high_us = 0  # newest SpansIngestedAt seen
        self._seen: dict[str, int] = {}  # request id -> its SpansIngestedAt (us)

    def start(self) -> None:
        if not self.from_start:
            try:  # what is already stored is history, not news
                self._high_us = int(self.store.query_rows(LATEST_INGEST)[0][0] or 0)
                self._after_us = self._high_us + 1
            except StoreError as exc:
                log.warning("attribution poller: %s; starting from the beginning", exc)
        super().start()

    _after_us = 0

    def run_until_idle(self) -> int:
        """Poll until a read comes back short of a full page; returns how many were new."""
        fed = 0
        while True:
            new = self.poll_once()
            fed += new
            if new < self.batch:
                return fed

    def poll_once(self) -> int:
        """Read and feed what is new; returns how many requests were new."""
        after = max(self._after_us, self._high_us - POLL_LAG_US)
        table = self.store.query_arrow(
            RECENT_ROWS, {"after_us": after, "limit": self.batch, "horizon_h": LIVE_HORIZON_H}
        )
        if table.num_rows == 0:
            return 0
        ingested = [
            int(t.timestamp() * 1e6) if t is not None else 0
            for t in table.column("SpansIngestedAt").to_pylist()
        ]
        fresh = []
        # One row per inference call: a trace with several calls has several rows.
        keys = zip(
            table.column("TraceId").to_pylist(),
            table.column("RequestSpanId").to_pylist(),
            strict=True,
        )
        for i, (key, at_us) in enumerate(zip(keys, ingested, strict=True)):
            request = f"{key[0]}-{key[1]}"
            if request not in self._seen:
                self._seen[request] = at_us
                fresh.append(i)
        self._high_us = max(self._high_us, max(ingested))
        if table.num_rows >= self.batch:
            # A full page: move past it so the next read is not the same page again.
            self._after_us = max(ingested)
        self._forget()
        if not fresh:
            return 0
        return observe(table.take(fresh), hub=self.hub)

    def _forget(self) -> None:
        horizon = self._high_us - 2 * POLL_LAG_US
        if len(self._seen) > self.max_seen or next(iter(self._seen.values()), horizon) < horizon:
            self._seen = {t: at for t, at in self._seen.items() if at >= horizon}
            while len(self._seen) > self.max_seen:  # insertion order: oldest first
                self._seen.pop(next(iter(self._seen)))


def iter_subscription(sub: Subscription, *, alive: Any, poll_s: float = 0.5) -> Iterator[dict]:
    """Yield a subscription's requests while ``alive()`` is true; closes it at the end."""
    try:
        while alive() and not sub.closed.is_set():
            item = sub.get(poll_s)
            if item is not None:
                yield item
    finally:
        sub.close()
