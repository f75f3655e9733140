"""A simulated OpenAI-compatible inference server, instrumented with ``latscope.sdk``.

``POST /v1/chat/completions`` (streamed as server-sent events or answered in one JSON) runs a
request through the phases a real server has: preprocess (tokenize), an uninstrumented step
(shown as ``other``), queue (wait for a batch slot), prefill (up to the first token), decode and
postprocess (detokenize, format). The work happens in ``latscope.demo.engine``; this module only
serves it and records, next to each SDK phase, the time the phase really took.

Run on its own (``latscope demo`` does this for you)::

    python -m latscope.demo.server --scenario healthy --otlp http://127.0.0.1:4317
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field

from latscope import sdk
from latscope.demo import scenarios
from latscope.demo.engine import END, Engine, Sequence
from latscope.demo.scenarios import Scenario
from latscope.demo.truth import RequestTruth, TruthMiddleware, TruthRecorder, current

log = logging.getLogger("latscope.demo.server")

#: Chat-template tokens added per message, as real templates add role markers.
TEMPLATE_TOKENS_PER_MESSAGE = 4


class ChatMessage(BaseModel):
    role: str = Field(max_length=32)
    content: str = Field(max_length=1_000_000)


class ChatRequest(BaseModel):
    """The part of OpenAI's chat-completions request the simulator uses."""

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1, max_length=1000)
    max_tokens: int = Field(default=64, ge=1, le=4096)
    stream: bool = False
    stream_options: dict[str, Any] | None = None


class measured:
    """An SDK phase, plus the true time spent inside it recorded in ``truth``.

    Each boundary is read right before and right after the SDK's own call, so the SDK's reading
    lies between: the truth is the bracket ``[t1 - t0_after, t1_after - t0]``.
    """

    __slots__ = ("_name", "_phase", "_t0", "_t0_after", "_truth")

    def __init__(self, truth: RequestTruth | None, name: str) -> None:
        self._truth = truth
        self._name = name
        self._phase = sdk.phase(name)
        self._t0 = self._t0_after = 0

    def __enter__(self) -> measured:
        self._t0 = time.monotonic_ns()
        self._phase.__enter__()
        self._t0_after = time.monotonic_ns()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        t1 = time.monotonic_ns()
        self._phase.__exit__(exc_type, exc, tb)
        t1_after = time.monotonic_ns()
        if self._truth is not None:
            self._truth.add(self._name, t1 - self._t0_after, t1_after - self._t0)


def _error(status: int, message: str, kind: str) -> JSONResponse:
    """OpenAI's error shape: ``{"error": {"message", "type", "code"}}``."""
    return JSONResponse(
        status_code=status, content={"error": {"message": message, "type": kind, "code": status}}
    )


def count_prompt_tokens(req: ChatRequest) -> int:
    """Whitespace tokens of every message plus the chat template's markers."""
    return sum(len(m.content.split()) + TEMPLATE_TOKENS_PER_MESSAGE for m in req.messages)


