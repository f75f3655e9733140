"""Client side: ``client_call()`` and ``instrument_httpx()``.

A CLIENT span per call, ``traceparent`` injected into the outgoing headers, and the times the
first byte, the first token and the last byte of the response were seen (``latscope.first_*_ns``
attributes, on the client's clock). The span ends when the response is complete or closed.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import AsyncIterator, Iterator, Mapping, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from latscope.sdk import _guard
from latscope.sdk._propagation import PROPAGATOR
from latscope.sdk._runtime import RT, end_span, now, warn_if_unconfigured
from latscope.semconv import ClientAttributes, GenAIAttributes, HttpAttributes, LatscopeAttributes

#: Bytes of a streamed body scanned for the first SSE token; beyond it any data counts.
_SSE_SCAN_LIMIT = 64 * 1024
#: Largest JSON body (request or response) read for the model name or the token usage.
_JSON_SCAN_LIMIT = 1024 * 1024
#: OpenAI-style endpoints (what vLLM, SGLang, TGI and most gateways serve), by path suffix, and
#: the ``gen_ai.operation.name`` each stands for. Only these get the ``gen_ai.client.*`` metrics
#: and the ``gen_ai.*`` span attributes when traced through ``instrument_httpx``.
_GENAI_PATHS = (
    ("/chat/completions", "chat"),
    ("/completions", "text_completion"),
    ("/embeddings", "embeddings"),
)
#: ``gen_ai.provider.name`` for those endpoints: the conventions name the API flavour spoken
#: (OpenAI's), whoever serves it.
_OPENAI = "openai"
# A top-level-looking ``"model": "..."`` in a JSON request body; quotes inside JSON strings are
# escaped, so message text cannot match. A search, not a parse: prompts can be large.
_MODEL_KEY = re.compile(rb'"model"\s*:\s*"((?:[^"\\]|\\.){1,256})"')

# Every call runs these steps, so faults are caught with ``except Exception: fault(site)``
# rather than a ``with`` handler (see ``_guard``); the span is ended in a ``finally`` block.


class ClientCall:
    """One outgoing call: a CLIENT span; use via ``client_call()``.

    ``headers`` is the mapping you passed, now carrying ``traceparent``. Call ``first_byte()``
    and ``first_token()`` as the response arrives (later calls are ignored), ``set_usage()``
    when the token counts are known, ``finish()`` (or leave the ``with`` block) when it is
    complete.
    """

    __slots__ = (
        "_done",
        "_first_byte",
        "_first_token",
        "_input_tokens",
        "_metric_attrs",
        "_output_tokens",
        "_start",
        "headers",
        "span",
    )

    def __init__(
        self,
        span: trace.Span | None,
        headers: MutableMapping[str, str],
        start: int = 0,
        metric_attrs: dict[str, Any] | None = None,
    ) -> None:
        self.span = span
        self.headers = headers
        self._first_byte = 0
        self._first_token = 0
        self._done = span is None
        self._start = start
        self._metric_attrs = metric_attrs
        self._input_tokens: int | None = None
        self._output_tokens: int | None = None

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

    def set_usage(
        self, *, input_tokens: int | None = None, output_tokens: int | None = None
    ) -> None:
        """The call's token counts (``gen_ai.usage.*``; also ``gen_ai.client.token.usage``)."""
        if self._done:
            return
        try:
            span = self.span
            assert span is not None
            if input_tokens is not None:
                self._input_tokens = int(input_tokens)
                span.set_attribute(GenAIAttributes.USAGE_INPUT_TOKENS, self._input_tokens)
            if output_tokens is not None:
                self._output_tokens = int(output_tokens)
                span.set_attribute(GenAIAttributes.USAGE_OUTPUT_TOKENS, self._output_tokens)
        except Exception:
            _guard.fault("client.usage")

    def finish(self, exc: BaseException | None = None, end: str | None = None) -> None:
        """The response is complete (or failed with ``exc``); ends the span once."""
        if self._done:
            return
        self._done = True
        span = self.span
        assert span is not None
        t = now()
        try:
            if self._first_byte and t is not None:
                span.set_attribute(ClientAttributes.LAST_BYTE_NS, t)
            if end is not None:
                span.set_attribute(LatscopeAttributes.STREAM_END, end)
            if exc is not None:
                span.set_attribute(ClientAttributes.ERROR_TYPE, type(exc).__name__)
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        except Exception:
            _guard.fault("client.finish")
        finally:
            end_span(span, t)
        metrics = RT.metrics
        if metrics is not None and self._metric_attrs is not None and t is not None:
            try:
                attrs = self._metric_attrs
                if exc is not None:
                    attrs = {**attrs, ClientAttributes.ERROR_TYPE: type(exc).__qualname__}
                metrics.client(attrs, t - self._start, self._input_tokens, self._output_tokens)
            except Exception:
                _guard.fault("metrics.record")

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
    operation: str = "chat",
    provider: str | None = None,
    name: str | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> ClientCall:
    """Start a CLIENT span for one GenAI call and inject ``traceparent`` into ``headers``.

    Each call also feeds the ``gen_ai.client.operation.duration`` histogram (and
    ``gen_ai.client.token.usage`` once ``set_usage`` gave the counts), labelled with
    ``operation`` and ``provider`` (``gen_ai.provider.name``, e.g. ``"openai"``).

    Example::

        headers = {}
        with client_call("POST", url, headers=headers, model="llama-3-8b") as call:
            for chunk in send(url, headers=headers):
                call.first_token()
    """
    carrier: MutableMapping[str, str] = {} if headers is None else headers
    if not RT.enabled:
        warn_if_unconfigured()
        return ClientCall(None, carrier)
    try:
        return _start_call(method, url, carrier, model, name, attributes, operation, provider)
    except Exception:
        _guard.fault("client_call")
    return ClientCall(None, carrier)


