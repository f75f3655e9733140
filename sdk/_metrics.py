"""The GenAI semantic conventions' server and client metrics, as OTLP histograms.

Server (per ``@inference`` call): ``gen_ai.server.request.duration``, and for successful
responses that produced tokens ``gen_ai.server.time_to_first_token`` and
``gen_ai.server.time_per_output_token``. Client (per GenAI call):
``gen_ai.client.operation.duration`` and, when the token counts are known,
``gen_ai.client.token.usage``. Bucket boundaries are the conventions' advice.

The histograms are aggregated here, not by OpenTelemetry's ``MeterProvider``: its
``Histogram.record`` builds a measurement object, validates the attributes, matches views and
offers an exemplar on every call (about 4 µs), and a request records three or four values, which
cost more than its seven spans' own latscope work. Here a request's values take one lookup of
their attribute set, one lock and a bisect each (``bench/sdk_overhead``). What leaves is what
OpenTelemetry's pipeline sends: ``MetricsData`` with the same names, units, boundaries,
attributes and temporality (cumulative, or delta when the exporter prefers it), encoded by the
same exporter.

Exported every ``interval_s`` (``OTEL_METRIC_EXPORT_INTERVAL``, default 60 s) from a worker thread
and at ``force_flush`` / ``shutdown``, over the same OTLP/gRPC endpoint as the spans.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from bisect import bisect_left
from collections.abc import Mapping
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from latscope.sdk import _guard, _otel
from latscope.semconv import GenAIMetrics as M

logger = logging.getLogger("latscope.sdk")

_SCOPE = InstrumentationScope("latscope.sdk")
#: Data points per histogram at most, OpenTelemetry's default cardinality limit: past
#: ``MAX_SERIES - 1`` attribute sets, measurements go to one overflow set,
#: ``otel.metric.overflow=true`` (the OpenTelemetry specification's rule).
MAX_SERIES = 2000
_OVERFLOW_KEY: frozenset[Any] = frozenset({("otel.metric.overflow", True)})

_EXPORT = _guard.handle_internal_errors("metrics.export")


class _Series:
    """One histogram's aggregate for one attribute set since ``start``."""

    __slots__ = ("attrs", "count", "counts", "max", "min", "start", "sum")

    def __init__(self, attrs: Mapping[str, Any], buckets: int, start: int) -> None:
        self.attrs = dict(attrs)
        self.counts = [0] * buckets
        self.reset(start)

    def reset(self, start: int) -> None:
        self.counts = [0] * len(self.counts)
        self.count = 0
        self.sum: float = 0
        self.min = float("inf")
        self.max = float("-inf")
        self.start = start


class _Histogram:
    """One instrument: its series by attribute set (a frozenset of the attribute items)."""

    __slots__ = ("bounds", "buckets", "name", "series", "unit")

    def __init__(self, spec: tuple[str, str, tuple[float, ...]]) -> None:
        self.name, self.unit, self.bounds = spec
        self.buckets = len(self.bounds) + 1
        self.series: dict[frozenset[Any], _Series] = {}

    def add(self, key: frozenset[Any], attrs: Mapping[str, Any], value: float) -> None:
        """Count ``value`` (the caller holds the lock); OpenTelemetry's bucket rule: a bucket
        holds the values above the bound before it, up to and including its own bound."""
        s = self.series.get(key)
        if s is None:
            s = self._new_series(key, attrs)
        s.counts[bisect_left(self.bounds, value)] += 1
        s.count += 1
        s.sum += value
        if value < s.min:
            s.min = value
        if value > s.max:
            s.max = value

    def _new_series(self, key: frozenset[Any], attrs: Mapping[str, Any]) -> _Series:
        if len(self.series) >= MAX_SERIES - 1:
            key, attrs = _OVERFLOW_KEY, dict(_OVERFLOW_KEY)
            found = self.series.get(key)
            if found is not None:
                return found
            logger.warning(
                "latscope SDK: %s has %d attribute sets; further ones are counted under "
                "otel.metric.overflow=true",
                self.name,
                MAX_SERIES,
            )
        s = self.series[key] = _Series(attrs, self.buckets, time.time_ns())
        return s

    def points(self, now: int) -> list[HistogramDataPoint]:
        """The data points as of ``now``, one per attribute set measured since its ``start``."""
        return [
            HistogramDataPoint(
                attributes=s.attrs,
                start_time_unix_nano=s.start,
                time_unix_nano=now,
                count=s.count,
                sum=s.sum,
                bucket_counts=list(s.counts),
                explicit_bounds=list(self.bounds),
                min=s.min,
                max=s.max,
            )
            for s in self.series.values()
            if s.count
        ]