def create_app(
    scenario: Scenario, recorder: TruthRecorder | None = None, *, warm: bool = False
) -> FastAPI:
    """The simulator's ASGI app; the engine runs while the app's lifespan does. ``warm``: the
    replica was serving before the run, so it has no cold period."""
    recorder = recorder or TruthRecorder()
    config = dataclasses.replace(scenario.engine, cold_s=0.0) if warm else scenario.engine
    engine_box: dict[str, Engine] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        engine = engine_box["engine"] = Engine(config)
        task = asyncio.create_task(engine.run(), name="engine")
        try:
            yield
        finally:
            engine.stop()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    app = FastAPI(title="latscope demo LLM server", lifespan=lifespan)
    # Added last is outermost: truth (before) -> SDK (arrival time) -> truth (after).
    app.add_middleware(TruthMiddleware, recorder=recorder, after=True)
    app.add_middleware(sdk.TraceparentMiddleware)
    app.add_middleware(TruthMiddleware, recorder=recorder)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        msg = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}"
            for e in exc.errors()
        )
        return _error(400, msg, "invalid_request_error")

    async def front(req: ChatRequest, truth: RequestTruth | None) -> Sequence:
        """Tokenize, pass the uninstrumented step, and queue for a batch slot."""
        if truth is not None:
            truth.cold = engine_box["engine"].cold()
        with measured(truth, "preprocess"):
            prompt_tokens = count_prompt_tokens(req)
            await asyncio.sleep(config.tokenize_cost_ms(prompt_tokens) / 1000)
        # Auth and rate limiting that nobody instrumented: latscope shows it as "other".
        await asyncio.sleep(config.uninstrumented_ms / 1000)
        seq = Sequence(
            truth.request_id if truth else uuid.uuid4().hex, prompt_tokens, req.max_tokens
        )
        if truth is not None:
            truth.prompt_tokens = prompt_tokens
        # Admitted past the 503 check already: a few requests in preprocess may overshoot
        # max_waiting, never more than uvicorn's limit_concurrency lets in.
        engine_box["engine"].submit(seq, force=True)
        try:
            with measured(truth, "queue"):
                await seq.admitted.wait()
        except BaseException:
            engine_box["engine"].cancel(seq)  # the client left while waiting for a slot
            raise
        return seq

    def chunk(cid: str, created: int, delta: dict[str, Any], finish: str | None) -> bytes:
        body = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": scenario.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"

    @sdk.inference(model=scenario.model, operation="chat")
    async def stream_chat(req: ChatRequest, truth: RequestTruth | None) -> AsyncIterator[bytes]:
        cid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        seq: Sequence | None = None
        try:
            seq = await front(req, truth)
            with measured(truth, "prefill"):
                token = await seq.tokens.get()
            text: list[str] = []
            with measured(truth, "decode"):
                while token is not END:
                    sdk.record_token()
                    if truth is not None:
                        truth.token()
                    text.append(token)
                    yield chunk(cid, created, {"content": token + " "}, None)
                    token = await seq.tokens.get()
            with measured(truth, "postprocess"):
                await asyncio.sleep(config.detokenize_cost_ms(len(text)) / 1000)
                yield chunk(cid, created, {}, "length")
                if (req.stream_options or {}).get("include_usage"):
                    usage = {
                        "id": cid,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": scenario.model,
                        "choices": [],
                        "usage": _usage(seq.prompt_tokens, len(text)),
                    }
                    yield b"data: " + json.dumps(usage).encode() + b"\n\n"
                yield b"data: [DONE]\n\n"
            sdk.set_usage(input_tokens=seq.prompt_tokens, output_tokens=len(text))
            if truth is not None:
                truth.output_tokens = len(text)
        except BaseException:
            if truth is not None:
                truth.status = 499  # the client went away mid-stream
            raise
        finally:
            if seq is not None:
                engine_box["engine"].cancel(seq)
            if truth is not None:
                truth.ended_ns = time.monotonic_ns()

    async def stream_body(req: ChatRequest, truth: RequestTruth | None) -> AsyncIterator[bytes]:
        """``stream_chat`` plus the truth's reading after the SDK ended the server span."""
        try:
            async for piece in stream_chat(req, truth):
                yield piece
        finally:
            if truth is not None:
                truth.ended_after_ns = time.monotonic_ns()

    @sdk.inference(model=scenario.model, operation="chat")
    async def complete_chat(req: ChatRequest, truth: RequestTruth | None) -> dict[str, Any]:
        seq = await front(req, truth)
        try:
            with measured(truth, "prefill"):
                token = await seq.tokens.get()
            text: list[str] = []
            with measured(truth, "decode"):
                while token is not END:
                    sdk.record_token()
                    if truth is not None:
                        truth.token()
                    text.append(token)
                    token = await seq.tokens.get()
            with measured(truth, "postprocess"):
                await asyncio.sleep(config.detokenize_cost_ms(len(text)) / 1000)
                answer = {
                    "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": scenario.model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": " ".join(text)},
                            "finish_reason": "length",
                        }
                    ],
                    "usage": _usage(seq.prompt_tokens, len(text)),
                }
            sdk.set_usage(input_tokens=seq.prompt_tokens, output_tokens=len(text))
            if truth is not None:
                truth.output_tokens = len(text)
            return answer
        finally:
            engine_box["engine"].cancel(seq)
            if truth is not None:
                truth.ended_ns = time.monotonic_ns()

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(req: ChatRequest) -> Any:
        engine = engine_box["engine"]
        if engine.full():
            engine.rejected += 1
            truth = current.get()
            if truth is not None:
                truth.status = 503
            return _error(503, "the server is overloaded; retry later", "overloaded")
        truth = current.get()
        if req.stream:
            return StreamingResponse(stream_body(req, truth), media_type="text/event-stream")
        try:
            answer = await complete_chat(req, truth)
        finally:
            if truth is not None:
                truth.ended_after_ns = time.monotonic_ns()
        return JSONResponse(answer)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": scenario.model, "object": "model"}]}

    @app.get("/demo/truth")
    async def truth() -> dict[str, Any]:
        """What each finished request really spent in each phase (monotonic ns)."""
        return recorder.to_json()

    @app.get("/demo/stats")
    async def stats() -> dict[str, Any]:
        engine = engine_box["engine"]
        return {
            "prefill_steps": engine.prefill_steps,
            "decode_steps": engine.decode_steps,
            "rejected": engine.rejected,
            "peak_running": engine.peak_running,
            "peak_waiting": engine.peak_waiting,
            "cold_prefill_steps": engine.cold_prefill_steps,
            "waiting": len(engine.waiting),
            "running": len(engine.running),
        }

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def skewed_clock(skew_s: float) -> Callable[[], int]:
    """A wall clock running ``skew_s`` seconds ahead (behind when negative) of this host's."""
    offset = round(skew_s * 1e9)
    return lambda: time.time_ns() + offset


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m latscope.demo.server", description=__doc__)
    p.add_argument("--scenario", default="healthy", choices=list(scenarios.SCENARIOS))
    p.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (port 0 picks one)")
    p.add_argument("--otlp", default="http://127.0.0.1:4317", help="latscope's OTLP/gRPC address")
    p.add_argument("--service-name", default="llm-server")
    p.add_argument(
        "--instance-id", default="", help="service.instance.id of this replica (default: none)"
    )
    p.add_argument(
        "--warm", action="store_true",
        help="the replica was serving before the run: no cold period (the scenario's cold_s)",
    )  # fmt: skip
    p.add_argument(
        "--clock-skew", type=float, default=0.0, metavar="S",
        help="run the SDK's clock S seconds ahead of this host's (negative: behind)",
    )  # fmt: skip
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    scenario = scenarios.get(args.scenario)
    host, _, port = args.listen.rpartition(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host or "127.0.0.1", int(port)))
    except (OSError, ValueError) as exc:
        print(f"latscope demo server: cannot listen on {args.listen}: {exc}", file=sys.stderr)
        return 1
    sock.listen(1024)
    sdk.configure(
        service_name=args.service_name,
        endpoint=args.otlp,
        insecure=True,
        gpu=False,
        clock=skewed_clock(args.clock_skew),
        resource_attributes={"service.instance.id": args.instance_id} if args.instance_id else None,
    )
    app = create_app(scenario, warm=args.warm)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="on",
            # Bounds what waits in preprocess beyond the engine's queue (uvicorn answers 503).
            limit_concurrency=scenario.engine.max_waiting + scenario.engine.max_batch + 64,
        )
    )
    bound_host, bound_port = sock.getsockname()[:2]
    print(f"latscope demo server: http://{bound_host}:{bound_port}", flush=True)
    # uvicorn re-raises SIGTERM once it has shut down; with the default action that would kill
    # the process before the SDK flushes the last spans, so make it a no-op here.
    signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        server.run(sockets=[sock])
    finally:
        sdk.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
