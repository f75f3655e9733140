"""Server side of the SDK against an in-memory exporter: spans, phases, tokens, streams."""

from __future__ import annotations

import asyncio
import itertools
import threading

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

from latscope import sdk
from latscope.semconv import GenAIAttributes, LatscopeAttributes, Phase, ServerAttributes
from tests.sdk_support import capture

MS = 1_000_000


class StepClock:
    """A clock that moves 1 ms per reading: every SDK timestamp is predictable."""

    def __init__(self, start: int = 1_700_000_000_000_000_000) -> None:
        self._it = itertools.count(start, MS)
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            return next(self._it)


def _check_request(cap, tokens: int, name: str = "chat llama") -> None:
    server = cap.one(name)
    assert server.kind is SpanKind.SERVER
    phases = cap.phases()
    assert set(phases) == {Phase.PREFILL, Phase.DECODE}
    for p in phases.values():
        assert p.parent.span_id == server.context.span_id
        assert p.context.trace_id == server.context.trace_id
    decode = phases[Phase.DECODE]
    offsets = decode.attributes[LatscopeAttributes.TOKEN_OFFSETS_US]
    assert len(offsets) == tokens == decode.attributes[LatscopeAttributes.TOKEN_COUNT]
    assert list(offsets) == sorted(offsets)
    assert server.attributes[GenAIAttributes.USAGE_OUTPUT_TOKENS] == tokens
    assert server.attributes[GenAIAttributes.REQUEST_MODEL] == "llama"
    assert server.attributes[GenAIAttributes.OPERATION_NAME] == "chat"


def test_sync_handler_with_phases_and_tokens() -> None:
    clock = StepClock()
    with capture(clock=clock) as cap:

        @sdk.inference(model="llama")
        def handle(n: int) -> str:
            with sdk.phase("prefill"):
                pass
            with sdk.phase("decode"):
                for _ in range(n):
                    sdk.record_token()
            sdk.set_usage(input_tokens=7)
            return "done"

        assert handle(5) == "done"
        _check_request(cap, 5)
        server = cap.one("chat llama")
        decode = cap.phases()["decode"]
        # The step clock: decode starts at t, tokens at t+1ms .. t+5ms.
        assert list(decode.attributes[LatscopeAttributes.TOKEN_OFFSETS_US]) == [
            1000,
            2000,
            3000,
            4000,
            5000,
        ]
        first = server.attributes[LatscopeAttributes.FIRST_TOKEN_NS]
        assert first == decode.start_time + MS
        assert server.attributes[ServerAttributes.TTFT_NS] == first - server.start_time
        assert server.attributes[ServerAttributes.TPOT_NS] == MS
        assert server.attributes[GenAIAttributes.USAGE_INPUT_TOKENS] == 7


def test_async_handler_bare_decorator_keeps_signature() -> None:
    with capture() as cap:

        @sdk.inference
        async def answer(prompt: str, *, temperature: float = 0.0) -> str:
            """Doc kept."""
            with sdk.phase("prefill"):
                await asyncio.sleep(0)
            return prompt.upper()

        assert answer.__doc__ == "Doc kept."
        assert answer.__name__ == "answer"
        assert asyncio.run(answer("hi", temperature=1.0)) == "HI"
        server = cap.one("chat answer")
        assert server.kind is SpanKind.SERVER
        assert cap.phases()["prefill"].parent.span_id == server.context.span_id


def test_generator_handler_ends_span_when_exhausted() -> None:
    with capture() as cap:

        @sdk.inference(model="llama")
        def stream(n: int):
            with sdk.phase("prefill"):
                pass
            with sdk.phase("decode"):
                yield from sdk.traced_tokens(f"t{i}" for i in range(n))

        gen = stream(4)
        assert next(gen) == "t0"
        assert cap.named("chat llama") == []  # still streaming
        assert list(gen) == ["t1", "t2", "t3"]
        _check_request(cap, 4)
        assert LatscopeAttributes.STREAM_END not in cap.one("chat llama").attributes


