"""An OpenAI-compatible model server, traced as a team would trace one: FastAPI + uvicorn with
``opentelemetry-instrumentation-fastapi`` (whichever version the interpreter running it has: the
test runs it under the current release and under 0.41b0, whose server span includes Starlette's
background tasks), exporting OTLP/gRPC. It imports nothing from latscope, so it runs in a
virtual environment of its own.

Each request says what to do in headers: ``x-case`` (a name for the truth), ``x-fail-first`` (the
first attempt of a case answers 500 with ``retry-after-ms``, as a busy server would), ``x-api-ms``
(the API server's own work before the engine: templating, tokenizing), ``x-engine``
(``none``; ``vllm``: an ``llm_request`` SERVER span with ``gen_ai.latency.*`` inside the API
server's span, as vLLM writes it; ``sglang``: SGLang's request root and stage slices;
``sglang-pd``: a prefill worker's and a decode worker's roots with the KV-cache transfer between
them), ``x-stage-ms``
(``queue,prefill,decode`` for the engine, or the plain handler's sleep), ``x-tokens`` (output
tokens, streamed evenly over decode), ``x-after-ms`` (work after the response, as a background
task), ``x-close-ms`` (a stream's closing message that long after its ``[DONE]`` event, as a
blocked event loop sends it: the openai client has closed the stream by then). SGLang's routes
(under ``/sglang``) are not traced by the framework: SGLang's roots take the caller's
``traceparent`` themselves. ``POST /search`` is a plain HTTP service (retrieval).

For every response the server appends one JSON line to ``--truth``: the case, the attempt, when
the request arrived and when the last byte of its response was handed to the server (ns, its
clock), and the stages it slept through.

    python model_server.py --otlp 127.0.0.1:4317 --truth truth.jsonl --port-file port
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import BackgroundTasks, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from opentelemetry import propagate, trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

MODEL = "fake-llama"
PROMPT_TOKENS = 11
#: The request's arrival (ns) and what the handler records of it, per request.
ARRIVAL: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("arrival")
ATTEMPTS: dict[str, int] = {}
_LOCK = threading.Lock()


def ms(value: str | None, default: float = 0.0) -> float:
    return float(value) if value else default


def _sleep(seconds: float) -> Any:
    return asyncio.sleep(seconds)


class Truth:
    """Measures each request when it reaches the app and when the last byte of its response
    leaves it, twice: outside the instrumentation's middleware (``outer``, which writes the
    record) and just inside it (``inner``): the server span lies between the two."""

    def __init__(self, app: Any, path: Path | None = None) -> None:
        self.app, self.path = app, path

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        outer = self.path is not None
        if outer:
            record: dict[str, Any] = {"path": scope["path"]}
            ARRIVAL.set(record)
        else:
            record = ARRIVAL.get()
        record["outer_arrival_ns" if outer else "inner_arrival_ns"] = time.time_ns()

        async def timed_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                record["status"] = message["status"]
            last = message["type"] == "http.response.body" and not message.get("more_body")
            if last and not outer:
                # As the response's last bytes leave the app (a busy loop may resume this
                # coroutine late after the send).
                record["inner_end_ns"] = time.time_ns()
            await send(message)
            if last and outer:
                record["outer_end_ns"] = time.time_ns()
                if "case" in record:
                    # Written once this coroutine yields: the instrumentation's own send span
                    # (which this send runs inside) has ended by then, so the write's time
                    # never lands between the server span's end and ``outer_end_ns``.
                    asyncio.get_running_loop().call_soon(self._write, record)

        await self.app(scope, receive, timed_send)

    def _write(self, record: dict[str, Any]) -> None:
        with _LOCK, self.path.open("a") as out:  # type: ignore[union-attr]
            out.write(json.dumps(record) + "\n")


def providers(endpoint: str, service: str) -> dict[str, TracerProvider]:
    out = {}
    for name in (service, "sglang", "sglang-prefill", "sglang-decode"):
        provider = TracerProvider(resource=Resource.create({"service.name": name}))
        exporter = OTLPSpanExporter(endpoint=endpoint, insecure=True)
        provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=200))
        out[name] = provider
    return out


def chunk(i: int, content: str) -> str:
    delta = {"role": "assistant", "content": content} if i == 0 else {"content": content}
    body = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
    }
    return "data: " + json.dumps(body) + "\n\n"


def last_chunks(tokens: int) -> list[str]:
    done = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": MODEL,
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": tokens,
            "total_tokens": PROMPT_TOKENS + tokens,
        },
    }
    return ["data: " + json.dumps(done) + "\n\n", "data: [DONE]\n\n"]


def completion(tokens: int) -> dict:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "t" * tokens},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": tokens,
            "total_tokens": PROMPT_TOKENS + tokens,
        },
    }


def build(truth: Path, tracers: dict[str, TracerProvider], service: str) -> Any:
    app = FastAPI()
    app.add_middleware(Truth)
    engine_tracer = tracers[service].get_tracer("vllm.llm_engine")

    @app.post("/flush")
    async def flush() -> dict:
        for provider in tracers.values():
            provider.force_flush()
        return {"flushed": True}

    @app.post("/search")
    async def search(request: Request) -> dict:
        await _sleep(ms(request.headers.get("x-stage-ms"), 15) / 1e3)
        ARRIVAL.get()["case"] = request.headers.get("x-case", "search")
        return {"hits": ["doc-1", "doc-2"]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request, background: BackgroundTasks) -> Response:
        body = await request.json()
        h = request.headers
        record = ARRIVAL.get()
        case = record["case"] = h.get("x-case", "unnamed")
        with _LOCK:
            attempt = ATTEMPTS[case] = ATTEMPTS.get(case, 0) + 1
        record["attempt"] = attempt
        after = ms(h.get("x-after-ms")) / 1e3
        if after:

            async def work_after_the_response() -> None:
                await _sleep(after)

            background.add_task(work_after_the_response)
        if h.get("x-fail-first") and attempt == 1:
            await _sleep(ms(h.get("x-api-ms"), 2) / 1e3)
            return JSONResponse(
                {"error": {"message": "busy", "type": "server_error"}},
                status_code=500,
                headers={"retry-after-ms": "40"},
                background=background,
            )
        tokens = int(h.get("x-tokens", "6"))
        stages = [ms(v) / 1e3 for v in h.get("x-stage-ms", "0,0,30").split(",")]
        queue, prefill, decode = stages
        engine = h.get("x-engine", "none")
        await _sleep(ms(h.get("x-api-ms")) / 1e3)  # the API server's own work
        parent = trace.set_span_in_context(trace.get_current_span())
        stream = bool(body.get("stream"))

        async def generate() -> AsyncIterator[tuple[int, str]]:
            """The engine: queue, prefill (the first token), decode (the rest)."""
            span = None
            start = time.time_ns()
            if engine == "vllm":
                span = engine_tracer.start_span(
                    "llm_request", kind=trace.SpanKind.SERVER, context=parent, start_time=start
                )
            await _sleep(queue)
            scheduled = time.time_ns()
            await _sleep(prefill)
            first = time.time_ns()
            yield 0, "t"
            for i in range(1, tokens):
                await _sleep(decode / max(1, tokens - 1))
                yield i, "t"
            last = time.time_ns()
            record["stages"] = {
                "queue": scheduled - start,
                "prefill": first - scheduled,
                "decode": last - first,
                "engine_start_ns": start,
                "first_token_ns": first,
            }
            if span is not None:
                s = 1e9
                span.set_attributes(
                    {
                        "gen_ai.latency.time_in_queue": (scheduled - start) / s,
                        "gen_ai.latency.time_to_first_token": (first - start) / s,
                        "gen_ai.latency.time_in_model_prefill": (first - scheduled) / s,
                        "gen_ai.latency.time_in_model_decode": (last - first) / s,
                        "gen_ai.latency.time_in_model_inference": (last - scheduled) / s,
                        "gen_ai.latency.e2e": (time.time_ns() - start) / s,
                        "gen_ai.usage.prompt_tokens": PROMPT_TOKENS,
                        "gen_ai.usage.completion_tokens": tokens,
                        "gen_ai.request.id": case,
                    }
                )
                span.end()

        if stream:

            async def sse() -> AsyncIterator[str]:
                async for i, text in generate():
                    yield chunk(i, text)
                for line in last_chunks(tokens):
                    yield line
                if h.get("x-close-ms"):
                    # The event loop busy elsewhere (blocked, so Starlette does not see the
                    # client's disconnect and cancel the stream first): the closing message
                    # goes out late.
                    time.sleep(ms(h.get("x-close-ms")) / 1e3)

            return StreamingResponse(sse(), media_type="text/event-stream", background=background)
        async for _ in generate():
            pass
        return JSONResponse(completion(tokens), background=background)

    @app.post("/sglang/v1/chat/completions")
    async def sglang(request: Request) -> Response:
        return await _sglang(request, tracers)

    FastAPIInstrumentor.instrument_app(
        app, tracer_provider=tracers[service], excluded_urls="sglang,flush"
    )
    return Truth(app, truth)


class _Slices:
    """SGLang's spans of one worker (python/sglang/srt/observability/trace.py): a root
    ``f"{role} Req {rid[:8]}"`` with no kind, a thread span per process, stage slices under
    them, each top-level slice linked to the one before."""

    def __init__(self, tracer: Any, role: str, parent: Any, start: int) -> None:
        name = f"{role} Req 8d1f0c5e" if role else " Req 8d1f0c5e"
        self.tracer = tracer
        self.root = tracer.start_span(
            name, context=parent, start_time=start, attributes={"rid": "8d1f0c5e2b7a"}
        )
        ctx = trace.set_span_in_context(self.root)
        self.tokenizer = tracer.start_span(
            "Tokenizer(host:3f2a9c1d | pid:4100)", context=ctx, start_time=start
        )
        self.scheduler: Any = None
        self.ctx = ctx

    def slice(self, thread: Any, name: str, t0: int, t1: int) -> None:
        span = self.tracer.start_span(
            name, context=trace.set_span_in_context(thread), start_time=t0
        )
        span.end(end_time=t1)

    def schedule(self, at: int) -> Any:
        self.scheduler = self.tracer.start_span(
            "Scheduler [TP 0] (host:3f2a9c1d | pid:4101)", context=self.ctx, start_time=at
        )
        return self.scheduler


async def _sglang(request: Request, tracers: dict[str, TracerProvider]) -> Response:
    """SGLang's request tracing, unified or disaggregated (``x-engine: sglang-pd``): every
    stage slept through, the spans written with the times measured."""
    body = await request.json()
    h = request.headers
    record = ARRIVAL.get()
    record["case"] = h.get("x-case", "sglang")
    record["attempt"] = 1
    parent = propagate.extract(dict(h))
    arrival = record["inner_arrival_ns"]
    tokens = int(h.get("x-tokens", "6"))
    queue, prefill, decode = (ms(v) / 1e3 for v in h.get("x-stage-ms", "10,30,60").split(","))
    kv = ms(h.get("x-kv-ms"), 25) / 1e3
    split = h.get("x-engine") == "sglang-pd"
    tracer = tracers["sglang"].get_tracer("sglang server")
    workers = (
        {
            "prefill": _Slices(
                tracers["sglang-prefill"].get_tracer("sglang server"), "prefill", parent, arrival
            ),
            "decode": _Slices(
                tracers["sglang-decode"].get_tracer("sglang server"), "decode", parent, arrival
            ),
        }
        if split
        else {"": _Slices(tracer, "", parent, arrival)}
    )
    marks: dict[str, int] = {"arrival": arrival}
    await _sleep(0.004)  # tokenize
    marks["tokenized"] = time.time_ns()
    for w in workers.values():
        w.slice(w.tokenizer, "tokenize", arrival, marks["tokenized"])
        w.tokenizer.end(end_time=marks["tokenized"])
        w.schedule(marks["tokenized"])
    if split:
        await _sleep(0.003)  # both workers' bootstrap: a KV slot on the decode worker
        marks["bootstrapped"] = time.time_ns()
        p, d = workers["prefill"], workers["decode"]
        p.slice(p.scheduler, "prefill_bootstrap", marks["tokenized"], marks["bootstrapped"])
        d.slice(d.scheduler, "decode_bootstrap", marks["tokenized"], marks["bootstrapped"])
    else:
        marks["bootstrapped"] = marks["tokenized"]
    prefill_side = workers.get("prefill") or workers[""]
    decode_side = workers.get("decode") or workers[""]
    await _sleep(queue)
    marks["scheduled"] = time.time_ns()
    prefill_side.slice(
        prefill_side.scheduler, "prefill_waiting", marks["bootstrapped"], marks["scheduled"]
    )
    await _sleep(prefill)
    marks["prefilled"] = time.time_ns()
    prefill_side.slice(
        prefill_side.scheduler, "prefill_forward", marks["scheduled"], marks["prefilled"]
    )
    decode_from = marks["prefilled"]
    if split:
        await _sleep(kv)
        marks["transferred"] = time.time_ns()
        p, d = workers["prefill"], workers["decode"]
        p.slice(p.scheduler, "prefill_transfer_kv_cache", marks["prefilled"], marks["transferred"])
        d.slice(d.scheduler, "decode_transferred", marks["bootstrapped"], marks["transferred"])
        await _sleep(0.002)  # the decode worker's queue
        marks["decode_scheduled"] = time.time_ns()
        d.slice(d.scheduler, "decode_waiting", marks["transferred"], marks["decode_scheduled"])
        decode_from = marks["decode_scheduled"]
    record["marks"] = marks
    stream = bool(body.get("stream"))
    s = 1e9

    async def generate() -> AsyncIterator[str]:
        first = time.time_ns()
        marks["first_token"] = first
        yield chunk(0, "t")
        for i in range(1, tokens):
            await _sleep(decode / max(1, tokens - 1))
            yield chunk(i, "t")
        done = time.time_ns()
        marks["decoded"] = done
        decode_side.slice(decode_side.scheduler, "decode_forward", decode_from, done)
        for line in last_chunks(tokens):
            yield line
        finished = time.time_ns()
        for role, w in workers.items():
            end = marks["transferred"] if role == "prefill" else finished
            w.scheduler.end(end_time=end)
            first_token = marks["prefilled"] if role == "prefill" else first
            w.root.set_attributes(
                {
                    "gen_ai.latency.time_to_first_token": (first_token - arrival) / s,
                    "gen_ai.latency.e2e": (end - arrival) / s,
                    "gen_ai.latency.time_in_model_decode": (end - first_token) / s,
                    "gen_ai.latency.time_in_model_prefill": (first_token - marks["tokenized"]) / s,
                    "gen_ai.usage.prompt_tokens": PROMPT_TOKENS,
                    "gen_ai.usage.completion_tokens": 1 if role == "prefill" else tokens,
                    "gen_ai.response.model": MODEL,
                }
            )
            w.root.end(end_time=end)

    if stream:
        return StreamingResponse(generate(), media_type="text/event-stream")
    async for _ in generate():
        pass
    return JSONResponse(completion(tokens))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--otlp", required=True)
    parser.add_argument("--truth", type=Path, required=True)
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--service", default="fake-vllm")
    args = parser.parse_args()
    tracers = providers(args.otlp, args.service)
    app = build(args.truth, tracers, args.service)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))

    def announce() -> None:
        while not server.started:
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        args.port_file.write_text(str(port))

    threading.Thread(target=announce, daemon=True).start()
    try:
        server.run()
    finally:
        for provider in tracers.values():
            provider.shutdown()


if __name__ == "__main__":
    main()
