"""The builders against the real upstream instrumentation packages.

A real ``openai`` client streams a chat completion from a local HTTP server (SSE: the headers,
then the chunks once the client has them); the spans of opentelemetry-instrumentation-httpx,
-openai-v2 and openinference-instrumentation-openai are captured in memory and compared with what
``tests.upstream_traces`` builds for the same shape: names, kinds, nesting, attribute keys, and
which span ends when (the httpx span at the response headers, the others at the stream's end).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import httpx2
import openai
import pytest
from opentelemetry.instrumentation.httpx import HTTPX2ClientInstrumentor
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tests.upstream_traces import (
    CLIENT,
    INTERNAL,
    SCOPE_GENAI,
    SCOPE_HTTPX,
    SCOPE_OPENINFERENCE,
    Built,
    openai_v2_chat,
    openinference_chat,
)

MODEL = "m-test"
CHUNKS = 4
KIND = {SpanKind.CLIENT: CLIENT, SpanKind.INTERNAL: INTERNAL}


class _SSE(BaseHTTPRequestHandler):
    """An OpenAI-style streaming endpoint: headers at once, then (once ``gate`` is set) the
    chunks, then [DONE]; ``stamps`` gets when the first chunk and [DONE] went (time.time_ns)."""

    protocol_version = "HTTP/1.1"
    traceparents: ClassVar[list[str]] = []
    gate: ClassVar[threading.Event] = threading.Event()
    stamps: ClassVar[dict[str, int]] = {}

    def log_message(self, *args: object) -> None:
        pass

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.traceparents.append(self.headers.get("traceparent", ""))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": MODEL}
        self.gate.wait(60)
        self.stamps["first_chunk"] = time.time_ns()
        for i in range(CHUNKS):
            delta = {"role": "assistant", "content": f"t{i}"}
            choice = {"index": 0, "delta": delta, "finish_reason": None}
            self._chunk(b"data: " + json.dumps({**base, "choices": [choice]}).encode() + b"\n\n")
        last = {
            **base,
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": CHUNKS, "total_tokens": 5 + CHUNKS},
        }
        self._chunk(b"data: " + json.dumps(last).encode() + b"\n\n")
        self.stamps["done"] = time.time_ns()
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")


@pytest.fixture(scope="module")
def sse_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SSE)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@dataclass
class Captured:
    spans: list[ReadableSpan]
    #: when the call began, when the server sent its first chunk and its [DONE], and when the
    #: client had read the stream (time.time_ns)
    began_ns: int
    first_chunk_ns: int
    sent_done_ns: int
    read_ns: int

    def one(self, name: str) -> ReadableSpan:
        found = [s for s in self.spans if s.name == name]
        assert len(found) == 1, [s.name for s in self.spans]
        return found[0]


def _stream(base_url: str, provider: TracerProvider, exporter: InMemorySpanExporter) -> Captured:
    """One streamed chat completion through a real openai client whose httpx2 client is
    instrumented (the openai SDK 3.x sends with httpx2)."""
    http_client = httpx2.Client()
    HTTPX2ClientInstrumentor.instrument_client(http_client, tracer_provider=provider)
    client = openai.OpenAI(base_url=base_url, api_key="test", http_client=http_client)
    _SSE.gate.clear()
    try:
        began = time.time_ns()
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        _SSE.gate.set()  # the client has the headers: the chunks may come
        for _ in stream:
            pass
        read = time.time_ns()
    finally:
        _SSE.gate.set()
        client.close()
        http_client.close()
    spans = list(exporter.get_finished_spans())
    return Captured(spans, began, _SSE.stamps["first_chunk"], _SSE.stamps["done"], read)


def _provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _built_span(built: Built, name: str) -> Span:
    found = [s for s in built.spans if s.name == name]
    assert len(found) == 1, [s.name for s in built.spans]
    return found[0]


def _keys(span: Span) -> set[str]:
    return {kv.key for kv in span.attributes}


def _assert_headers_only(real: ReadableSpan, cap: Captured) -> None:
    """The httpx span ended at the response headers: before the server sent a chunk."""
    assert real.end_time is not None
    assert real.end_time < cap.first_chunk_ns, "httpx span outlived the headers"


def _assert_ends_at_stream_end(real: ReadableSpan, cap: Captured) -> None:
    """The span ended once the client had read the server's [DONE]."""
    assert real.end_time is not None
    assert cap.sent_done_ns <= real.end_time <= cap.read_ns, "ends at stream end"


