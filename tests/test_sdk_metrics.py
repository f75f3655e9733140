"""The GenAI semantic conventions' histograms, exported by the SDK's real OTLP metric exporter to
a real MetricsService on loopback: names, units, bucket boundaries and attributes."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from examples.client import chat, make_client
from examples.inference_server import MODEL, create_app
from latscope import sdk
from latscope.semconv import GenAIAttributes, GenAIMetrics
from tests.sdk_support import (
    MetricsCollector,
    NullMetricExporter,
    capture,
    metrics_collector,
    run_app,
)

MS = 1_000_000


class Clock:
    """Each reading 1 ms after the last: every duration the SDK measures is predictable."""

    def __init__(self) -> None:
        self.t = 1_700_000_000_000_000_000

    def __call__(self) -> int:
        self.t += MS
        return self.t


def _one(servicer: MetricsCollector, metric: tuple, **attrs: object) -> object:
    name, _, bounds = metric
    points = [
        p for a, p in servicer.histograms(name) if all(a.get(k) == v for k, v in attrs.items())
    ]
    assert len(points) == 1, (name, attrs, servicer.histograms(name))
    (point,) = points
    assert list(point.explicit_bounds) == list(bounds), name
    return point


def test_server_histograms_for_a_streamed_request_and_a_failed_one() -> None:
    @sdk.inference(model="llama-3-8b", provider="vllm")
    async def generate(n: int):
        with sdk.phase("prefill"):
            pass
        with sdk.phase("decode"):
            for i in range(n):
                sdk.record_token()
                yield i

    @sdk.inference(model="llama-3-8b", provider="vllm", system="ignored-alias")
    def broken() -> None:
        with sdk.phase("decode"):
            sdk.record_token()
        raise TimeoutError("backend timed out")

    async def drain() -> list[int]:
        return [i async for i in generate(4)]

    with (
        metrics_collector() as (servicer, addr),
        capture(metrics=True, endpoint=addr, clock=Clock(), metrics_interval_s=3600) as cap,
    ):
        assert asyncio.run(drain()) == [0, 1, 2, 3]
        with pytest.raises(TimeoutError):
            broken()
        server = cap.named("chat llama-3-8b")[0]
        assert server.attributes[GenAIAttributes.PROVIDER_NAME] == "vllm"
        assert GenAIAttributes.SYSTEM not in server.attributes
        assert sdk.force_flush(timeout_s=10)
    base = {
        GenAIAttributes.OPERATION_NAME: "chat",
        GenAIAttributes.PROVIDER_NAME: "vllm",
        GenAIAttributes.REQUEST_MODEL: "llama-3-8b",
    }
    ok = _one(servicer, GenAIMetrics.SERVER_REQUEST_DURATION, **base, **{"error.type": None})
    failed = _one(servicer, GenAIMetrics.SERVER_REQUEST_DURATION, **{"error.type": "TimeoutError"})
    assert ok.count == failed.count == 1
    assert ok.sum > 0 and failed.sum > 0
    # The clock moves 1 ms a reading: TTFT and TPOT are whole milliseconds, in seconds.
    ttft = _one(servicer, GenAIMetrics.SERVER_TIME_TO_FIRST_TOKEN, **base)
    tpot = _one(servicer, GenAIMetrics.SERVER_TIME_PER_OUTPUT_TOKEN, **base)
    assert ttft.count == tpot.count == 1  # the failed request is not a successful response
    assert ttft.sum == pytest.approx(round(ttft.sum, 3)) and ttft.sum >= 0.002
    assert tpot.sum == pytest.approx(0.001)


def test_client_histograms_through_openai_and_httpx() -> None:
    """A streamed chat with usage, a plain one, both through the instrumented openai client."""
    with (
        metrics_collector() as (servicer, addr),
        capture(metrics=True, endpoint=addr, metrics_interval_s=3600),
        run_app(create_app(token_delay_s=0.0)) as base,
        make_client(f"{base}/v1") as client,
    ):
        assert chat(client, "one two three") == "one two three"
        streamed = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "a b c d"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == "a b c d"
        assert chat(client, "x y", stream=False) == "x y"
        assert sdk.force_flush(timeout_s=10)
    attrs = {
        GenAIAttributes.OPERATION_NAME: "chat",
        GenAIAttributes.PROVIDER_NAME: "openai",
        GenAIAttributes.REQUEST_MODEL: MODEL,
        "server.address": "127.0.0.1",
    }
    duration = _one(servicer, GenAIMetrics.CLIENT_OPERATION_DURATION, **attrs)
    assert duration.count == 3
    usage = {
        t: _one(servicer, GenAIMetrics.CLIENT_TOKEN_USAGE, **attrs, **{"gen_ai.token.type": t})
        for t in ("input", "output")
    }
    # Usage is known for the stream that asked for it and for the JSON answer, not the first.
    assert usage["input"].count == usage["output"].count == 2
    assert usage["input"].sum == 4 + 2 and usage["output"].sum == 4 + 2


def test_metrics_off_sends_none(monkeypatch: pytest.MonkeyPatch) -> None:
    @sdk.inference(model="m")
    def handle() -> None:
        pass

    monkeypatch.setenv("LATSCOPE_METRICS", "off")
    with metrics_collector() as (servicer, addr):
        spans = InMemorySpanExporter()
        sdk.configure(service_name="quiet", endpoint=addr, gpu=False, span_exporter=spans)
        try:
            handle()
            assert sdk.force_flush(timeout_s=5)
        finally:
            sdk.shutdown(timeout_s=2)
        assert servicer.requests == []
        assert [s.name for s in spans.get_finished_spans()] == ["chat m"]
    with pytest.raises(ValueError, match="metrics_interval_s"):
        sdk.configure(metrics_interval_s=0)


def _flat(data: object) -> dict[tuple, tuple]:
    """MetricsData as {(scope, name, unit, attributes): (temporality, count, sum, buckets, ...)}."""
    out = {}
    for rm in data.resource_metrics if data is not None else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    key = (sm.scope.name, m.name, m.unit, frozenset(p.attributes.items()))
                    out[key] = (
                        m.data.aggregation_temporality,
                        p.count,
                        p.sum,
                        tuple(p.bucket_counts),
                        tuple(p.explicit_bounds),
                        p.min,
                        p.max,
                    )
    return out


#: Two rounds of calls: (server or client, attributes, duration ns, TTFT or input tokens, TPOT or
#: output tokens). Durations sit on bucket bounds (upper-inclusive), between them and past the
#: last one; one attribute set has calls in the first round only.
_A = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "a"}
_B = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "b"}
_FAILED = {"error.type": "TimeoutError", "gen_ai.operation.name": "chat"}
_CLIENT = {"gen_ai.operation.name": "chat", "server.port": 80}
_ROUNDS = [
    [
        ("server", _A, 10**7, 10**6, 10**7),
        ("server", _A, 0, 5 * 10**6, None),
        ("server", _B, 10**11, None, None),
        ("client", _CLIENT, 2 * 10**7, 4, 1024),
        ("client", _CLIENT, 3 * 10**7, None, None),
    ],
    [
        ("server", _A, 16 * 10**7, 2 * 10**9, 3 * 10**8),
        ("server", _FAILED, 7 * 10**9, None, None),
        ("client", _CLIENT, 81_920_000_001, 0, 2),
    ],
]


@pytest.mark.parametrize("temporality", ["CUMULATIVE", "DELTA"])
def test_histograms_equal_what_opentelemetrys_metrics_sdk_makes_of_the_same_calls(
    temporality: str,
) -> None:
    """The SDK aggregates its histograms itself; OpenTelemetry's MeterProvider, given the same
    values, attributes and the conventions' bucket advice as Views, must agree point for point,
    with cumulative temporality and with the delta an exporter asks for."""
    from opentelemetry.sdk.metrics import Histogram as HistogramInstrument
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
    from opentelemetry.sdk.resources import Resource

    from latscope.sdk._metrics import GenAIMetrics as Aggregator

    preferred = {HistogramInstrument: getattr(AggregationTemporality, temporality)}
    specs = (
        GenAIMetrics.SERVER_REQUEST_DURATION,
        GenAIMetrics.SERVER_TIME_TO_FIRST_TOKEN,
        GenAIMetrics.SERVER_TIME_PER_OUTPUT_TOKEN,
        GenAIMetrics.CLIENT_OPERATION_DURATION,
        GenAIMetrics.CLIENT_TOKEN_USAGE,
    )
    reader = InMemoryMetricReader(preferred_temporality=preferred)
    provider = MeterProvider(
        metric_readers=[reader],
        views=[
            View(instrument_name=n, aggregation=ExplicitBucketHistogramAggregation(list(b)))
            for n, _, b in specs
        ],
    )
    meter = provider.get_meter("latscope.sdk")
    h = {n: meter.create_histogram(n, unit=u) for n, u, _ in specs}
    exporter = NullMetricExporter(preferred_temporality=preferred)
    ours = Aggregator(exporter, Resource.create({}), 3600)
    expected: dict[tuple, tuple] = {}
    try:
        for calls in _ROUNDS:
            for side, attrs, duration, a, b in calls:
                if side == "server":
                    ours.server(attrs, duration, a, b)
                    h["gen_ai.server.request.duration"].record(duration / 1e9, attrs)
                    if a is not None:
                        h["gen_ai.server.time_to_first_token"].record(a / 1e9, attrs)
                    if b is not None:
                        h["gen_ai.server.time_per_output_token"].record(b / 1e9, attrs)
                else:
                    ours.client(attrs, duration, a, b)
                    h["gen_ai.client.operation.duration"].record(duration / 1e9, attrs)
                    for kind, tokens in (("input", a), ("output", b)):
                        if tokens is not None:
                            labelled = {**attrs, "gen_ai.token.type": kind}
                            h["gen_ai.client.token.usage"].record(tokens, labelled)
            got = _flat(reader.get_metrics_data())
            assert len(got) >= 4
            # Cumulative points stay while nothing new comes in; older OpenTelemetry SDKs (1.18)
            # left a histogram with no new measurement out (opentelemetry-python#3277, #3407).
            expected = {**expected, **got} if temporality == "CUMULATIVE" else got
            assert _flat(ours.collect()) == expected
    finally:
        ours.shutdown(1)
        provider.shutdown()


def test_attribute_sets_past_the_limit_are_counted_as_overflow(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from opentelemetry.sdk.resources import Resource

    from latscope.sdk import _metrics

    monkeypatch.setattr(_metrics, "MAX_SERIES", 3)
    ours = _metrics.GenAIMetrics(NullMetricExporter(), Resource.create({}), 3600)
    try:
        for model in "abcdef":
            ours.server({"gen_ai.request.model": model}, 10**6, None, None)
        points = _flat(ours.collect())
    finally:
        ours.shutdown(1)
    counts = {dict(k[3]).get("gen_ai.request.model", "overflow"): v[1] for k, v in points.items()}
    # Three points at most: two sets, then the OpenTelemetry spec's overflow set; nothing lost.
    assert counts == {"a": 1, "b": 1, "overflow": 4}
    (overflow,) = [k for k in points if ("otel.metric.overflow", True) in k[3]]
    assert dict(overflow[3]) == {"otel.metric.overflow": True}
    assert sum("otel.metric.overflow" in r.getMessage() for r in caplog.records) == 1