def test_generator_steps_from_other_threads() -> None:
    """Frameworks step sync generators from a thread pool, each step in a fresh context."""
    import concurrent.futures
    import contextvars

    with capture() as cap:

        @sdk.inference(model="llama")
        def stream():
            with sdk.phase("prefill"):
                yield "a"
            with sdk.phase("decode"):
                for t in ("b", "c"):
                    sdk.record_token()
                    yield t

        gen = stream()
        out = []
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            while True:
                ctx = contextvars.copy_context()
                item = pool.submit(ctx.run, next, gen, None).result()
                if item is None:
                    break
                out.append(item)
        assert out == ["a", "b", "c"]
        _check_request(cap, 2)


def test_async_generator_closed_early_is_a_client_disconnect() -> None:
    with capture() as cap:

        @sdk.inference(model="llama")
        async def stream():
            with sdk.phase("prefill"):
                pass
            with sdk.phase("decode"):
                for i in range(100):
                    sdk.record_token()
                    yield i

        async def consume() -> list[int]:
            got = []
            agen = stream()
            async for i in agen:
                got.append(i)
                if i == 2:
                    break
            await agen.aclose()
            return got

        assert asyncio.run(consume()) == [0, 1, 2]
        server = cap.one("chat llama")
        assert server.attributes[LatscopeAttributes.STREAM_END] == "client_disconnect"
        assert server.status.status_code is not StatusCode.ERROR
        assert cap.phases()["decode"].attributes[LatscopeAttributes.TOKEN_COUNT] == 3


def test_sync_generator_closed_early_is_a_client_disconnect() -> None:
    with capture() as cap:

        @sdk.inference(model="llama")
        def stream():
            yield from range(10)

        gen = stream()
        next(gen)
        gen.close()
        assert cap.one("chat llama").attributes[LatscopeAttributes.STREAM_END] == (
            "client_disconnect"
        )


def test_cancellation_is_recorded() -> None:
    with capture() as cap:

        @sdk.inference(model="llama")
        async def slow() -> None:
            with sdk.phase("queue"):
                await asyncio.sleep(30)

        async def main() -> None:
            task = asyncio.create_task(slow())
            await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(main())
        server = cap.one("chat llama")
        assert server.attributes[LatscopeAttributes.STREAM_END] == "cancelled"
        assert cap.phases()["queue"].end_time is not None


def test_app_exception_propagates_and_marks_error() -> None:
    with capture() as cap:

        @sdk.inference(model="llama")
        def broken() -> None:
            with sdk.phase("preprocess"):
                raise KeyError("bad prompt")

        with pytest.raises(KeyError, match="bad prompt"):
            broken()
        assert cap.one("chat llama").status.status_code is StatusCode.ERROR
        assert cap.phases()["preprocess"].status.status_code is StatusCode.ERROR


def test_phase_as_decorator_for_each_function_kind() -> None:
    with capture() as cap:

        @sdk.phase("preprocess")
        def tokenize(text: str) -> list[str]:
            return text.split()

        @sdk.phase("prefill")
        async def prefill() -> int:
            return 1

        @sdk.phase("decode")
        def decode(n: int):
            for i in range(n):
                sdk.record_token()
                yield i

        @sdk.phase("postprocess")
        async def detok(items):
            for i in items:
                yield str(i)

        @sdk.inference(model="llama")
        async def handle() -> list[str]:
            words = tokenize("a b c")
            await prefill()
            toks = list(decode(len(words)))
            return [s async for s in detok(toks)]

        assert asyncio.run(handle()) == ["0", "1", "2"]
        assert set(cap.phases()) == set(Phase.ALL) - {Phase.QUEUE}
        assert cap.phases()["decode"].attributes[LatscopeAttributes.TOKEN_COUNT] == 3


