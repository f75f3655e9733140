"""The latscope SDK: instrument an inference server and its clients in a few lines.

Example::

    from latscope import sdk

    sdk.configure(service_name="llm-server")

    @sdk.inference(model="llama-3-8b")
    async def generate(prompt):
        with sdk.phase("prefill"):
            ...
        with sdk.phase("decode"):
            async for tok in sdk.atraced_tokens(model.stream(prompt)):
                yield tok

``latscope.sdk.testing`` holds a fake NVML module (pynvml's interface) for tests.
"""

from __future__ import annotations

from latscope.sdk._client import ClientCall, client_call, instrument_httpx
from latscope.sdk._options import ExportOptions, GpuOptions
from latscope.sdk._propagation import TraceparentMiddleware, extract_context, inject_context
from latscope.sdk._runtime import configure, force_flush, shutdown, stats
from latscope.sdk._server import (
    atraced_tokens,
    current_span,
    inference,
    phase,
    record_token,
    set_usage,
    traced_tokens,
)

__all__ = [
    "ClientCall",
    "ExportOptions",
    "GpuOptions",
    "TraceparentMiddleware",
    "atraced_tokens",
    "client_call",
    "configure",
    "current_span",
    "extract_context",
    "force_flush",
    "inference",
    "inject_context",
    "instrument_httpx",
    "phase",
    "record_token",
    "set_usage",
    "shutdown",
    "stats",
    "traced_tokens",
]
