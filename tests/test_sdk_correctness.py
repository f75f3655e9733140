"""Span lifecycle under faults and unusual handlers: every span the SDK starts is ended.

A fault inside the SDK never leaves a span open; a sync handler returning a streaming response
lasts until its body is sent; a callable object with ``async def __call__`` is async; a callable
without ``__name__`` says what to write; one ``phase`` object entered by concurrent tasks ends
each entry's span.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import time

import httpx
import pytest
from opentelemetry.trace import StatusCode

from latscope import sdk
from latscope.semconv import GenAIAttributes, LatscopeAttributes, Phase
from tests.sdk_support import NullMetricExporter, capture, run_app


def _boom(*args: object, **kwargs: object) -> None:
    raise RuntimeError("bug inside the SDK")


@sdk.inference(model="llama")
def handle(n: int) -> int:
    with sdk.phase("prefill"):
        pass
    with sdk.phase("decode"):
        for _ in range(n):
            sdk.record_token()
    return n


@pytest.mark.parametrize(
    "target",
    [
        "latscope.sdk._server._flush_tokens",
        "latscope.sdk._server._mark_error",
        "latscope.sdk._server._record_metrics",
        "latscope.sdk._otel.set_trusted",
    ],
)
def test_a_fault_at_any_exit_step_still_ends_every_span(
    monkeypatch: pytest.MonkeyPatch, target: str
) -> None:
    monkeypatch.setattr(target, _boom)
    with capture(metrics=True, metric_exporter=NullMetricExporter()) as cap:
        assert handle(3) == 3
        with pytest.raises(ValueError, match="app error"), sdk.phase("postprocess"):
            raise ValueError("app error")
        names = sorted(s.name for s in cap.spans())
        assert names == ["chat llama", "decode", "postprocess", "prefill"]
        assert all(s.end_time is not None for s in cap.spans())
        assert sdk.stats()["internal_errors"]


def test_a_failing_clock_at_exit_ends_spans_on_opentelemetry_time() -> None:
    calls = iter(range(1_700_000_000_000_000_000, 1_700_000_000_000_000_000 + 10**9, 10**6))
    fail = threading.Event()

    def clock() -> int:
        if fail.is_set():
            raise OSError("clock gone")
        return next(calls)

    with capture(clock=clock) as cap:

        @sdk.inference(model="llama")
        def slow_exit() -> None:
            with sdk.phase("decode"):
                sdk.record_token()
                fail.set()

        slow_exit()
        assert sorted(s.name for s in cap.spans()) == ["chat llama", "decode"]
        assert sdk.stats()["internal_errors"]["clock"] >= 2


def test_span_end_failing_is_contained(monkeypatch: pytest.MonkeyPatch) -> None:
    with capture() as cap:
        from opentelemetry.sdk.trace import Span

        monkeypatch.setattr(Span, "end", _boom)
        assert handle(2) == 2
        assert sdk.stats()["internal_errors"]["span.end"] == 3
        assert cap.spans() == []


def test_sync_handler_returning_a_streaming_response_lasts_until_the_body_is_sent() -> None:
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    app = FastAPI()
    app.add_middleware(sdk.TraceparentMiddleware)
    sent: list[int] = []

    @app.get("/stream")
    @sdk.inference(model="toy")
    def stream() -> StreamingResponse:  # a sync endpoint: FastAPI runs it in a thread
        def body():
            with sdk.phase("decode"):
                for w in ("a", "b", "c"):
                    time.sleep(0.01)
                    sdk.record_token()
                    sent.append(time.time_ns())
                    yield f"data: {w}\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    with capture() as cap, run_app(app) as base, httpx.Client() as http:
        assert http.get(f"{base}/stream").text == "data: a\n\ndata: b\n\ndata: c\n\n"
        server = cap.wait_for("chat toy")
        decode = cap.phases()[Phase.DECODE]
        assert server.end_time >= sent[-1] >= decode.start_time
        assert decode.parent.span_id == server.context.span_id
        assert server.attributes[GenAIAttributes.USAGE_OUTPUT_TOKENS] == 3
        assert LatscopeAttributes.STREAM_END not in server.attributes


class _AsyncModel:
    """A callable object whose ``__call__`` is a coroutine function."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, prompt: str) -> str:
        await asyncio.sleep(0.02)
        self.calls += 1
        return prompt.upper()


