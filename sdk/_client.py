"""Client side: ``client_call()`` and ``instrument_httpx()``.

A CLIENT span per call, ``traceparent`` injected into the outgoing headers, and the times the
first byte, the first token and the last byte of the response were seen (``latscope.first_*_ns``
attributes, on the client's clock). The span ends when the response is complete or closed.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Iterator, Mapping, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from latscope.sdk import _guard
from latscope.sdk._propagation import PROPAGATOR
from latscope.sdk._runtime import RT
from latscope.semconv import ClientAttributes, GenAIAttributes, HttpAttributes, LatscopeAttributes

#: Bytes of a streamed body scanned for the first SSE token; beyond it any data counts.
_SSE_SCAN_LIMIT = 64 * 1024


class ClientCall:
    """One outgoing call: a CLIENT span; use via ``client_call()``.

    ``headers`` is the mapping you passed, now carrying ``traceparent``. Call ``first_byte()``
    and ``first_token()`` as the response arrives (later calls are ignored), ``finish()`` (or
    leave the ``with`` block) when it is complete.
    """

    __slots__ = ("_done", "_first_byte", "_first_token", "headers", "span")

    def __init__(self, span: trace.Span | None, headers: MutableMapping[str, str]) -> None:
        self.span = span
        self.headers = headers
        self._first_byte = 0
        self._first_token = 0
        self._done = span is None

    def first_byte(self) -> None:
        """The response's first byte (or headers) arrived now."""
        if not self._first_byte and not self._done:
            try:
                self._first_byte = RT.clock()
                self.span.set_attribute(LatscopeAttributes.FIRST_BYTE_NS, self._first_byte)  # type: ignore[union-attr]
            except Exception:
                _guard.fault("client.first_byte")

    def first_token(self) -> None:
        """The response's first token arrived now (implies the first byte)."""
        if not self._first_token and not self._done:
            try:
                t = self._first_token = RT.clock()
                if not self._first_byte:
                    self._first_byte = t
                    self.span.set_attribute(LatscopeAttributes.FIRST_BYTE_NS, t)  # type: ignore[union-attr]
                self.span.set_attribute(LatscopeAttributes.FIRST_TOKEN_NS, self._first_token)  # type: ignore[union-attr]
            except Exception:
                _guard.fault("client.first_token")

    def set_status_code(self, status_code: int) -> None:
        if not self._done:
            try:
                self.span.set_attribute(HttpAttributes.RESPONSE_STATUS_CODE, int(status_code))  # type: ignore[union-attr]
                if status_code >= 500:
                    self.span.set_status(Status(StatusCode.ERROR, f"HTTP {status_code}"))  # type: ignore[union-attr]
            except Exception:
                _guard.fault("client.status")

    def finish(self, exc: BaseException | None = None, end: str | None = None) -> None:
        """The response is complete (or failed with ``exc``); ends the span once."""
        if self._done:
            return
        self._done = True
        try:
            span = self.span
            assert span is not None
            t = RT.clock()
            if self._first_byte:
                span.set_attribute(ClientAttributes.LAST_BYTE_NS, t)
            if end is not None:
                span.set_attribute(LatscopeAttributes.STREAM_END, end)
            if exc is not None:
                span.set_attribute(ClientAttributes.ERROR_TYPE, type(exc).__name__)
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            span.end(end_time=t)
        except Exception:
            _guard.fault("client.finish")

    def __enter__(self) -> ClientCall:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.finish(exc)

    async def __aenter__(self) -> ClientCall:
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.finish(exc)


