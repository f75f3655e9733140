"""OTLP ingest against a real gRPC server, a real HTTP server and the embedded ClickHouse."""

from __future__ import annotations

import gzip
import json
import random
import threading
import time
import uuid
from pathlib import Path

import grpc
import httpx
import pytest
from google.rpc import error_details_pb2
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
    OTLPMetricExporter as GrpcMetricExporter,
)
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.metrics import Observation
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

from bench.ingest.traces import make_batch
from latscope.storage import Store
from tests.collector_harness import (
    Collector,
    FlakyStore,
    collector_fixture,  # noqa: F401 (fixture)
    count_spans,
    start_collector,
    store_fixture,  # noqa: F401 (fixture)
)

T0 = 1_763_000_000_000_000_000


def _service() -> str:
    return f"svc-{uuid.uuid4().hex[:12]}"


def _emit(provider: TracerProvider, n: int) -> None:
    tracer = provider.get_tracer("test.ingest", "1.2.3")
    for i in range(n):
        with tracer.start_as_current_span(f"op-{i}", kind=SpanKind.SERVER) as span:
            span.set_attribute("gen_ai.request.model", "llama-3-8b")
            span.set_attribute("i", i)
            span.set_attribute("ratio", 0.25)
            span.set_attribute("ok", True)
            span.set_attribute("tags", ["a", "b"])
            span.add_event("latscope.first_token", {"n": 1})
            if i % 2:
                span.set_status(Status(StatusCode.ERROR, "boom"))
    provider.force_flush()
    provider.shutdown()


def test_grpc_exporter_spans_are_stored_with_every_field(
    collector: Collector, store: Store
) -> None:
    service = _service()
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(
        SimpleSpanProcessor(GrpcSpanExporter(endpoint=collector.grpc, insecure=True, timeout=10))
    )
    _emit(provider, 5)
    collector.wait_stored()
    rows = store.query_rows(
        "SELECT SpanName, SpanKind, StatusCode, StatusMessage, SpanAttributes, ScopeName, "
        "ScopeVersion, ResourceAttributes['service.name'], Events.Name, "
        "Events.Attributes[1]['n'], length(TraceId), length(SpanId) "
        "FROM otel_traces WHERE ServiceName = {s:String} ORDER BY SpanName",
        {"s": service},
    )
    assert len(rows) == 5
    name, kind, code, message, attrs, scope, version, svc, events, ev_n, tl, sl = rows[1]
    assert (name, kind, code, message) == ("op-1", "Server", "Error", "boom")
    assert attrs["i"] == "1" and attrs["ratio"] == "0.25" and attrs["ok"] == "true"
    assert attrs["tags"] == '["a","b"]'
    assert (scope, version, svc) == ("test.ingest", "1.2.3", service)
    assert events == ["latscope.first_token"] and ev_n == "1"
    assert (tl, sl) == (32, 16)
    assert rows[0][2] == "Unset"


def test_http_exporter_protobuf(collector: Collector, store: Store) -> None:
    service = _service()
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    exporter = HttpSpanExporter(endpoint=f"{collector.http}/v1/traces", timeout=10)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _emit(provider, 4)
    collector.wait_stored()
    assert count_spans(store, service) == 4


def _json_export(service: str, spans: list[dict]) -> dict:
    return {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": service}}]
                },
                "scopeSpans": [{"scope": {"name": "browser"}, "spans": spans}],
            }
        ]
    }


def _json_span(i: int, **extra: object) -> dict:
    return {
        "traceId": f"{i + 1:032x}",
        "spanId": f"{i + 1:016x}",
        "name": f"fetch-{i}",
        "kind": 3,
        "startTimeUnixNano": str(T0 + i),
        "endTimeUnixNano": str(T0 + i + 1000),
        "attributes": [{"key": "n", "value": {"intValue": str(i)}}],
        **extra,
    }


