"""Client side: the real ``openai`` client streaming from the example FastAPI server.

In-process tests assert span structure on an in-memory exporter; the end-to-end test runs the
example server as its own process exporting to a real ``latscope serve`` and reads the
attribution back over HTTP.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from opentelemetry.trace import SpanKind

from examples.client import chat, make_client
from examples.inference_server import create_app
from latscope import sdk
from latscope.semconv import (
    ClientAttributes,
    GenAIAttributes,
    HttpAttributes,
    LatscopeAttributes,
    Phase,
)
from tests.sdk_support import capture, run_app
from tests.serve_support import Server

PROMPT = "why is the sky blue today"
SERVER_SPAN = "chat toy-echo-1"
CLIENT_SPAN = "POST /v1/chat/completions"


def _assert_linked(cap, tokens: int) -> None:
    server = cap.wait_for(SERVER_SPAN)
    client = cap.one(CLIENT_SPAN)
    assert client.kind is SpanKind.CLIENT and server.kind is SpanKind.SERVER
    assert server.parent.span_id == client.context.span_id
    assert server.context.trace_id == client.context.trace_id
    phases = cap.phases()
    # One clock in this process: the server starts inside the client's interval, and decode ends
    # before the client has read the last chunk. The server span itself may end just after the
    # client's: a stream's last chunk reaches the client before the server's generator returns.
    assert client.start_time <= server.start_time <= phases[Phase.DECODE].end_time
    assert phases[Phase.DECODE].end_time <= client.end_time
    assert set(phases) == set(Phase.ALL)
    assert all(p.parent.span_id == server.context.span_id for p in phases.values())
    decode = phases[Phase.DECODE]
    assert decode.attributes[LatscopeAttributes.TOKEN_COUNT] == tokens
    assert len(decode.attributes[LatscopeAttributes.TOKEN_OFFSETS_US]) == tokens
    assert server.attributes[GenAIAttributes.USAGE_INPUT_TOKENS] == tokens
    assert server.attributes[GenAIAttributes.USAGE_OUTPUT_TOKENS] == tokens
    assert client.attributes[HttpAttributes.RESPONSE_STATUS_CODE] == 200


def test_openai_streaming_client_against_example_server() -> None:
    with capture() as cap, run_app(create_app(token_delay_s=0.001)) as base:
        with make_client(f"{base}/v1") as client:
            assert chat(client, PROMPT) == PROMPT
        _assert_linked(cap, len(PROMPT.split()))
        client_span = cap.one(CLIENT_SPAN)
        server_span = cap.wait_for(SERVER_SPAN)
        first_byte = client_span.attributes[LatscopeAttributes.FIRST_BYTE_NS]
        first_token = client_span.attributes[LatscopeAttributes.FIRST_TOKEN_NS]
        last_byte = client_span.attributes[ClientAttributes.LAST_BYTE_NS]
        assert client_span.start_time < first_byte <= first_token <= last_byte
        assert last_byte <= client_span.end_time
        # The first SSE chunk carries only the role; the first token comes with the decode.
        assert first_token >= server_span.attributes[LatscopeAttributes.FIRST_TOKEN_NS]
        assert LatscopeAttributes.STREAM_END not in client_span.attributes


def test_openai_non_streaming_call() -> None:
    with capture() as cap, run_app(create_app(token_delay_s=0.0)) as base:
        with make_client(f"{base}/v1") as client:
            assert chat(client, PROMPT, stream=False) == PROMPT
        _assert_linked(cap, len(PROMPT.split()))


def test_async_openai_client() -> None:
    async def run(base: str) -> str:
        http = sdk.instrument_httpx(httpx.AsyncClient(timeout=30))
        client = openai.AsyncOpenAI(
            base_url=f"{base}/v1", api_key="unused", http_client=http, max_retries=0
        )
        parts = []
        stream = await client.chat.completions.create(
            model="toy-echo-1", messages=[{"role": "user", "content": PROMPT}], stream=True
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
        await http.aclose()
        return "".join(parts)

    with capture() as cap, run_app(create_app(token_delay_s=0.001)) as base:
        assert asyncio.run(run(base)) == PROMPT
        _assert_linked(cap, len(PROMPT.split()))
        assert LatscopeAttributes.FIRST_TOKEN_NS in cap.one(CLIENT_SPAN).attributes


def test_client_closing_the_stream_early_is_seen_on_both_sides() -> None:
    long_prompt = " ".join(f"w{i}" for i in range(400))
    with capture() as cap, run_app(create_app(token_delay_s=0.002)) as base:
        with (
            make_client(f"{base}/v1") as client,
            client.chat.completions.create(
                model="toy-echo-1",
                messages=[{"role": "user", "content": long_prompt}],
                stream=True,
            ) as stream,
        ):
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    break
        client_span = cap.one(CLIENT_SPAN)
        assert client_span.attributes[LatscopeAttributes.STREAM_END] == "closed_before_complete"
        server_span = cap.wait_for(SERVER_SPAN)
        assert server_span.attributes[LatscopeAttributes.STREAM_END] in (
            "client_disconnect",
            "cancelled",
        )
        assert cap.phases()[Phase.DECODE].attributes[LatscopeAttributes.TOKEN_COUNT] < 400


def test_client_call_injects_traceparent_and_records_first_token() -> None:
    with capture() as cap, run_app(create_app(token_delay_s=0.001)) as base:
        headers: dict[str, str] = {}
        body = {"model": "toy-echo-1", "messages": [{"role": "user", "content": PROMPT}]}
        url = f"{base}/v1/chat/completions"
        with (
            sdk.client_call("POST", url, headers=headers, model="toy-echo-1") as call,
            httpx.stream("POST", url, json={**body, "stream": True}, headers=headers) as resp,
        ):
            call.set_status_code(resp.status_code)
            call.first_byte()
            for line in resp.iter_lines():
                if '"content": "' in line and '"content": ""' not in line:
                    call.first_token()
        assert headers["traceparent"].startswith("00-")
        client = cap.one(CLIENT_SPAN)
        assert client.attributes[GenAIAttributes.REQUEST_MODEL] == "toy-echo-1"
        assert cap.wait_for(SERVER_SPAN).parent.span_id == client.context.span_id
        assert LatscopeAttributes.FIRST_TOKEN_NS in client.attributes


def test_client_call_records_failure() -> None:
    with capture() as cap:
        with pytest.raises(ConnectionError), sdk.client_call("GET", "http://127.0.0.1:9/x"):
            raise ConnectionError("refused")
        span = cap.one("GET /x")
        assert span.attributes[ClientAttributes.ERROR_TYPE] == "ConnectionError"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.subprocess
@pytest.mark.server
def test_end_to_end_attribution_through_latscope_serve(serve: Server) -> None:
    """Example server (own process, own service) and openai client -> latscope serve -> API."""
    port = _free_port()
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{serve.grpc}",
        "OTEL_SERVICE_NAME": "example-llm-server",
        "LATSCOPE_GPU": "off",
    }
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen(
        [sys.executable, "-m", "examples.inference_server", "--port", str(port)],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("example server did not start") from None
                time.sleep(0.05)
        seen: list[str] = []
        sdk.configure(service_name="chat-frontend", endpoint=serve.grpc, gpu=False)
        try:
            with make_client(f"http://127.0.0.1:{port}/v1") as client:
                client._client.event_hooks["response"].append(
                    lambda r: seen.append(r.request.headers["traceparent"])
                )
                assert chat(client, PROMPT) == PROMPT
        finally:
            sdk.shutdown()
    finally:
        proc.terminate()  # uvicorn exits cleanly; the SDK flushes at exit
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode in (0, -signal.SIGTERM), out
    trace_id = seen[0].split("-")[1]
    body = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        r = httpx.get(serve.url(f"/v1/requests/{trace_id}/attribution"), timeout=10)
        if r.status_code == 200 and r.json()["buckets_ms"]["network"] is not None:
            body = r.json()
            break
        time.sleep(0.2)
    assert body is not None, serve.text()
    assert body["service"] == "example-llm-server"
    assert body["model"] == "toy-echo-1"
    assert body["output_tokens"] == len(PROMPT.split())
    assert body["input_tokens"] == len(PROMPT.split())
    buckets = body["buckets_ms"]
    assert buckets["network"] >= 0
    assert buckets["decode"] > 0 and buckets["prefill"] > 0
    assert sum(buckets.values()) == pytest.approx(body["e2e_ms"], abs=1e-3)


def test_chunked_plain_response_first_token_is_first_body_bytes() -> None:
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    async def body():
        yield b""
        for word in (b"alpha ", b"beta ", b"gamma"):
            await asyncio.sleep(0.001)
            yield word

    async def endpoint(request):
        return StreamingResponse(body(), media_type="text/plain")

    app = Starlette(routes=[Route("/gen", endpoint)])
    with capture() as cap, run_app(app) as base, sdk.instrument_httpx(httpx.Client()) as http:
        with http.stream("GET", f"{base}/gen") as resp:
            assert b"".join(resp.iter_bytes()) == b"alpha beta gamma"
        span = cap.one("GET /gen")
        attrs = span.attributes
        assert attrs[HttpAttributes.RESPONSE_STATUS_CODE] == 200
        assert attrs[LatscopeAttributes.FIRST_BYTE_NS] <= attrs[LatscopeAttributes.FIRST_TOKEN_NS]
        assert attrs[LatscopeAttributes.FIRST_TOKEN_NS] <= attrs[ClientAttributes.LAST_BYTE_NS]
        assert LatscopeAttributes.STREAM_END not in attrs


def test_decorated_endpoint_returning_a_streaming_response() -> None:
    """@inference directly on a FastAPI endpoint: the span lasts until the body is sent."""
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    app = FastAPI()
    app.add_middleware(sdk.TraceparentMiddleware)

    @app.get("/stream")
    @sdk.inference(model="toy")
    async def stream() -> StreamingResponse:
        with sdk.phase("preprocess"):
            words = ["a", "b", "c"]

        async def body():
            with sdk.phase("decode"):
                for w in words:
                    await asyncio.sleep(0.001)
                    sdk.record_token()
                    yield f"data: {w}\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    with capture() as cap, run_app(app) as base, sdk.instrument_httpx(httpx.Client()) as http:
        assert http.get(f"{base}/stream").text == "data: a\n\ndata: b\n\ndata: c\n\n"
        server, client = cap.one("chat toy"), cap.one("GET /stream")
        decode = cap.phases()[Phase.DECODE]
        assert server.parent.span_id == client.context.span_id
        assert decode.parent.span_id == server.context.span_id
        assert decode.attributes[LatscopeAttributes.TOKEN_COUNT] == 3
        assert server.end_time >= decode.end_time
        assert server.attributes[GenAIAttributes.USAGE_OUTPUT_TOKENS] == 3
        assert server.attributes[HttpAttributes.ROUTE] == "/stream"


def _readme_server_snippet() -> str:
    """The README's server example, as a user copies it."""
    readme = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    section = readme.split("Server (FastAPI here", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_readme_server_snippet_serves_a_traced_stream() -> None:
    """The README's server snippet, run as written (its names filled in), streams the tokens
    through its route, and the span carries the phases, the tokens and the route's template."""
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    class Model:
        async def prefill(self, prompt: list[str]) -> None:
            await asyncio.sleep(0.001)

        async def decode(self, prompt: list[str]):
            for word in prompt:
                await asyncio.sleep(0.001)
                yield f"data: {word}\n\n"

    snippet = _readme_server_snippet()
    assert "sdk.configure(" in snippet and "StreamingResponse(generate(" in snippet
    names = {
        "FastAPI": FastAPI,
        "StreamingResponse": StreamingResponse,
        "slots": asyncio.Semaphore(4),
        "tokenize": lambda req: req["prompt"].split(),
        "model": Model(),
    }
    with capture() as cap:
        # The snippet's own configure() would export over OTLP: the capture's stays in force.
        exec(snippet.replace("sdk.configure(", "dict("), names)
        with run_app(names["app"]) as base, httpx.Client() as http:
            body = http.post(f"{base}/v1/chat/completions", json={"prompt": "a b c"}).text
            assert body == "data: a\n\ndata: b\n\ndata: c\n\n"
            server = cap.wait_for("chat llama-3-8b")
    assert server.kind == SpanKind.SERVER
    assert server.attributes[HttpAttributes.ROUTE] == "/v1/chat/completions"
    assert server.attributes[GenAIAttributes.USAGE_INPUT_TOKENS] == 3
    assert cap.phases()[Phase.DECODE].attributes[LatscopeAttributes.TOKEN_COUNT] == 3
    assert set(cap.phases()) == {Phase.QUEUE, Phase.PREPROCESS, Phase.PREFILL, Phase.DECODE}


def test_the_route_is_the_template_not_the_path() -> None:
    from fastapi import FastAPI

    app = FastAPI()
    app.add_middleware(sdk.TraceparentMiddleware)

    @app.get("/v1/models/{name}/generate")
    @sdk.inference(model="toy")
    async def generate(name: str) -> dict:
        return {"model": name}

    with capture() as cap, run_app(app) as base, httpx.Client() as http:
        assert http.get(f"{base}/v1/models/m-7/generate").json() == {"model": "m-7"}
        server = cap.wait_for("chat toy")
    assert server.attributes[HttpAttributes.ROUTE] == "/v1/models/{name}/generate"
