"""A client app as a team writes one: the real ``openai`` client, traced by one of the GenAI
client instrumentations (``openai-v2`` = opentelemetry-instrumentation-openai-v2,
``openinference`` = openinference-instrumentation-openai, ``traceloop`` = traceloop's
opentelemetry-instrumentation-openai) with opentelemetry-instrumentation-httpx under it,
exporting OTLP/gRPC. It runs each case against the model servers and appends what it measured
itself to ``--truth``, one JSON line per call: the case, the trace id, e2e and the time to the
first content chunk (ns, around the ``create`` call and the stream's iteration), the tokens the
response counted, and how many calls the case's trace holds.

    python -m tests.upstream_apps.client_app openai-v2 --otlp 127.0.0.1:4317 \\
        --server http://127.0.0.1:8000 --old-server http://127.0.0.1:8001 --truth client.jsonl
"""

from __future__ import annotations

import argparse
import contextvars
import json
import multiprocessing
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2
import openai
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.httpx import HTTPX2ClientInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

MESSAGES = [{"role": "user", "content": "hi"}]
#: Calls of the short-calls case, made while every core is kept busy.
SHORT_CALLS = 12


#: The span events by which OpenInference and traceloop mark a stream's first chunk (traceloop
#: one per chunk: the earliest).
FIRST_CHUNK_EVENTS = ("First Token Stream Event", "gen_ai.content.completion.chunk")


class GenAIOperations(SpanProcessor):
    """Notes, per thread, the last GenAI operation span the instrumentation ended: the call's
    span as the instrumentation recorded it (its id names the call in latscope)."""

    def __init__(self) -> None:
        self.last: dict[int, ReadableSpan] = {}

    def on_end(self, span: ReadableSpan) -> None:
        attrs = span.attributes or {}
        if attrs.get("gen_ai.operation.name") == "chat" or (
            attrs.get("openinference.span.kind") == "LLM"
        ):
            self.last[threading.get_ident()] = span


PROXY_HOP_S = 0.012


def _proxy_hop(request: Any) -> None:
    time.sleep(PROXY_HOP_S)


def instrument(name: str, provider: TracerProvider) -> None:
    if name == "openai-v2":
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
    elif name == "openinference":
        from openinference.instrumentation.openai import OpenAIInstrumentor
    elif name == "traceloop":
        from opentelemetry.instrumentation.openai import OpenAIInstrumentor
    else:
        raise ValueError(f"unknown instrumentation {name!r}")
    OpenAIInstrumentor().instrument(tracer_provider=provider)


