"""Shared helpers for the SDK tests: an in-memory span capture and uvicorn on a free port."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from latscope.sdk import _guard
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from latscope import sdk


class Capture:
    """Spans the SDK exported in this test, by name and kind."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.exporter = exporter

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        assert len(found) == 1, f"expected one {name!r} span, got {[s.name for s in self.spans()]}"
        return found[0]

    def phases(self) -> dict[str, ReadableSpan]:
        return {
            s.attributes["latscope.phase"]: s
            for s in self.spans()
            if s.attributes and "latscope.phase" in s.attributes
        }

    def clear(self) -> None:
        self.exporter.clear()


@contextmanager
def capture(**kwargs: Any) -> Iterator[Capture]:
    exporter = InMemorySpanExporter()
    kwargs.setdefault("gpu", False)
    kwargs.setdefault("service_name", "test-svc")
    sdk.configure(span_exporter=exporter, **kwargs)
    try:
        yield Capture(exporter)
    finally:
        sdk.shutdown()
        _guard.reset()


@contextmanager
def run_app(app: Any, lifespan: str = "off") -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port; yields its base URL."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan=lifespan)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