def test_token_buffer_is_capped_and_counts_the_rest() -> None:
    with capture(max_tokens_per_span=16) as cap:

        @sdk.inference(model="llama")
        def handle() -> None:
            with sdk.phase("decode"):
                for _ in range(1000):
                    sdk.record_token()

        handle()
        decode = cap.phases()["decode"]
        assert len(decode.attributes[LatscopeAttributes.TOKEN_OFFSETS_US]) == 16
        assert decode.attributes[LatscopeAttributes.TOKEN_COUNT] == 1000
        assert decode.attributes[ServerAttributes.TOKENS_NOT_TIMED] == 984
        assert cap.one("chat llama").attributes[GenAIAttributes.USAGE_OUTPUT_TOKENS] == 1000


def test_concurrent_requests_keep_their_own_tokens() -> None:
    with capture() as cap:

        @sdk.inference(model="llama")
        async def handle(n: int) -> int:
            with sdk.phase("decode"):
                for _ in range(n):
                    sdk.record_token()
                    await asyncio.sleep(0)
            return n

        async def main() -> list[int]:
            return await asyncio.gather(*(handle(n) for n in (3, 5, 8)))

        assert asyncio.run(main()) == [3, 5, 8]
        counts = sorted(
            s.attributes[LatscopeAttributes.TOKEN_COUNT] for s in cap.named(Phase.DECODE)
        )
        assert counts == [3, 5, 8]
        for s in cap.named("chat llama"):
            decode = next(
                d for d in cap.named(Phase.DECODE) if d.parent.span_id == s.context.span_id
            )
            assert (
                s.attributes[GenAIAttributes.USAGE_OUTPUT_TOKENS]
                == decode.attributes[LatscopeAttributes.TOKEN_COUNT]
            )


def test_traceparent_makes_server_span_a_child() -> None:
    trace_id, parent_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    with capture() as cap:

        @sdk.inference(model="llama")
        def handle() -> None:
            pass

        ctx = sdk.extract_context({"TraceParent": f"00-{trace_id}-{parent_id}-01"})
        from opentelemetry import context as otel_context

        token = otel_context.attach(ctx)
        try:
            handle()
        finally:
            otel_context.detach(token)
        server = cap.one("chat llama")
        assert format(server.context.trace_id, "032x") == trace_id
        assert format(server.parent.span_id, "016x") == parent_id
        assert server.parent.is_remote


def test_bad_traceparent_is_ignored() -> None:
    with capture() as cap:

        @sdk.inference(model="llama")
        def handle() -> None:
            pass

        ctx = sdk.extract_context([(b"traceparent", b"garbage")])
        assert trace.get_current_span(ctx).get_span_context().is_valid is False
        handle()
        assert cap.one("chat llama").parent is None


def test_unconfigured_and_disabled_sdk_is_a_passthrough(monkeypatch) -> None:
    @sdk.inference(model="llama")
    def handle(x: int) -> int:
        with sdk.phase("decode"):
            sdk.record_token()
        sdk.set_usage(input_tokens=1)
        return x * 2

    assert handle(2) == 4  # never configured
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    with capture() as cap:
        assert handle(3) == 6
        assert cap.spans() == []


def test_middleware_starts_the_server_span_at_arrival() -> None:
    """The ASGI middleware stamps the arrival; the first handler's span starts there."""
    clock = StepClock()
    with capture(clock=clock) as cap:

        @sdk.inference(model="llama")
        async def first() -> None:
            pass

        @sdk.inference(model="other")
        async def second() -> None:
            pass

        async def app(scope, receive, send) -> None:
            await first()
            await second()

        middleware = sdk.TraceparentMiddleware(app)
        scope = {
            "type": "http",
            "headers": [(b"traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01")],
        }
        asyncio.run(middleware(scope, None, None))
        one, two = cap.one("chat llama"), cap.one("chat other")
        # Readings: arrival (t0), first's end (t0+1ms), second's start (t0+2ms), its end.
        assert two.start_time - one.start_time == 2 * MS
        assert one.end_time - one.start_time == MS
        assert format(one.context.trace_id, "032x") == "1" * 32
        assert format(two.parent.span_id, "016x") == "2" * 16
