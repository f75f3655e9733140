"""OTLP metrics into ClickHouse: histograms, exponential histograms and sums, over gRPC and
OTLP/HTTP, from the OpenTelemetry SDK and from latscope's own SDK (the GenAI conventions'
histograms), against a real collector and the embedded store."""

from __future__ import annotations

import uuid

import httpx
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.sdk.metrics import Counter, MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import (
    ExplicitBucketHistogramAggregation,
    ExponentialBucketHistogramAggregation,
    View,
)
from opentelemetry.sdk.resources import Resource

from latscope import sdk
from latscope.semconv import GenAIAttributes, GenAIMetrics
from latscope.storage import Store
from tests.collector_harness import (
    Collector,
    collector_fixture,  # noqa: F401 (fixture)
    store_fixture,  # noqa: F401 (fixture)
)

T0 = 1_763_000_000_000_000_000
DELTA = metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
CUMULATIVE = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE


def _service() -> str:
    return f"svc-{uuid.uuid4().hex[:12]}"


def test_histograms_and_sums_from_the_otel_sdk_are_stored(
    collector: Collector, store: Store
) -> None:
    service = _service()
    exporter = OTLPMetricExporter(
        endpoint=collector.grpc,
        insecure=True,
        timeout=10,
        preferred_temporality={Counter: AggregationTemporality.DELTA},
    )
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=60_000)
    views = [
        View(
            instrument_name="ttft",
            aggregation=ExplicitBucketHistogramAggregation(boundaries=[0.1, 0.5, 1.0]),
        ),
        View(instrument_name="tpot", aggregation=ExponentialBucketHistogramAggregation()),
    ]
    provider = MeterProvider(
        resource=Resource.create({"service.name": service}), metric_readers=[reader], views=views
    )
    meter = provider.get_meter("test.metrics", "9.9")
    ttft = meter.create_histogram("ttft", unit="s", description="time to first token")
    for v in (0.05, 0.3, 0.3, 2.0):
        ttft.record(v, {"model": "llama"})
    tpot = meter.create_histogram("tpot", unit="s")
    for v in (0.02, 0.03, 0.04):
        tpot.record(v)
    meter.create_counter("requests").add(5, {"model": "llama"})
    meter.create_up_down_counter("in_flight").add(-2)
    provider.shutdown()  # exports once; the Export is acknowledged once stored

    (row,) = store.query_rows(
        "SELECT MetricName, Unit, MetricDescription, ScopeName, ScopeVersion, Count, Sum, Min, "
        "Max, BucketCounts, ExplicitBounds, Attributes['model'], AggregationTemporality "
        "FROM latscope_metrics_histogram WHERE ServiceName = {s:String}",
        {"s": service},
    )
    assert row == (
        "ttft", "s", "time to first token", "test.metrics", "9.9", 4, 2.65, 0.05, 2.0,
        [1, 2, 0, 1], [0.1, 0.5, 1.0], "llama", CUMULATIVE,
    )  # fmt: skip
    (exp,) = store.query_rows(
        "SELECT MetricName, Count, Min, Max, Scale, ZeroCount, arraySum(PositiveBucketCounts), "
        "arraySum(NegativeBucketCounts) FROM latscope_metrics_exponential_histogram "
        "WHERE ServiceName = {s:String}",
        {"s": service},
    )
    assert exp[:4] == ("tpot", 3, 0.02, 0.04)
    assert -10 <= exp[4] <= 20 and exp[5] == 0 and exp[6] == 3 and exp[7] == 0
    sums = store.query_rows(
        "SELECT MetricName, MetricKind, Value, AggregationTemporality, IsMonotonic "
        "FROM latscope_metrics WHERE ServiceName = {s:String} ORDER BY MetricName",
        {"s": service},
    )
    assert sums == [
        ("in_flight", "sum", -2.0, CUMULATIVE, False),
        ("requests", "sum", 5.0, DELTA, True),
    ]