def test_http_json_gzip_with_one_bad_span(collector: Collector, store: Store) -> None:
    service = _service()
    spans = [_json_span(i) for i in range(3)]
    spans.append(_json_span(9, endTimeUnixNano=str(T0)))  # ends before it starts
    body = gzip.compress(json.dumps(_json_export(service, spans)).encode())
    response = httpx.post(
        f"{collector.http}/v1/traces",
        content=body,
        headers={"content-type": "application/json", "content-encoding": "gzip"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    partial = response.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1"
    assert "end_time_unix_nano is before start_time_unix_nano" in partial["errorMessage"]
    collector.wait_stored()
    rows = store.query_rows(
        "SELECT TraceId, SpanId, SpanKind, SpanAttributes['n'] FROM otel_traces "
        "WHERE ServiceName = {s:String} ORDER BY SpanId",
        {"s": service},
    )
    assert rows[0] == (f"{1:032x}", f"{1:016x}", "Client", "0")
    assert len(rows) == 3


def _export(
    service: str, *, bad: int = 0, n: int = 5
) -> trace_service_pb2.ExportTraceServiceRequest:
    req = make_batch(random.Random(n), T0, 1)
    for rs in req.resource_spans:
        rs.resource.attributes[0].value.string_value = service
    spans = [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
    for span in spans[:bad]:
        span.span_id = b"\x00" * 8
    return req


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda s: setattr(s, "trace_id", b"\x01" * 15), "trace_id must be 16 bytes"),
        (lambda s: setattr(s, "trace_id", bytes(16)), "trace_id must be 16 bytes, not all zero"),
        (lambda s: setattr(s, "span_id", bytes(8)), "span_id must be 8 bytes"),
        (lambda s: setattr(s, "parent_span_id", b"\x01"), "parent_span_id"),
        (lambda s: s.attributes.add(key="big").value.__setattr__("string_value", "x" * 70_000),
         "more than 65536"),
    ],
)  # fmt: skip
def test_grpc_batch_with_one_bad_span(
    collector: Collector, store: Store, mutate: object, reason: str
) -> None:
    service = _service()
    req = _export(service)
    first = req.resource_spans[1].scope_spans[0].spans[2]
    mutate(first)  # type: ignore[operator]
    with grpc.insecure_channel(collector.grpc) as channel:
        reply = trace_service_pb2_grpc.TraceServiceStub(channel).Export(req, timeout=10)
    assert reply.partial_success.rejected_spans == 1
    assert reason in reply.partial_success.error_message
    collector.wait_stored()
    assert count_spans(store, service) == 6  # the other spans of the 7 are stored


def test_metrics_gauges_and_sums_are_stored(collector: Collector, store: Store) -> None:
    service = _service()
    exporter = GrpcMetricExporter(endpoint=collector.grpc, insecure=True, timeout=10)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=60_000)
    provider = MeterProvider(
        resource=Resource.create({"service.name": service}), metric_readers=[reader]
    )
    meter = provider.get_meter("latscope.sdk.gpu")
    meter.create_observable_gauge(
        "gpu.utilization",
        callbacks=[lambda _o: [Observation(87.5, {"gpu.uuid": "GPU-abc", "gpu.index": "0"})]],
        unit="%",
    )
    meter.create_counter("gpu.energy", unit="mJ").add(1200, {"gpu.uuid": "GPU-abc"})
    provider.shutdown()  # exports once
    rows = store.query_rows(
        "SELECT MetricName, MetricKind, Unit, Value, GpuUuid, GpuIndex FROM latscope_metrics "
        "WHERE ServiceName = {s:String} ORDER BY MetricName",
        {"s": service},
    )
    assert rows == [
        ("gpu.energy", "sum", "mJ", 1200.0, "GPU-abc", ""),
        ("gpu.utilization", "gauge", "%", 87.5, "GPU-abc", "0"),
    ]