class GenAIMetrics:
    """Owns the GenAI histograms and their export; ``server()`` / ``client()`` record one
    finished call."""

    def __init__(
        self,
        exporter: MetricExporter,
        resource: Resource,
        interval_s: float,
        export_timeout_s: float = 10.0,
    ) -> None:
        self._exporter = exporter
        self._resource = resource
        self._interval = max(0.01, interval_s)
        self._timeout = export_timeout_s
        self._delta = _otel.prefers_delta(exporter)
        self._lock = threading.Lock()
        self._export_lock = threading.Lock()
        self._duration = _Histogram(M.SERVER_REQUEST_DURATION)
        self._ttft = _Histogram(M.SERVER_TIME_TO_FIRST_TOKEN)
        self._tpot = _Histogram(M.SERVER_TIME_PER_OUTPUT_TOKEN)
        self._client_duration = _Histogram(M.CLIENT_OPERATION_DURATION)
        self._usage = _Histogram(M.CLIENT_TOKEN_USAGE)
        self._all = (self._duration, self._ttft, self._tpot, self._client_duration, self._usage)
        self._stop = threading.Event()
        self._thread = self._start_thread()
        # Pre-fork servers (gunicorn) configure in the parent; the thread does not survive fork.
        if hasattr(os, "register_at_fork"):
            ref = weakref.WeakMethod(self._after_fork)
            os.register_at_fork(after_in_child=lambda: (m := ref()) and m())

    def server(
        self,
        attrs: Mapping[str, Any],
        duration_ns: int,
        ttft_ns: int | None,
        tpot_ns: int | None,
        key: frozenset[Any] | None = None,
    ) -> None:
        """One request; TTFT and TPOT only for successful responses (the conventions' rule).
        ``key``: ``frozenset(attrs.items())`` when the caller keeps it."""
        if key is None:
            key = frozenset(attrs.items())
        with self._lock:
            self._duration.add(key, attrs, duration_ns / 1e9)
            if ttft_ns is not None:
                self._ttft.add(key, attrs, ttft_ns / 1e9)
            if tpot_ns is not None:
                self._tpot.add(key, attrs, tpot_ns / 1e9)

    def client(
        self,
        attrs: Mapping[str, Any],
        duration_ns: int,
        input_tokens: int | None,
        output_tokens: int | None,
    ) -> None:
        key = frozenset(attrs.items())
        with self._lock:
            self._client_duration.add(key, attrs, duration_ns / 1e9)
        for kind, tokens in ((M.TOKEN_INPUT, input_tokens), (M.TOKEN_OUTPUT, output_tokens)):
            if tokens is not None:
                labelled = {**attrs, M.TOKEN_TYPE: kind}
                with self._lock:
                    self._usage.add(frozenset(labelled.items()), labelled, tokens)

    # export ---------------------------------------------------------------------------------
    def collect(self) -> MetricsData | None:
        """What the histograms hold now, as OpenTelemetry's ``MetricsData``; None when empty.
        With delta temporality the aggregates start again from here, as OpenTelemetry's do: the
        next interval starts now, and an attribute set with nothing new in it is left out."""
        now = time.time_ns()
        temporality = (
            AggregationTemporality.DELTA if self._delta else AggregationTemporality.CUMULATIVE
        )
        with self._lock:
            metrics = [
                Metric(
                    name=h.name,
                    description="",
                    unit=h.unit,
                    data=Histogram(data_points=points, aggregation_temporality=temporality),
                )
                for h in self._all
                if (points := h.points(now))
            ]
            if self._delta:
                for h in self._all:
                    for s in h.series.values():
                        s.reset(now)
        if not metrics:
            return None
        scope = ScopeMetrics(scope=_SCOPE, metrics=metrics, schema_url="")
        return MetricsData(
            resource_metrics=[
                ResourceMetrics(resource=self._resource, scope_metrics=[scope], schema_url="")
            ]
        )

    def _export(self, timeout_s: float) -> bool:
        """Export what is held now; False when that raised. A refused export loses nothing:
        cumulative histograms carry it in the next one (OpenTelemetry's reader does the same)."""
        done = False
        with self._export_lock, _EXPORT:
            data = self.collect()
            if data is not None:
                result = self._exporter.export(data, timeout_millis=timeout_s * 1000)
                if result is not MetricExportResult.SUCCESS:
                    logger.debug("latscope SDK: metrics export failed (%s)", result)
            done = True
        return done

    def _start_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="latscope-metrics", daemon=True)
        thread.start()
        return thread

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._export(self._timeout)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._export_lock = threading.Lock()
        for h in self._all:  # the parent exports its own requests
            h.series = {}
        if not self._stop.is_set():
            self._stop = threading.Event()
            self._thread = self._start_thread()

    def force_flush(self, timeout_s: float) -> bool:
        return self._export(timeout_s) and bool(
            self._exporter.force_flush(timeout_millis=timeout_s * 1000)
        )

    def shutdown(self, timeout_s: float) -> None:
        """Stop the worker, export what is held (bounded by ``timeout_s``), close the exporter."""
        if self._stop.is_set():
            return
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        self._thread.join(timeout_s)
        try:
            self._export(max(0.05, deadline - time.monotonic()))
        finally:
            self._exporter.shutdown(timeout_millis=max(50.0, (deadline - time.monotonic()) * 1000))