def _start_call(
    method: str,
    url: str | None,
    carrier: MutableMapping[str, str],
    model: str | None,
    name: str | None,
    attributes: Mapping[str, Any] | None,
    operation: str | None,
    provider: str | None,
) -> ClientCall:
    """The CLIENT span of one call; GenAI calls (``operation`` set) also get metric labels."""
    attrs: dict[str, Any] = dict(attributes or {})
    attrs[HttpAttributes.REQUEST_METHOD] = method
    path = ""
    metric_attrs: dict[str, Any] | None = None
    if operation is not None:
        metric_attrs = {GenAIAttributes.OPERATION_NAME: operation}
        if provider is not None:
            metric_attrs[GenAIAttributes.PROVIDER_NAME] = provider
        if model:
            metric_attrs[GenAIAttributes.REQUEST_MODEL] = model
    if url:
        parts = urlsplit(url)
        path = parts.path or "/"
        attrs[ClientAttributes.URL_FULL] = url
        attrs[HttpAttributes.URL_PATH] = path
        host, port = parts.hostname, parts.port
        if host:
            attrs[ClientAttributes.SERVER_ADDRESS] = host
            if metric_attrs is not None:
                metric_attrs[ClientAttributes.SERVER_ADDRESS] = host
                metric_attrs[ClientAttributes.SERVER_PORT] = port or (
                    443 if parts.scheme == "https" else 80
                )
        if port:
            attrs[ClientAttributes.SERVER_PORT] = port
    if metric_attrs is not None:
        attrs.update(metric_attrs)
    start = RT.clock()
    span = RT.tracer.start_span(
        name or f"{method} {path}".strip(), kind=SpanKind.CLIENT, attributes=attrs, start_time=start
    )
    try:
        PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        return ClientCall(span, carrier, start, metric_attrs)
    except BaseException:
        span.end()
        raise


# --------------------------------------------------------------------------------------------
# first-token detection in a streamed body


class _TokenWatch:
    """Reads a response body as it passes: the first token (the first SSE ``data:`` event
    carrying content; OpenAI-style chunks whose delta is empty do not count; any bytes when not
    SSE), and for GenAI calls the token usage (an SSE event with ``usage``, or a JSON body's)."""

    __slots__ = ("_buf", "_json", "_json_size", "_scanned", "call", "done", "sse", "usage")

    def __init__(self, call: ClientCall, sse: bool, usage: bool = False, json_body: bool = False):
        self.call = call
        self.sse = sse
        self.usage = usage
        self.done = False
        self._buf = b""
        self._scanned = 0
        # A JSON (non-streamed) GenAI answer is kept, bounded, to read its usage at the end.
        self._json: list[bytes] | None = [] if usage and json_body and not sse else None
        self._json_size = 0

    def watch(self, chunk: bytes) -> None:
        """Per chunk: first token until found; then the SSE usage event and end marker."""
        try:
            if not self.call._first_token:
                self.feed(chunk)
            elif self.usage and self.sse and b'"usage"' in chunk:
                self._sse_usage(chunk)
            if self._json is not None:
                self._json_size += len(chunk)
                if self._json_size > _JSON_SCAN_LIMIT:
                    self._json = None
                else:
                    self._json.append(chunk)
            # OpenAI-style streams end with ``data: [DONE]``; clients stop reading there.
            if self.sse and b"[DONE]" in chunk:
                self.done = True
        except Exception:
            self.sse = False  # stop parsing; any further bytes count as the token
            _guard.fault("client.watch")

    def complete(self) -> None:
        """The body was read to its end: a JSON answer's usage, if it has one."""
        body, self._json = self._json, None
        if body:
            try:
                payload = json.loads(b"".join(body))
                if isinstance(payload, dict):
                    _set_usage(self.call, payload)
            except Exception:
                _guard.fault("client.watch")

    def _sse_usage(self, chunk: bytes) -> None:
        for event in chunk.replace(b"\r\n", b"\n").split(b"\n\n"):
            if b'"usage"' not in event:
                continue
            data = b"".join(
                line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")
            )
            try:
                payload = json.loads(data)
            except ValueError:  # cut across two chunks: best effort, the span stays right
                continue
            if isinstance(payload, dict):
                _set_usage(self.call, payload)

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
        for i, event in enumerate(events):
            if _event_has_token(event):
                call.first_token()
                self._buf = b""
                if self.usage:  # a short answer may carry its usage in the same chunk
                    for rest in events[i + 1 :]:
                        if b'"usage"' in rest:
                            self._sse_usage(rest)
                return
        if self._scanned > _SSE_SCAN_LIMIT:  # bounded: stop looking, count what arrived
            call.first_token()
            self._buf = b""