def client_call(
    method: str = "POST",
    url: str | None = None,
    *,
    headers: MutableMapping[str, str] | None = None,
    model: str | None = None,
    name: str | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> ClientCall:
    """Start a CLIENT span for one call and inject ``traceparent`` into ``headers``.

    Example::

        headers = {}
        with client_call("POST", url, headers=headers, model="llama-3-8b") as call:
            for chunk in send(url, headers=headers):
                call.first_token()
    """
    carrier: MutableMapping[str, str] = {} if headers is None else headers
    if not RT.enabled:
        return ClientCall(None, carrier)
    try:
        return ClientCall(_start_span(method, url, carrier, model, name, attributes), carrier)
    except Exception:
        _guard.fault("client_call")
        return ClientCall(None, carrier)


def _start_span(
    method: str,
    url: str | None,
    carrier: MutableMapping[str, str],
    model: str | None,
    name: str | None,
    attributes: Mapping[str, Any] | None,
) -> trace.Span:
    attrs: dict[str, Any] = dict(attributes or {})
    attrs[HttpAttributes.REQUEST_METHOD] = method
    path = ""
    if url:
        parts = urlsplit(url)
        path = parts.path or "/"
        attrs[ClientAttributes.URL_FULL] = url
        attrs[HttpAttributes.URL_PATH] = path
        if parts.hostname:
            attrs[ClientAttributes.SERVER_ADDRESS] = parts.hostname
        if parts.port:
            attrs[ClientAttributes.SERVER_PORT] = parts.port
    if model:
        attrs[GenAIAttributes.REQUEST_MODEL] = model
    span = RT.tracer.start_span(
        name or f"{method} {path}".strip(),
        kind=SpanKind.CLIENT,
        attributes=attrs,
        start_time=RT.clock(),
    )
    PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return span


# --------------------------------------------------------------------------------------------
# first-token detection in a streamed body


class _TokenWatch:
    """Finds the first token in a response body: the first SSE ``data:`` event carrying content
    (OpenAI-style chunks whose delta is empty do not count), or any bytes when not SSE."""

    __slots__ = ("_buf", "_scanned", "call", "done", "sse")

    def __init__(self, call: ClientCall, sse: bool) -> None:
        self.call = call
        self.sse = sse
        self.done = False
        self._buf = b""
        self._scanned = 0

    def watch(self, chunk: bytes) -> None:
        """Per chunk: first token until found; then only the SSE end marker."""
        try:
            if not self.call._first_token:
                self.feed(chunk)
            # OpenAI-style streams end with ``data: [DONE]``; clients stop reading there.
            if self.sse and b"[DONE]" in chunk:
                self.done = True
        except Exception:
            _guard.fault("client.watch")
            self.sse = False  # stop parsing; any further bytes count as the token

    def feed(self, chunk: bytes) -> None:
        call = self.call
        if call._first_token or not chunk:
            return
        call.first_byte()
        if not self.sse:
            call.first_token()
            return
        self._scanned += len(chunk)
        self._buf += chunk
        *events, self._buf = self._buf.replace(b"\r\n", b"\n").split(b"\n\n")
        for event in events:
            if _event_has_token(event):
                call.first_token()
                self._buf = b""
                return
        if self._scanned > _SSE_SCAN_LIMIT:  # bounded: stop looking, count what arrived
            call.first_token()
            self._buf = b""


def _event_has_token(event: bytes) -> bool:
    data = b"\n".join(line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:"))
    if not data or data.strip() == b"[DONE]":
        return False
    try:
        payload = json.loads(data)
    except ValueError:
        return True  # non-JSON data: the bytes are the token
    if not isinstance(payload, dict) or "choices" not in payload:
        return True
    for choice in payload.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta") or choice.get("message") or {}
        if isinstance(delta, dict) and (delta.get("content") or delta.get("tool_calls")):
            return True
        if choice.get("text"):
            return True
    return False


# --------------------------------------------------------------------------------------------
# httpx


def instrument_httpx(client: Any) -> Any:
    """Trace every request of an ``httpx.Client`` or ``httpx.AsyncClient``; returns the client.

    Each request gets a CLIENT span with ``traceparent`` injected; for streamed responses the
    first byte, the first SSE token and the end are recorded. Calling it twice is harmless.

    Example::

        http = instrument_httpx(httpx.Client())
        llm = openai.OpenAI(base_url=..., http_client=http)
    """
    import httpx

    sync_transport, async_transport = _httpx_transports()
    if isinstance(client, httpx.AsyncClient):
        wrap: Any = async_transport
    elif isinstance(client, httpx.Client):
        wrap = sync_transport
    else:
        raise ValueError("instrument_httpx takes an httpx.Client or httpx.AsyncClient")
    if not isinstance(client._transport, wrap):
        client._transport = wrap(client._transport)
    for pattern, transport in list(client._mounts.items()):
        if transport is not None and not isinstance(transport, wrap):
            client._mounts[pattern] = wrap(transport)
    return client


def _begin(request: Any) -> ClientCall | None:
    if not RT.enabled:
        return None
    try:
        span = _start_span(request.method, str(request.url), request.headers, None, None, None)
        return ClientCall(span, request.headers)
    except Exception:
        _guard.fault("httpx.begin")
        return None


def _is_sse(response: Any) -> bool:
    # A compressed body cannot be scanned before httpx decodes it: then any bytes count.
    encoding = response.headers.get("content-encoding", "identity").lower()
    return encoding == "identity" and response.headers.get("content-type", "").startswith(
        "text/event-stream"
    )


@functools.cache
def _httpx_transports() -> tuple[type, type]:
    """(sync, async) transport wrappers; built on first use so httpx stays optional."""
    import httpx

    class SyncTransport(httpx.BaseTransport):
        def __init__(self, inner: httpx.BaseTransport) -> None:
            self._inner = inner

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            call = _begin(request)
            if call is None:
                return self._inner.handle_request(request)
            try:
                response = self._inner.handle_request(request)
            except BaseException as exc:
                call.finish(exc)
                raise
            try:
                call.first_byte()
                call.set_status_code(response.status_code)
                response.stream = SyncStream(response.stream, _TokenWatch(call, _is_sse(response)))
            except Exception:
                _guard.fault("httpx.response")
                call.finish()
            return response

        def close(self) -> None:
            self._inner.close()

    class SyncStream(httpx.SyncByteStream):
        def __init__(self, inner: Any, watch: _TokenWatch) -> None:
            self._inner = inner
            self._watch = watch
            self._complete = False

        def __iter__(self) -> Iterator[bytes]:
            watch = self._watch
            try:
                for chunk in self._inner:
                    watch.watch(chunk)
                    yield chunk
            except BaseException as exc:
                watch.call.finish(exc)
                raise
            self._complete = True

        def close(self) -> None:
            try:
                self._inner.close()
            finally:
                self._watch.call.finish(
                    None, None if self._complete or self._watch.done else "closed_before_complete"
                )

    class AsyncTransport(httpx.AsyncBaseTransport):
        def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
            self._inner = inner

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            call = _begin(request)
            if call is None:
                return await self._inner.handle_async_request(request)
            try:
                response = await self._inner.handle_async_request(request)
            except BaseException as exc:
                call.finish(exc)
                raise
            try:
                call.first_byte()
                call.set_status_code(response.status_code)
                response.stream = AsyncStream(response.stream, _TokenWatch(call, _is_sse(response)))
            except Exception:
                _guard.fault("httpx.response")
                call.finish()
            return response

        async def aclose(self) -> None:
            await self._inner.aclose()

    class AsyncStream(httpx.AsyncByteStream):
        def __init__(self, inner: Any, watch: _TokenWatch) -> None:
            self._inner = inner
            self._watch = watch
            self._complete = False

        async def __aiter__(self) -> AsyncIterator[bytes]:
            watch = self._watch
            try:
                async for chunk in self._inner:
                    watch.watch(chunk)
                    yield chunk
            except BaseException as exc:
                watch.call.finish(exc)
                raise
            self._complete = True

        async def aclose(self) -> None:
            try:
                await self._inner.aclose()
            finally:
                self._watch.call.finish(
                    None, None if self._complete or self._watch.done else "closed_before_complete"
                )

    return SyncTransport, AsyncTransport
