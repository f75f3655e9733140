"""OTLP/gRPC exporters for spans and metrics: one ``Export`` per call, bounded by the export
timeout, no retries of their own.

OpenTelemetry's own gRPC exporters retry inside ``export()``, and before 1.3x they did so for up
to 63 s whatever the timeout said, so a collector that is down could hold an app's
``force_flush`` or exit for a minute. Here the span processor (``_export``) keeps its queue and
backs off between attempts, and metrics are cumulative, so the next export carries what a
failed one lost. The requests are built with OpenTelemetry's public encoders
(``opentelemetry.exporter.otlp.proto.common``), the same on every version in latscope's range.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import grpc
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2_grpc import MetricsServiceStub
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from latscope.sdk._options import ExportOptions, grpc_headers, grpc_target

logger = logging.getLogger("latscope.sdk")


def _channel(exp: ExportOptions) -> grpc.Channel:
    target, insecure = grpc_target(exp)
    if insecure:
        return grpc.insecure_channel(target)
    roots = None
    if exp.certificate:
        with open(exp.certificate, "rb") as f:
            roots = f.read()
    return grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=roots))


class _Link:
    """One channel and its stub; ``call`` sends a request, True when the collector took it."""

    def __init__(self, exp: ExportOptions, stub: Any) -> None:
        self._channel = _channel(exp)
        self._export = stub(self._channel).Export
        self._metadata = tuple(grpc_headers(exp).items())
        self._timeout = exp.timeout_s
        self._target = grpc_target(exp)[0]

    def call(self, request: Any, signal: str) -> bool:
        try:
            self._export(request, metadata=self._metadata, timeout=self._timeout)
            return True
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            logger.debug("OTLP %s export to %s failed: %s", signal, self._target, code)
            return False

    def close(self) -> None:
        self._channel.close()


class OtlpSpanExporter(SpanExporter):
    """Spans to an OTLP/gRPC ``TraceService``; one attempt per ``export``."""

    def __init__(self, exp: ExportOptions) -> None:
        self._link = _Link(exp, TraceServiceStub)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        ok = self._link.call(encode_spans(spans), "traces")
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self._link.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # nothing is buffered here


class OtlpMetricExporter(MetricExporter):
    """Metrics to an OTLP/gRPC ``MetricsService``; one attempt per ``export``."""

    def __init__(self, exp: ExportOptions) -> None:
        super().__init__()
        self._link = _Link(exp, MetricsServiceStub)

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        ok = self._link.call(encode_metrics(metrics_data), "metrics")
        return MetricExportResult.SUCCESS if ok else MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._link.close()