def _set_usage(call: ClientCall, payload: dict[str, Any]) -> None:
    """OpenAI's ``usage`` (prompt/completion tokens) or the newer input/output spelling."""
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return
    inp = usage.get("prompt_tokens", usage.get("input_tokens"))
    out = usage.get("completion_tokens", usage.get("output_tokens"))
    call.set_usage(
        input_tokens=inp if isinstance(inp, int) else None,
        output_tokens=out if isinstance(out, int) else None,
    )


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
        warn_if_unconfigured()
        return None
    try:
        url = request.url
        operation = _genai_operation(url.path)
        model = _request_model(request) if operation is not None else None
        return _start_call(
            request.method,
            str(url),
            request.headers,
            model,
            None,
            None,
            operation,
            _OPENAI if operation is not None else None,
        )
    except Exception:
        _guard.fault("httpx.begin")
    return None


def _genai_operation(path: str) -> str | None:
    """The ``gen_ai.operation.name`` an OpenAI-style endpoint path stands for, else None."""
    path = path.rstrip("/")
    for suffix, operation in _GENAI_PATHS:
        if path.endswith(suffix):
            return operation
    return None


def _request_model(request: Any) -> str | None:
    """``model`` from a JSON request body already in memory (a streamed body is not read)."""
    if "json" not in request.headers.get("content-type", ""):
        return None
    try:
        content = request.content
    except Exception:  # httpx.RequestNotRead: a streamed request body
        return None
    if not content or len(content) > _JSON_SCAN_LIMIT:
        return None
    found = _MODEL_KEY.search(content)
    if found is None:
        return None
    try:
        return str(json.loads(b'"' + found.group(1) + b'"'))
    except ValueError:
        return None


def _watch_body(call: ClientCall, response: Any, stream: type) -> None:
    """Headers are in: note the first byte and status, and read the body as it passes through
    ``stream`` (httpx's sync or async byte stream). Without that wrapper the call ends now."""
    wrapped = False
    try:
        call.first_byte()
        call.set_status_code(response.status_code)
        response.stream = stream(response.stream, _watch(call, response))
        wrapped = True
    except Exception:
        _guard.fault("httpx.response")
    finally:
        if not wrapped:
            call.finish()


def _watch(call: ClientCall, response: Any) -> _TokenWatch:
    # A compressed body cannot be scanned before httpx decodes it: then any bytes count, and a
    # JSON answer's usage is not read.
    headers = response.headers
    identity = headers.get("content-encoding", "identity").lower() == "identity"
    content_type = headers.get("content-type", "")
    if call._metric_attrs is not None and call.span is not None:
        # A GenAI call answered as a stream or not: a call made without streaming has no first
        # token the caller saw, and stays out of TTFT figures (docs/attribution.md).
        try:
            call.span.set_attribute(
                GenAIAttributes.REQUEST_STREAM, content_type.startswith("text/event-stream")
            )
        except Exception:
            _guard.fault("client.watch")
    return _TokenWatch(
        call,
        sse=identity and content_type.startswith("text/event-stream"),
        usage=call._metric_attrs is not None,
        json_body=identity and "json" in content_type,
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
            _watch_body(call, response, SyncStream)
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
            watch.complete()

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
            _watch_body(call, response, AsyncStream)
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
            watch.complete()

        async def aclose(self) -> None:
            try:
                await self._inner.aclose()
            finally:
                self._watch.call.finish(
                    None, None if self._complete or self._watch.done else "closed_before_complete"
                )

    return SyncTransport, AsyncTransport
