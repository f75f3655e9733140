"""The GenAI semantic conventions' server and client metrics, as OTLP histograms.

Server (per ``@inference`` call): ``gen_ai.server.request.duration``, and for successful
responses that produced tokens ``gen_ai.server.time_to_first_token`` and
``gen_ai.server.time_per_output_token``. Client (per GenAI call):
``gen_ai.client.operation.duration`` and, when the token counts are known,
``gen_ai.client.token.usage``. Bucket boundaries are the
conventions' advice, set with Views on latscope's own ``MeterProvider`` (Views exist in every
OpenTelemetry SDK latscope supports; the instruments' advisory parameter came later).

Exported every ``interval_s`` (``OTEL_METRIC_EXPORT_INTERVAL``, default 60 s) and at
``force_flush`` / ``shutdown``, over the same OTLP/gRPC endpoint as the spans.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource

from latscope.semconv import GenAIMetrics as M

_SCOPE = "latscope.sdk"
_INSTRUMENTS = (
    M.SERVER_REQUEST_DURATION,
    M.SERVER_TIME_TO_FIRST_TOKEN,
    M.SERVER_TIME_PER_OUTPUT_TOKEN,
    M.CLIENT_OPERATION_DURATION,
    M.CLIENT_TOKEN_USAGE,
)


class GenAIMetrics:
    """Owns the metrics pipeline; ``server()`` / ``client()`` record one finished call."""

    def __init__(self, exporter: MetricExporter, resource: Resource, interval_s: float) -> None:
        reader = PeriodicExportingMetricReader(
            exporter, export_interval_millis=max(10.0, interval_s * 1000)
        )
        views = [
            View(
                instrument_name=name,
                aggregation=ExplicitBucketHistogramAggregation(boundaries=list(bounds)),
            )
            for name, _, bounds in _INSTRUMENTS
        ]
        self.provider = MeterProvider(
            resource=resource, metric_readers=[reader], views=views, shutdown_on_exit=False
        )
        meter = self.provider.get_meter(_SCOPE)
        made = {name: meter.create_histogram(name, unit=unit) for name, unit, _ in _INSTRUMENTS}
        self._duration = made[M.SERVER_REQUEST_DURATION[0]]
        self._ttft = made[M.SERVER_TIME_TO_FIRST_TOKEN[0]]
        self._tpot = made[M.SERVER_TIME_PER_OUTPUT_TOKEN[0]]
        self._client_duration = made[M.CLIENT_OPERATION_DURATION[0]]
        self._usage = made[M.CLIENT_TOKEN_USAGE[0]]

    def server(
        self,
        attrs: Mapping[str, Any],
        duration_ns: int,
        ttft_ns: int | None,
        tpot_ns: int | None,
    ) -> None:
        """One request; TTFT and TPOT only for successful responses (the conventions' rule)."""
        self._duration.record(duration_ns / 1e9, attrs)
        if ttft_ns is not None:
            self._ttft.record(ttft_ns / 1e9, attrs)
        if tpot_ns is not None:
            self._tpot.record(tpot_ns / 1e9, attrs)

    def client(
        self,
        attrs: Mapping[str, Any],
        duration_ns: int,
        input_tokens: int | None,
        output_tokens: int | None,
    ) -> None:
        self._client_duration.record(duration_ns / 1e9, attrs)
        if input_tokens is not None:
            self._usage.record(input_tokens, {**attrs, M.TOKEN_TYPE: M.TOKEN_INPUT})
        if output_tokens is not None:
            self._usage.record(output_tokens, {**attrs, M.TOKEN_TYPE: M.TOKEN_OUTPUT})

    def force_flush(self, timeout_s: float) -> bool:
        return bool(self.provider.force_flush(timeout_millis=timeout_s * 1000))

    def shutdown(self, timeout_s: float) -> None:
        self.provider.shutdown(timeout_millis=timeout_s * 1000)