def _kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def _export(
    service: str, *metrics: metrics_pb2.Metric
) -> metrics_service_pb2.ExportMetricsServiceRequest:
    request = metrics_service_pb2.ExportMetricsServiceRequest()
    rm = request.resource_metrics.add()
    rm.resource.attributes.append(_kv("service.name", service))
    rm.scope_metrics.add().metrics.extend(metrics)
    return request


def _histogram(name: str, points: list[metrics_pb2.HistogramDataPoint]) -> metrics_pb2.Metric:
    metric = metrics_pb2.Metric(name=name, unit="s")
    metric.histogram.aggregation_temporality = DELTA
    metric.histogram.data_points.extend(points)
    return metric


def _point(**kwargs: object) -> metrics_pb2.HistogramDataPoint:
    return metrics_pb2.HistogramDataPoint(
        start_time_unix_nano=T0, time_unix_nano=T0 + 10**9, **kwargs
    )


def test_invalid_points_are_rejected_alone_with_a_reason(
    collector: Collector, store: Store
) -> None:
    service = _service()
    good = _point(count=3, sum=1.5, bucket_counts=[1, 2], explicit_bounds=[0.5])
    bad_counts = _point(count=3, bucket_counts=[1, 2, 0], explicit_bounds=[0.5])
    bad_bounds = _point(count=2, bucket_counts=[1, 1, 0], explicit_bounds=[1.0, 0.5])
    bad_total = _point(count=9, bucket_counts=[1, 2], explicit_bounds=[0.5])
    exp = metrics_pb2.Metric(name="exp")
    exp.exponential_histogram.data_points.add(time_unix_nano=T0, count=1, scale=40, zero_count=1)
    summary = metrics_pb2.Metric(name="legacy")
    summary.summary.data_points.add(time_unix_nano=T0, count=1, sum=1.0)
    request = _export(
        service, _histogram("h", [good, bad_counts, bad_bounds, bad_total]), exp, summary
    )
    reply = httpx.post(
        f"{collector.http}/v1/metrics",
        content=request.SerializeToString(),
        headers={"content-type": "application/x-protobuf"},
        timeout=30,
    )
    assert reply.status_code == 200
    answer = metrics_service_pb2.ExportMetricsServiceResponse.FromString(reply.content)
    assert answer.partial_success.rejected_data_points == 5
    assert "one more count than bounds" in answer.partial_success.error_message
    rows = store.query_rows(
        "SELECT Count, Sum, BucketCounts FROM latscope_metrics_histogram "
        "WHERE ServiceName = {s:String}",
        {"s": service},
    )
    assert rows == [(3, 1.5, [1, 2])]
    # Each reason, point by point, from the mapping itself.
    from latscope.collector.mapping import MetricColumns

    for metric, reason in (
        (_histogram("h", [bad_bounds]), "strictly increasing"),
        (_histogram("h", [bad_total]), "not the sum of the bucket counts"),
        (exp, "scale 40 is outside -10..20"),
        (summary, "type summary is not stored"),
    ):
        cols = MetricColumns()
        cols.add(_export(service, metric).resource_metrics)
        assert cols.rejected == 1 and reason in cols.first_problem, cols.first_problem