def test_callable_object_with_async_call_is_traced_as_async() -> None:
    model = _AsyncModel()
    traced = sdk.inference(model="obj")(model)
    assert inspect.iscoroutinefunction(traced)
    with capture() as cap:
        assert asyncio.run(traced("hi")) == "HI"
        span = cap.one("chat obj")
        assert span.end_time - span.start_time >= 15_000_000  # ended after the await
        assert span.status.status_code is not StatusCode.ERROR
    assert model.calls == 1

    class AsyncStream:
        async def __call__(self, n: int):
            for i in range(n):
                yield i

    gen = sdk.inference(model="gen")(AsyncStream())
    assert inspect.isasyncgenfunction(gen)

    async def drain() -> list[int]:
        return [i async for i in gen(3)]

    with capture() as cap:
        assert asyncio.run(drain()) == [0, 1, 2]
        assert cap.one("chat gen").end_time is not None


def test_callable_without_a_name_says_what_to_write() -> None:
    async def generate(prompt: str, temperature: float) -> str:
        return prompt

    nameless = functools.partial(generate, temperature=0.0)
    with pytest.raises(ValueError, match=r"inference\(name='chat my-model'\)"):
        sdk.inference(nameless)
    with pytest.raises(ValueError, match="has no __name__"):
        sdk.inference(operation="chat")(nameless)
    # With a name or a model the span needs no __name__.
    for traced, span_name in (
        (sdk.inference(name="chat custom")(nameless), "chat custom"),
        (sdk.inference(model="m")(nameless), "chat m"),
    ):
        assert inspect.iscoroutinefunction(traced)
        with capture() as cap:
            assert asyncio.run(traced("x")) == "x"
            assert cap.one(span_name)


def test_one_phase_object_entered_by_concurrent_tasks_ends_both_spans() -> None:
    prefill = sdk.phase("prefill")  # one object, shared
    started = asyncio.Event

    @sdk.inference(model="shared")
    async def request(delay: float, gate: asyncio.Event, other: asyncio.Event) -> None:
        async with prefill:
            gate.set()
            await other.wait()  # both tasks are inside the same phase object at once
            await asyncio.sleep(delay)

    async def main() -> None:
        a, b = started(), started()
        await asyncio.gather(request(0.03, a, b), request(0.0, b, a))

    with capture() as cap:
        asyncio.run(main())
        servers = cap.named("chat shared")
        prefills = cap.named("prefill")
        assert len(servers) == 2 and len(prefills) == 2
        # Each prefill span belongs to its own request and ends with its own task.
        assert {p.parent.span_id for p in prefills} == {s.context.span_id for s in servers}
        by_parent = {p.parent.span_id: p for p in prefills}
        for server in servers:
            p = by_parent[server.context.span_id]
            assert server.start_time <= p.start_time <= p.end_time <= server.end_time
        slow, fast = sorted(prefills, key=lambda p: p.end_time - p.start_time, reverse=True)
        assert slow.end_time - slow.start_time >= 25_000_000 > fast.end_time - fast.start_time


def test_one_phase_object_entered_from_two_threads() -> None:
    decode = sdk.phase("decode")
    barrier = threading.Barrier(2)

    @sdk.inference(model="threads")
    def request(n: int) -> None:
        with decode:
            barrier.wait(5)
            for _ in range(n):
                sdk.record_token()
            barrier.wait(5)

    with capture() as cap:
        threads = [threading.Thread(target=request, args=(n,)) for n in (2, 5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        decodes = cap.named("decode")
        assert sorted(d.attributes[LatscopeAttributes.TOKEN_COUNT] for d in decodes) == [2, 5]
        servers = {s.context.span_id: s for s in cap.named("chat threads")}
        for d in decodes:  # the tokens went to the decode span of their own request
            server = servers[d.parent.span_id]
            count = d.attributes[LatscopeAttributes.TOKEN_COUNT]
            assert server.attributes[GenAIAttributes.USAGE_OUTPUT_TOKENS] == count
