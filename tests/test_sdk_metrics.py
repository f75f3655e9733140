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
from tests.sdk_support import MetricsCollector, capture, metrics_collector, run_app

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