class App:
    def __init__(self, args: argparse.Namespace) -> None:
        self.provider = TracerProvider(resource=Resource.create({"service.name": "agent-app"}))
        self.operations = GenAIOperations()
        self.provider.add_span_processor(self.operations)
        self.provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=args.otlp, insecure=True))
        )
        instrument(args.instrumentation, self.provider)
        self.http = httpx2.Client(timeout=30)
        HTTPX2ClientInstrumentor.instrument_client(self.http, tracer_provider=self.provider)
        # Through a proxy hop: every request leaves PROXY_HOP_S late (the network's to latscope).
        self.proxied = httpx2.Client(timeout=30, event_hooks={"request": [_proxy_hop]})
        HTTPX2ClientInstrumentor.instrument_client(self.proxied, tracer_provider=self.provider)
        self.tracer = self.provider.get_tracer("agent-app")
        self.truth = args.truth
        self.prefix = args.instrumentation

    def client(self, base: str, http: httpx2.Client | None = None, **headers: str) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=base + "/v1",
            api_key="test",
            http_client=http or self.http,
            max_retries=2,
            default_headers=headers,
        )

    def record(self, **fields: Any) -> None:
        with self.truth.open("a") as out:
            out.write(json.dumps(fields) + "\n")

    def call(
        self, llm: openai.OpenAI, case: str, stream: bool, calls: int = 1, **more: Any
    ) -> dict:
        """One chat completion as the app makes it, timed around the call; ``more``: other
        figures the app measured, recorded with it."""
        trace_id = format(trace.get_current_span().get_span_context().trace_id, "032x")
        first = None
        start = time.time_ns()
        if stream:
            chunks = llm.chat.completions.create(
                model="fake-llama",
                messages=MESSAGES,
                stream=True,
                stream_options={"include_usage": True},
                extra_headers={"x-case": case},
            )
            usage = None
            for c in chunks:
                if first is None and c.choices and c.choices[0].delta.content:
                    first = time.time_ns()
                usage = c.usage or usage
        else:
            usage = llm.chat.completions.create(
                model="fake-llama", messages=MESSAGES, extra_headers={"x-case": case}
            ).usage
        end = time.time_ns()
        span = self.operations.last.pop(threading.get_ident())
        assert span.start_time is not None and span.end_time is not None
        fields = {
            "case": case,
            "trace_id": trace_id,
            # The call's span as the instrumentation recorded it: how latscope names the call,
            # and how long the instrumentation says it took.
            "span_id": format(span.context.span_id, "016x"),
            "span_e2e_ns": span.end_time - span.start_time,
            "span_start_ns": span.start_time,
            "start_ns": start,
            "e2e_ns": end - start,
            "ttft_ns": None if first is None else first - start,
            # When the instrumentation marked the first chunk, before handing it to the app.
            "first_chunk_mark_ns": min(
                (e.timestamp for e in span.events if e.name in FIRST_CHUNK_EVENTS), default=None
            ),
            "first_ns": first,
            "stream": stream,
            "input_tokens": usage.prompt_tokens if usage else None,
            "output_tokens": usage.completion_tokens if usage else None,
            "calls_in_trace": calls,
            **more,
        }
        self.record(**fields)
        return fields

    def one(self, llm: openai.OpenAI, case: str, stream: bool) -> None:
        # A root span per case: its trace holds this call alone.
        with self.tracer.start_as_current_span(f"case {case}"):
            self.call(llm, case, stream)

    def run(self, server: str, old_server: str) -> None:
        p = self.prefix
        # A process's first call pays for imports and first-use setup before the instrumentation
        # starts its span (OpenInference's first call here: 200 ms); the cases time warm calls.
        for base in (server, old_server):
            self.client(base).chat.completions.create(model="fake-llama", messages=MESSAGES)
        plain = self.client(server, **{"x-stage-ms": "0,0,30", "x-api-ms": "3"})
        self.one(plain, f"{p}/plain", stream=False)
        self.one(plain, f"{p}/stream", stream=True)
        # The closing message goes out after the client closed the stream, by less than the
        # network's time: moving the server's time to fit it would take network for server time.
        late = self.client(
            server, self.proxied, **{"x-stage-ms": "0,0,30", "x-api-ms": "3", "x-close-ms": "5"}
        )
        self.one(late, f"{p}/stream-late-close", stream=True)
        retry = self.client(server, **{"x-fail-first": "1", "x-stage-ms": "0,0,20"})
        self.one(retry, f"{p}/retry", stream=False)
        for base, label in ((server, "current"), (old_server, "0.41b0")):
            after = self.client(base, **{"x-stage-ms": "0,0,25", "x-after-ms": "150"})
            self.one(after, f"{p}/post-response@{label}", stream=False)
        vllm = self.client(
            server, **{"x-engine": "vllm", "x-api-ms": "12", "x-stage-ms": "15,25,50"}
        )
        self.one(vllm, f"{p}/vllm", stream=True)
        self.one(vllm, f"{p}/vllm-json", stream=False)
        sglang = self.client(server + "/sglang", **{"x-engine": "sglang"})
        self.one(sglang, f"{p}/sglang", stream=True)
        pd = self.client(server + "/sglang", **{"x-engine": "sglang-pd", "x-kv-ms": "30"})
        self.one(pd, f"{p}/sglang-pd", stream=True)
        self.agent(server, p)
        self.short_calls(server, p)

    def agent(self, server: str, p: str) -> None:
        """An agent: two model calls in parallel, a retrieval call, a tool call, a last call."""
        llm = self.client(server, **{"x-stage-ms": "0,10,30"})
        with self.tracer.start_as_current_span(
            "invoke_agent planner", attributes={"gen_ai.operation.name": "invoke_agent"}
        ):
            ctx = contextvars.copy_context
            with ThreadPoolExecutor(2) as pool:
                futures = [
                    pool.submit(ctx().run, self.call, llm, f"{p}/agent-parallel-{i}", i == 0, 3)
                    for i in range(2)
                ]
                for f in futures:
                    f.result()
            self.http.post(server + "/search", headers={"x-case": f"{p}/agent-search"}, json={})
            with self.tracer.start_as_current_span(
                "execute_tool lookup",
                attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup"},
            ) as tool:
                time.sleep(0.03)
            # The tool's time as its span recorded it (a loaded machine wakes the sleep late).
            tool_ns = tool.end_time - tool.start_time  # type: ignore[attr-defined]
            self.call(llm, f"{p}/agent-final", True, 3, tool_ns=tool_ns)

    def short_calls(self, server: str, p: str) -> None:
        """Short calls while every core is busy: the client library's own time grows."""
        llm = self.client(server, **{"x-stage-ms": "0,0,4", "x-tokens": "2"})
        stop = multiprocessing.Event()
        burners = [
            multiprocessing.Process(target=_burn, args=(stop,)) for _ in range(os.cpu_count() or 2)
        ]
        for b in burners:
            b.start()
        try:
            for i in range(SHORT_CALLS):
                self.one(llm, f"{p}/short-{i}", stream=i % 2 == 1)
        finally:
            stop.set()
            for b in burners:
                b.join(10)

    def close(self) -> None:
        self.http.close()
        self.provider.shutdown()


def _burn(stop: Any) -> None:
    deadline = time.monotonic() + 60  # bounded whatever happens to the app
    while not stop.is_set() and time.monotonic() < deadline:
        sum(range(10_000))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("instrumentation", choices=["openai-v2", "openinference", "traceloop"])
    parser.add_argument("--otlp", required=True)
    parser.add_argument("--server", required=True)
    parser.add_argument("--old-server", required=True)
    parser.add_argument("--truth", type=Path, required=True)
    args = parser.parse_args()
    app = App(args)
    try:
        app.run(args.server, args.old_server)
    finally:
        app.close()


if __name__ == "__main__":
    main()