@pytest.mark.subprocess
def test_token_required_on_grpc_and_http(store: Store, tmp_path: Path) -> None:
    c = start_collector(store, tmp_path / "spool", token="s3cret")
    try:
        service = _service()
        with grpc.insecure_channel(c.grpc) as channel:
            stub = trace_service_pb2_grpc.TraceServiceStub(channel)
            for metadata in ((), (("authorization", "Bearer wrong"),)):
                with pytest.raises(grpc.RpcError) as err:
                    stub.Export(_export(service), metadata=metadata, timeout=10)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            stub.Export(
                _export(service), metadata=(("authorization", "Bearer s3cret"),), timeout=10
            )
        body = _export(service).SerializeToString()
        headers = {"content-type": "application/x-protobuf"}
        assert httpx.post(f"{c.http}/v1/traces", content=body, headers=headers).status_code == 401
        ok = httpx.post(
            f"{c.http}/v1/traces", content=body,
            headers={**headers, "authorization": "Bearer s3cret"},
        )  # fmt: skip
        assert ok.status_code == 200
        assert httpx.get(f"{c.http}/healthz").status_code == 200
        c.wait_stored()
        assert count_spans(store, service) == 14
    finally:
        c.stop()


@pytest.mark.subprocess
def test_full_queue_answers_resource_exhausted(store: Store, tmp_path: Path) -> None:
    # ClickHouse stalls on the first batch. The Export behind it is journaled and acknowledged,
    # its rows waiting in memory; the third does not fit the queue and is refused with a
    # RetryInfo.
    slow = FlakyStore(store)
    slow.gate = threading.Event()
    c = start_collector(slow, tmp_path / "spool", queue_max_spans=14)
    try:
        service = _service()
        results: list[object] = []
        with grpc.insecure_channel(c.grpc) as channel:
            stub = trace_service_pb2_grpc.TraceServiceStub(channel)
            # A quiet collector acknowledges after the insert: this one waits for ClickHouse.
            first = threading.Thread(
                target=lambda: results.append(stub.Export(_export(service), timeout=20))
            )
            first.start()
            while not slow.blocked:  # the insert thread took its batch and is stuck
                time.sleep(0.01)
            results.append(stub.Export(_export(service), timeout=10))  # journaled, in memory
            with pytest.raises(grpc.RpcError) as err:
                stub.Export(_export(service), timeout=10)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            trailers = dict(err.value.trailing_metadata())
            info = error_details_pb2.RetryInfo.FromString(trailers["google.rpc.retryinfo-bin"])
            assert info.retry_delay.seconds >= 1
            response = httpx.post(
                f"{c.http}/v1/traces", content=_export(service).SerializeToString(),
                headers={"content-type": "application/x-protobuf"}, timeout=10,
            )  # fmt: skip
            assert response.status_code == 429
            assert int(response.headers["retry-after"]) >= 1
            slow.gate.set()
            first.join(20)
        assert len(results) == 2
        c.wait_stored()
        assert count_spans(store, service) == 14
        metrics = httpx.get(f"{c.http}/metrics").text
        assert 'latscope_collector_refused_total{signal="traces"}' in metrics
    finally:
        slow.gate.set()
        c.stop()


@pytest.mark.subprocess
def test_oversized_and_garbage_http_bodies_are_clear_errors(store: Store, tmp_path: Path) -> None:
    c = start_collector(store, tmp_path / "spool", grpc_max_message_bytes=4096)
    try:
        url = f"{c.http}/v1/traces"
        proto = {"content-type": "application/x-protobuf"}
        big = httpx.post(url, content=b"\x0a" * 5000, headers=proto)
        assert big.status_code == 413
        bomb = gzip.compress(b"\0" * 1_000_000)
        assert (
            httpx.post(url, content=bomb, headers={**proto, "content-encoding": "gzip"}).status_code
            == 413
        )
        assert httpx.post(url, content=b"\xff\xff\xff", headers=proto).status_code == 400
        bad_json = httpx.post(url, content=b"{nope", headers={"content-type": "application/json"})
        assert bad_json.status_code == 400 and "JSON" in bad_json.json()["message"]
        assert (
            httpx.post(url, content=b"x", headers={"content-type": "text/plain"}).status_code == 415
        )
        with grpc.insecure_channel(c.grpc) as channel:
            stub = trace_service_pb2_grpc.TraceServiceStub(channel)
            with pytest.raises(grpc.RpcError) as err:
                stub.Export(make_batch(random.Random(1), T0, 20), timeout=10)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # message too large
        assert httpx.get(f"{c.http}/healthz").status_code == 200
    finally:
        c.stop()