def test_otlp_json_exponential_histogram_with_an_exemplar(
    collector: Collector, store: Store
) -> None:
    service = _service()
    trace_id, span_id = "5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174"
    body = {
        "resourceMetrics": [{
            "resource": {"attributes": [
                {"key": "service.name", "value": {"stringValue": service}},
            ]},
            "scopeMetrics": [{"metrics": [{
                "name": "gen_ai.server.time_to_first_token",
                "unit": "s",
                "exponentialHistogram": {
                    "aggregationTemporality": 2,
                    "dataPoints": [{
                        "startTimeUnixNano": str(T0),
                        "timeUnixNano": str(T0 + 10**9),
                        "count": "4", "sum": 0.9, "min": 0.1, "max": 0.4,
                        "scale": 3, "zeroCount": "1",
                        "positive": {"offset": -20, "bucketCounts": ["1", "0", "2"]},
                        "exemplars": [{
                            "timeUnixNano": str(T0 + 5), "asDouble": 0.4,
                            "traceId": trace_id, "spanId": span_id,
                            "filteredAttributes": [{"key": "k", "value": {"intValue": "7"}}],
                        }],
                    }],
                },
            }]}],
        }]
    }  # fmt: skip
    reply = httpx.post(f"{collector.http}/v1/metrics", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.json() == {}
    (row,) = store.query_rows(
        "SELECT Count, Sum, Scale, ZeroCount, PositiveOffset, PositiveBucketCounts, "
        "`Exemplars.TraceId`, `Exemplars.SpanId`, `Exemplars.Value`, "
        "`Exemplars.FilteredAttributes`, AggregationTemporality "
        "FROM latscope_metrics_exponential_histogram WHERE ServiceName = {s:String}",
        {"s": service},
    )
    assert row == (
        4,
        0.9,
        3,
        1,
        -20,
        [1, 0, 2],
        [trace_id],
        [span_id],
        [0.4],
        [{"k": "7"}],
        CUMULATIVE,
    )


def test_sdk_genai_metrics_land_with_the_conventions_buckets(
    collector: Collector, store: Store
) -> None:
    """The latscope SDK's gen_ai.* histograms, through the real OTLP exporter, into the store."""
    service = _service()

    @sdk.inference(model="llama-3-8b", provider="vllm")
    def handle(n: int) -> None:
        with sdk.phase("decode"):
            for _ in range(n):
                sdk.record_token()

    sdk.configure(service_name=service, endpoint=collector.grpc, gpu=False, metrics_interval_s=3600)
    try:
        handle(5)
        with sdk.client_call("POST", "http://llm:8000/v1/chat/completions", model="m") as call:
            call.first_token()
            call.set_usage(input_tokens=12, output_tokens=5)
        assert sdk.force_flush(timeout_s=30)
    finally:
        sdk.shutdown()
    rows = store.query_rows(
        "SELECT MetricName, Unit, Count, ExplicitBounds, Attributes "
        "FROM latscope_metrics_histogram WHERE ServiceName = {s:String} "
        "ORDER BY MetricName, Attributes['gen_ai.token.type']",
        {"s": service},
    )
    got = {(name, attrs.get(GenAIMetrics.TOKEN_TYPE, "")): (unit, count, bounds, attrs)
           for name, unit, count, bounds, attrs in rows}  # fmt: skip
    expected = {
        GenAIMetrics.SERVER_REQUEST_DURATION,
        GenAIMetrics.SERVER_TIME_TO_FIRST_TOKEN,
        GenAIMetrics.SERVER_TIME_PER_OUTPUT_TOKEN,
        GenAIMetrics.CLIENT_OPERATION_DURATION,
    }
    for name, unit, bounds in expected:
        got_unit, count, got_bounds, attrs = got[(name, "")]
        assert (got_unit, count, got_bounds) == (unit, 1, list(bounds)), name
        assert attrs[GenAIAttributes.OPERATION_NAME] == "chat"
    server = got[(GenAIMetrics.SERVER_REQUEST_DURATION[0], "")][3]
    assert server[GenAIAttributes.PROVIDER_NAME] == "vllm"
    assert server[GenAIAttributes.REQUEST_MODEL] == "llama-3-8b"
    client = got[(GenAIMetrics.CLIENT_OPERATION_DURATION[0], "")][3]
    assert client["server.address"] == "llm" and client["server.port"] == "8000"
    name, unit, bounds = GenAIMetrics.CLIENT_TOKEN_USAGE
    for token_type in ("input", "output"):
        got_unit, count, got_bounds, attrs = got[(name, token_type)]
        assert (got_unit, count, got_bounds) == (unit, 1, list(bounds))
    # Cumulative: force_flush and shutdown each export the same running totals.
    sums = store.query_rows(
        "SELECT Attributes['gen_ai.token.type'] AS t, argMax(Sum, Timestamp) "
        "FROM latscope_metrics_histogram "
        "WHERE ServiceName = {s:String} AND MetricName = {m:String} GROUP BY t ORDER BY t",
        {"s": service, "m": name},
    )
    assert sums == [("input", 12.0), ("output", 5.0)]