def test_httpx_span_ends_at_the_headers_and_matches_the_builder(sse_url: str) -> None:
    provider, exporter = _provider()
    cap = _stream(sse_url, provider, exporter)
    real = cap.one("POST")
    assert real.kind is SpanKind.CLIENT
    assert real.instrumentation_scope.name == SCOPE_HTTPX[0]
    _assert_headers_only(real, cap)
    assert _SSE.traceparents[-1].split("-")[2] == format(real.context.span_id, "016x")
    built = _built_span(openai_v2_chat(1, server="vllm_v1"), "POST")
    assert built.kind == CLIENT
    assert _keys(built) == set(real.attributes)  # the default (old) HTTP semantic conventions
    server = next(s for s in openai_v2_chat(1).spans if s.name == "llm_request")
    # The builder's headers-only span is shorter than its server span, as a real one is.
    assert (built.end_time_unix_nano - built.start_time_unix_nano) < (
        server.end_time_unix_nano - server.start_time_unix_nano
    )


def test_openai_v2_chat_span_covers_the_stream_over_a_headers_only_httpx_span(
    sse_url: str,
) -> None:
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

    provider, exporter = _provider()
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        cap = _stream(sse_url, provider, exporter)
    finally:
        instrumentor.uninstrument()
    chat, post = cap.one(f"chat {MODEL}"), cap.one("POST")
    assert chat.kind is SpanKind.CLIENT and post.kind is SpanKind.CLIENT
    assert chat.instrumentation_scope.name == SCOPE_GENAI[0]
    assert post.parent is not None and post.parent.span_id == chat.context.span_id
    _assert_headers_only(post, cap)
    _assert_ends_at_stream_end(chat, cap)
    assert chat.attributes["gen_ai.provider.name"] == "openai"
    assert chat.attributes["gen_ai.usage.output_tokens"] == CHUNKS

    built = openai_v2_chat(2, server="vllm_v1")
    b_chat, b_post = _built_span(built, f"chat {built.truth.model}"), _built_span(built, "POST")
    assert (b_chat.kind, b_post.kind) == (CLIENT, CLIENT)
    assert b_post.parent_span_id == b_chat.span_id
    assert _keys(b_chat) == set(chat.attributes)
    assert _keys(b_post) == set(post.attributes)
    assert b_chat.end_time_unix_nano > b_post.end_time_unix_nano
    # The request's client is the GenAI operation the POST is a transport attempt of.
    assert built.truth.request_id.endswith(b_chat.span_id.hex())
    assert not built.truth.headers_only


def test_openinference_span_is_internal_llm_kind_with_a_first_token_event(sse_url: str) -> None:
    from openinference.instrumentation.openai import OpenAIInstrumentor

    provider, exporter = _provider()
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        cap = _stream(sse_url, provider, exporter)
    finally:
        instrumentor.uninstrument()
    llm, post = cap.one("ChatCompletion"), cap.one("POST")
    assert llm.kind is SpanKind.INTERNAL
    assert llm.instrumentation_scope.name == SCOPE_OPENINFERENCE[0]
    assert llm.attributes["openinference.span.kind"] == "LLM"
    assert [e.name for e in llm.events] == ["First Token Stream Event"]
    assert post.parent is not None and post.parent.span_id == llm.context.span_id
    _assert_headers_only(post, cap)
    _assert_ends_at_stream_end(llm, cap)

    built = openinference_chat(3, server="sglang")
    b_llm, b_post = _built_span(built, "ChatCompletion"), _built_span(built, "POST")
    assert (b_llm.kind, b_post.kind) == (INTERNAL, CLIENT)
    assert b_post.parent_span_id == b_llm.span_id
    assert [e.name for e in b_llm.events] == ["First Token Stream Event"]
    assert _keys(b_llm) == set(llm.attributes)
    assert _keys(b_post) == set(post.attributes)
    assert b_llm.end_time_unix_nano > b_post.end_time_unix_nano
