"""An OpenAI-compatible streaming chat server, instrumented with latscope in a few lines.

The "model" is a toy that echoes the prompt's words back with a fixed delay per token, so the
example runs anywhere; the instrumentation is what a real server would write.

Run it::

    python -m examples.inference_server --port 8000    # exports to OTEL_EXPORTER_OTLP_ENDPOINT
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

from latscope import sdk

MODEL = "toy-echo-1"


class Message(BaseModel):
    role: str
    content: str


class ChatRequest(BaseModel):
    model: str = MODEL
    messages: list[Message]
    stream: bool = False
    max_tokens: int | None = None
    stream_options: dict[str, Any] | None = None


class ToyModel:
    """Stands for a real model: tokenize, prefill, then one token per ``token_delay_s``."""

    def __init__(self, token_delay_s: float, prefill_s: float, slots: int) -> None:
        self.token_delay_s = token_delay_s
        self.prefill_s = prefill_s
        self.slots = asyncio.Semaphore(slots)

    def tokenize(self, req: ChatRequest) -> list[str]:
        return " ".join(m.content for m in req.messages).split()

    async def prefill(self, prompt: list[str]) -> None:
        await asyncio.sleep(self.prefill_s)

    async def decode(self, prompt: list[str], max_tokens: int | None) -> AsyncIterator[str]:
        for i, word in enumerate(prompt[: max_tokens or len(prompt)]):
            await asyncio.sleep(self.token_delay_s)
            yield word if i == 0 else " " + word


def create_app(token_delay_s: float = 0.002, prefill_s: float = 0.005, slots: int = 4) -> FastAPI:
    """The FastAPI app; latscope must be configured (``sdk.configure``) by whoever runs it."""
    model = ToyModel(token_delay_s, prefill_s, slots)
    app = FastAPI()
    app.add_middleware(sdk.TraceparentMiddleware)  # traceparent in; flushes at shutdown

    @sdk.inference(model=MODEL)
    async def stream_chat(req: ChatRequest) -> AsyncIterator[str]:
        rid, created = f"chatcmpl-{uuid.uuid4().hex[:12]}", int(time.time())
        async with sdk.phase("queue"):
            await model.slots.acquire()
        try:
            with sdk.phase("preprocess"):
                prompt = model.tokenize(req)
            sdk.set_usage(input_tokens=len(prompt))
            async with sdk.phase("prefill"):
                await model.prefill(prompt)
            yield _chunk(rid, created, {"role": "assistant", "content": ""})
            n = 0
            async with sdk.phase("decode"):
                async for text in sdk.atraced_tokens(model.decode(prompt, req.max_tokens)):
                    n += 1
                    yield _chunk(rid, created, {"content": text})
            with sdk.phase("postprocess"):
                yield _chunk(rid, created, {}, finish="stop")
                if (req.stream_options or {}).get("include_usage"):
                    yield _usage_chunk(rid, created, len(prompt), n)
                yield "data: [DONE]\n\n"
        finally:
            model.slots.release()

    @sdk.inference(model=MODEL)
    async def complete_chat(req: ChatRequest) -> dict[str, Any]:
        async with sdk.phase("queue"):
            await model.slots.acquire()
        try:
            with sdk.phase("preprocess"):
                prompt = model.tokenize(req)
            sdk.set_usage(input_tokens=len(prompt))
            async with sdk.phase("prefill"):
                await model.prefill(prompt)
            async with sdk.phase("decode"):
                text = "".join(
                    [t async for t in sdk.atraced_tokens(model.decode(prompt, req.max_tokens))]
                )
            with sdk.phase("postprocess"):
                n = len(text.split())
                return {
                    "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": MODEL,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {
                        "prompt_tokens": len(prompt),
                        "completion_tokens": n,
                        "total_tokens": len(prompt) + n,
                    },
                }
        finally:
            model.slots.release()

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest) -> Any:
        if req.stream:
            return StreamingResponse(stream_chat(req), media_type="text/event-stream")
        return JSONResponse(await complete_chat(req))

    return app


def _chunk(rid: str, created: int, delta: dict[str, Any], finish: str | None = None) -> str:
    body = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(body)}\n\n"


def _usage_chunk(rid: str, created: int, prompt: int, completion: int) -> str:
    body = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": MODEL,
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }
    return f"data: {json.dumps(body)}\n\n"


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--token-delay", type=float, default=0.002, help="seconds per token")
    args = parser.parse_args()
    sdk.configure(service_name="example-llm-server")  # OTEL_* / LATSCOPE_* pick the endpoint
    endpoint = os.environ.get("LATSCOPE_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"
    )
    print(
        f"example LLM server on http://{args.host}:{args.port}/v1 (OpenAI-style chat); spans go "
        f"to {endpoint}. Try: python -m examples.client --base-url "
        f"http://{args.host}:{args.port}/v1 'hello there'",
        flush=True,
    )
    uvicorn.run(create_app(args.token_delay), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
