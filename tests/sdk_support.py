"""Shared helpers for the SDK tests: an in-memory span capture, uvicorn on a free port and real
OTLP/gRPC trace and metrics services on loopback.

Only the SDK's own dependencies and the SDK test tools are imported here (the SDK tests also
run in an environment without the server extra, on the lowest declared OpenTelemetry)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from typing import Any

import grpc
import uvicorn
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from latscope import sdk
from latscope.sdk import _guard


class NullMetricExporter(MetricExporter):
    """A metric exporter that accepts everything (the metrics pipeline runs, nothing leaves)."""

    def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None


class Capture:
    """Spans the SDK exported in this test, by name and kind."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.exporter = exporter

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        assert len(found) == 1, f"expected one {name!r} span, got {[s.name for s in self.spans()]}"
        return found[0]

    def wait_for(self, name: str, timeout_s: float = 10.0) -> ReadableSpan:
        """The one span called ``name``, waiting for it to end: a streaming server's span ends
        after its last chunk is written, which can be after the client has read that chunk."""
        deadline = time.monotonic() + timeout_s
        while not self.named(name) and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.one(name)

    def phases(self) -> dict[str, ReadableSpan]:
        return {
            s.attributes["latscope.phase"]: s
            for s in self.spans()
            if s.attributes and "latscope.phase" in s.attributes
        }

    def clear(self) -> None:
        self.exporter.clear()


@contextmanager
def capture(**kwargs: Any) -> Iterator[Capture]:
    exporter = InMemorySpanExporter()
    kwargs.setdefault("gpu", False)
    kwargs.setdefault("service_name", "test-svc")
    kwargs.setdefault("metrics", False)  # tests of the metrics turn them on with an exporter
    sdk.configure(span_exporter=exporter, **kwargs)
    try:
        yield Capture(exporter)
    finally:
        sdk.shutdown()
        _guard.reset()


@contextmanager
def run_app(app: Any, lifespan: str = "off") -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port; yields its base URL."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan=lifespan)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """A real OTLP TraceService on loopback whose behaviour each test picks."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.calls = 0
        self.names: list[str] = []
        self.metadata: list[dict[str, str]] = []
        self.release = threading.Event()
        self.entered = threading.Event()

    def Export(self, request, context):
        self.calls += 1
        self.metadata.append(dict(context.invocation_metadata()))
        self.names += [
            span.name for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans
        ]
        if self.mode == "refuse":
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "collector queue full")
        if self.mode == "hang":
            self.entered.set()
            self.release.wait(10)
        return trace_service_pb2.ExportTraceServiceResponse()


@contextmanager
def collector(mode: str) -> Iterator[tuple[Collector, str]]:
    servicer = Collector(mode)
    server = grpc.server(futures.ThreadPoolExecutor(4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        servicer.release.set()
        server.stop(0).wait()


class MetricsCollector(metrics_service_pb2_grpc.MetricsServiceServicer):
    """A real OTLP MetricsService on loopback that keeps every histogram point it is sent."""

    def __init__(self) -> None:
        self.requests: list[metrics_service_pb2.ExportMetricsServiceRequest] = []

    def Export(self, request, context):
        self.requests.append(request)
        return metrics_service_pb2.ExportMetricsServiceResponse()

    def histograms(self, name: str) -> list[tuple[dict[str, Any], Any]]:
        """(attributes, data point) of metric ``name``: the latest point of each series
        (cumulative points repeat at every export: a flush, then the shutdown)."""
        found: dict[tuple, tuple[dict[str, Any], Any]] = {}
        for request in self.requests:
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        if metric.name == name and metric.WhichOneof("data") == "histogram":
                            for p in metric.histogram.data_points:
                                attrs = {
                                    kv.key: getattr(kv.value, kv.value.WhichOneof("value"))
                                    for kv in p.attributes
                                }
                                found[tuple(sorted(attrs.items()))] = (attrs, p)
        return list(found.values())

    def names(self) -> set[str]:
        return {
            m.name
            for r in self.requests
            for rm in r.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
        }


@contextmanager
def metrics_collector() -> Iterator[tuple[MetricsCollector, str]]:
    servicer = MetricsCollector()
    server = grpc.server(futures.ThreadPoolExecutor(2))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        server.stop(0).wait()
