"""Server side: the ``@inference`` decorator, ``phase()``, token recording and ``set_usage()``.

One request is one ``_Request``; the active one lives in a context variable. Phases and the
decode token buffer hang off the request object rather than off more context variables, so a
streaming handler that yields inside a phase never trips over context-variable reset order.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import threading
from array import array
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator, Mapping
from typing import Any, ParamSpec, TypeVar, overload

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from latscope.sdk import _guard, _otel
from latscope.sdk._runtime import RT, end_span, warn_if_unconfigured
from latscope.sdk._runtime import now as _now
from latscope.semconv import (
    ClientAttributes,
    GenAIAttributes,
    HttpAttributes,
    LatscopeAttributes,
    Phase,
    ServerAttributes,
)

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

_GPU_PHASES = frozenset((Phase.PREFILL, Phase.DECODE))

# Internal faults go to ``_guard``'s one handler as ``except Exception: fault(site)``: every
# request runs these steps (see ``_guard``). Spans are ended in ``finally`` blocks outside them,
# so a fault in SDK code never leaves a span open.

#: ``RT.clock``, kept as a module global because ``record_token`` reads it per token.
_clock: Callable[[], int] = RT.clock


def set_clock(clock: Callable[[], int]) -> None:
    global _clock
    _clock = clock


#: Set by ``TraceparentMiddleware`` when a request arrives, so the server span starts there.
arrival_ns: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "latscope_arrival_ns", default=None
)
#: The ASGI scope of the request ``TraceparentMiddleware`` is serving: once the framework has
#: routed it, FastAPI's ``scope["route"]`` names the route template the span's ``http.route`` takes.
asgi_scope: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "latscope_asgi_scope", default=None
)


def _route(scope: Mapping[str, Any] | None) -> str | None:
    """The route template of a routed ASGI request (``/v1/items/{id}``, never the concrete path)."""
    route = getattr(scope.get("route"), "path", None) if scope is not None else None
    return route if isinstance(route, str) and route else None


class _Decode:
    """Token times of one decode phase: clock readings appended to an int64 array, up to
    ``cap``; tokens beyond it are counted (``over``) and only the last one's time is kept."""

    __slots__ = ("buf", "cap", "last", "over", "start")

    def __init__(self, start: int, cap: int) -> None:
        self.start = start
        self.buf = array("q")
        self.cap = cap
        self.over = 0
        self.last = 0

    @property
    def count(self) -> int:
        return len(self.buf) + self.over

    @property
    def last_time(self) -> int:
        return self.last if self.over else (self.buf[-1] if self.buf else self.start)


class _Request:
    __slots__ = (
        "ctx",
        "decode",
        "done",
        "first_token",
        "last_token",
        "output_set",
        "response_model",
        "span",
        "spec",
        "start",
        "tokens",
    )

    def __init__(self, span: trace.Span | None, start: int, spec: _Spec | None = None) -> None:
        self.span = span
        self.ctx = trace.set_span_in_context(span) if span is not None else None
        self.start = start
        self.decode: _Decode | None = None
        self.first_token = 0
        self.last_token = 0
        self.tokens = 0
        self.output_set = False
        self.done = False
        self.spec = spec
        self.response_model: str | None = None

    def note_tokens(self, first: int, last: int, count: int) -> None:
        if count <= 0:
            return
        if not self.first_token or first < self.first_token:
            self.first_token = first
        self.last_token = max(self.last_token, last)
        self.tokens += count


_active: contextvars.ContextVar[_Request | None] = contextvars.ContextVar(
    "latscope_request", default=None
)


# --------------------------------------------------------------------------------------------
# token recording (hot path)


def record_token() -> None:
    """Record that one output token was produced now; call once per token inside decode.

    Costs well under a microsecond: one context-variable read, one clock read and an append to
    an int64 array. Times land on the decode span as ``latscope.token_offsets_us``.

    Example::

        with phase("decode"):
            for tok in model.generate():
                record_token()
                yield tok
    """
    # The per-token hot path keeps a bare try (a ``with`` handler would cost two calls per
    # token); what it catches goes to the same internal-error record as every other site.
    try:
        req = _active.get()
        if req is not None:
            d = req.decode
            if d is not None:
                buf = d.buf
                if len(buf) < d.cap:
                    buf.append(_clock())
                else:
                    d.over += 1
                    d.last = _clock()
            else:  # a token outside decode (e.g. from prefill) still sets TTFT
                t = _clock()
                req.note_tokens(t, t, 1)
    except Exception:
        _guard.fault("record_token")


def traced_tokens(tokens: Iterable[T]) -> Iterator[T]:
    """Yield from ``tokens``, recording one token per item (see ``record_token``).

    Example::

        with phase("decode"):
            for tok in traced_tokens(model.generate()):
                ...
    """
    for item in tokens:
        record_token()
        yield item


async def atraced_tokens(tokens: AsyncIterable[T]) -> AsyncIterator[T]:
    """Async ``traced_tokens``: ``async for tok in atraced_tokens(stream): ...``."""
    async for item in tokens:
        record_token()
        yield item


def set_usage(
    *,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    response_model: str | None = None,
) -> None:
    """Set the current request's token usage (``gen_ai.usage.*``); a no-op outside a request.

    ``output_tokens`` defaults to the number of tokens recorded with ``record_token``.
    """
    try:
        req = _active.get()
        if req is None or req.span is None:
            return
        span = req.span
        if input_tokens is not None:
            span.set_attribute(GenAIAttributes.USAGE_INPUT_TOKENS, int(input_tokens))
        if output_tokens is not None:
            span.set_attribute(GenAIAttributes.USAGE_OUTPUT_TOKENS, int(output_tokens))
            req.output_set = True
        if response_model is not None:
            span.set_attribute(GenAIAttributes.RESPONSE_MODEL, response_model)
            req.response_model = str(response_model)
    except Exception:
        _guard.fault("set_usage")


def current_span() -> trace.Span:
    """The current request's server span (a non-recording span outside a request)."""
    req = _active.get()
    if req is None or req.span is None:
        return trace.INVALID_SPAN
    return req.span


# --------------------------------------------------------------------------------------------
# phases


#: One entry into a ``phase``, what its exit needs: (span, request, the decode buffer it replaced,
#: the context token when the phase set the request itself, GPU reading at start, owner). A phase
#: object entered by several tasks at once (one object reused) keeps one run per entry, so each
#: entry's span ends; the owner (``_owner()``) tells them apart, None for an entry made alone.
#: A tuple: one is built per phase, and a class instance costs a call more.
_PhaseRun = tuple[
    trace.Span,
    _Request | None,
    _Decode | None,
    contextvars.Token[_Request | None] | None,
    Any,
    object,
]


def _owner() -> object:
    """Who is entering or leaving a phase: the asyncio task, else the request, else the thread.

    A sync generator's steps may run on different worker threads, hence the request before the
    thread.
    """
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running event loop in this thread
        pass
    req = _active.get()
    return req if req is not None else threading.get_ident()


class phase:
    """A phase of the current request, as a context manager or a decorator.

    ``name`` is one of queue, preprocess, prefill, decode, postprocess. Phase spans are
    children of the request's server span and carry ``latscope.phase``; prefill and decode get
    GPU figures when NVML is on. One ``phase`` object may be entered again, also by several
    tasks at once: each entry is its own span.

    Example::

        with phase("prefill"):
            logits = model.prefill(prompt)

        @phase("preprocess")
        def tokenize(text): ...
    """

    __slots__ = ("_name", "_runs")

    def __init__(self, name: str) -> None:
        if name not in Phase.ALL:
            raise ValueError(
                f"unknown phase {name!r}: use one of {', '.join(map(repr, Phase.ALL))}"
            )
        self._name = name
        self._runs: list[_PhaseRun] = []

    def __enter__(self) -> phase:
        if not RT.enabled:
            warn_if_unconfigured()
            return self
        name = self._name
        span = req = prev = own = gpu = None
        try:
            start = _clock()
            req = _active.get()
            span = RT.tracer.start_span(
                name,
                context=req.ctx if req is not None else None,
                attributes={LatscopeAttributes.PHASE: name},
                start_time=start,
            )
            if name == Phase.DECODE:
                if req is None:  # a decode phase outside @inference still collects tokens
                    req = _Request(None, start)
                    own = _active.set(req)
                prev = req.decode
                req.decode = _Decode(start, RT.token_cap)
            monitor = RT.gpu
            if monitor is not None and name in _GPU_PHASES:
                gpu = monitor.begin()
        except Exception:
            _guard.fault("phase.enter")
        if span is not None:  # even after a fault above: the exit must end this span
            runs = self._runs
            runs.append((span, req, prev, own, gpu, _owner() if runs else None))
        return self

    def _take(self) -> _PhaseRun | None:
        """The run this exit closes: the only one, else the caller's own, else the first."""
        runs = self._runs
        if len(runs) <= 1:
            return runs.pop() if runs else None
        owner = _owner()
        mine = next((r for r in reversed(runs) if r[5] == owner), None)
        if mine is None:  # the first entry, made while no other was active, records no owner
            mine = next((r for r in runs if r[5] is None), runs[-1])
        try:
            runs.remove(mine)
        except ValueError:  # another thread took it meanwhile: take what is left
            return runs.pop() if runs else None
        return mine

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        runs = self._runs
        run = runs.pop() if len(runs) == 1 else self._take()
        if run is None:
            return
        span, req, prev, own, gpu, _ = run
        end = _now()
        try:
            if self._name == Phase.DECODE and req is not None and req.decode is not None:
                d = req.decode
                req.decode = prev
                _flush_tokens(span, d)
                if req.span is not None:
                    req.note_tokens(d.buf[0] if d.buf else d.last, d.last_time, d.count)
            if gpu is not None and RT.gpu is not None:
                span.set_attributes(RT.gpu.end(gpu))
            if exc is not None:
                _mark_error(span, exc)
        except Exception:
            _guard.fault("phase.exit")
        finally:
            if own is not None:
                _reset(_active, own, None, "phase.reset")
            end_span(span, end)

    async def __aenter__(self) -> phase:
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(exc_type, exc, tb)

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        name = self._name
        kind = _kind(fn)
        if kind == _AGEN:

            @functools.wraps(fn)
            async def agen_wrapper(*args: Any, **kwargs: Any) -> Any:
                with phase(name):
                    async for item in fn(*args, **kwargs):  # type: ignore[attr-defined]
                        yield item

            return agen_wrapper
        if kind == _GEN:

            @functools.wraps(fn)
            def gen_wrapper(*args: Any, **kwargs: Any) -> Any:
                with phase(name):
                    return (yield from fn(*args, **kwargs))  # type: ignore[misc]

            return gen_wrapper
        if kind == _ASYNC:

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with phase(name):
                    return await fn(*args, **kwargs)  # type: ignore[misc]

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with phase(name):
                return fn(*args, **kwargs)

        return wrapper


_SYNC, _ASYNC, _GEN, _AGEN = "sync", "async", "generator", "async generator"


def _kind(fn: Callable[..., Any]) -> str:
    """Sync, async, generator or async generator; a callable object is what its ``__call__`` is
    (``inspect`` judges only functions, so ``async def __call__`` would pass for sync)."""
    target: Any = fn
    if not (inspect.isfunction(fn) or inspect.ismethod(fn) or isinstance(fn, functools.partial)):
        call = getattr(fn, "__call__", None)  # noqa: B004 - the method itself is inspected
        if inspect.isfunction(call) or inspect.ismethod(call):
            target = call
    if inspect.isasyncgenfunction(target):
        return _AGEN
    if inspect.isgeneratorfunction(target):
        return _GEN
    if inspect.iscoroutinefunction(target):
        return _ASYNC
    return _SYNC


def _flush_tokens(span: trace.Span, d: _Decode) -> None:
    """Convert the buffered clock readings to µs offsets once, at the decode span's end."""
    start = d.start
    if d.over:
        span.set_attributes(
            {LatscopeAttributes.TOKEN_COUNT: d.count, ServerAttributes.TOKENS_NOT_TIMED: d.over}
        )
    else:
        span.set_attribute(LatscopeAttributes.TOKEN_COUNT, d.count)
    if d.buf:
        _otel.set_trusted(
            span, LatscopeAttributes.TOKEN_OFFSETS_US, tuple([(t - start) // 1000 for t in d.buf])
        )


def _mark_error(span: trace.Span, exc: BaseException) -> None:
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return
    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
    span.record_exception(exc)


def _reset(
    var: contextvars.ContextVar[Any], token: contextvars.Token[Any], fallback: Any, site: str
) -> None:
    try:
        var.reset(token)
    except (ValueError, RuntimeError):  # another Context (a framework hopped threads): restore
        var.set(fallback)
    except Exception:
        _guard.fault(site)


# --------------------------------------------------------------------------------------------
# @inference


class _Spec:
    """What ``@inference`` works out once, at decoration time."""

    __slots__ = ("attrs", "metric_attrs", "metric_key", "name")

    def __init__(self, name: str, attrs: dict[str, Any], metric_attrs: dict[str, Any]) -> None:
        self.name = name
        self.attrs = attrs
        self.metric_attrs = metric_attrs
        self.metric_key = frozenset(metric_attrs.items())  # the histograms' series key


def _start(spec: _Spec) -> _Request | None:
    if not RT.enabled:
        warn_if_unconfigured()
        return None
    try:
        arrived = arrival_ns.get()
        if arrived is not None and _active.get() is None:
            start = arrived
            arrival_ns.set(None)  # a second handler in the same request starts when it starts
        else:
            start = _clock()
        span = RT.tracer.start_span(
            spec.name, kind=SpanKind.SERVER, attributes=spec.attrs, start_time=start
        )
        try:
            route = _route(asgi_scope.get())
            if route is not None and HttpAttributes.ROUTE not in spec.attrs:
                span.set_attribute(HttpAttributes.ROUTE, route)
            return _Request(span, start, spec)
        except BaseException:
            end_span(span, None)
            raise
    except Exception:
        _guard.fault("inference.start")
    return None


def _enter(req: _Request) -> tuple[Any, Any]:
    t_req = t_ctx = None
    try:
        t_req = _active.set(req)
        t_ctx = otel_context.attach(req.ctx)  # type: ignore[arg-type]
    except Exception:
        _guard.fault("inference.enter")
    return t_req, t_ctx


def _exit(tokens: tuple[Any, Any]) -> None:
    t_req, t_ctx = tokens
    if t_ctx is not None:
        try:
            _otel.detach(t_ctx)
        except Exception:
            _guard.fault("inference.exit")
    if t_req is not None:
        _reset(_active, t_req, None, "inference.exit")


def _finish(req: _Request, exc: BaseException | None = None, end: str | None = None) -> None:
    span = req.span
    if span is None or req.done:
        return
    req.done = True
    t_end = _now()
    try:
        attrs: dict[str, Any] = {}
        if req.tokens:
            attrs[LatscopeAttributes.FIRST_TOKEN_NS] = req.first_token
            attrs[ServerAttributes.TTFT_NS] = req.first_token - req.start
            if req.tokens > 1:
                attrs[ServerAttributes.TPOT_NS] = (req.last_token - req.first_token) // (
                    req.tokens - 1
                )
            if not req.output_set:
                attrs[GenAIAttributes.USAGE_OUTPUT_TOKENS] = req.tokens
        if end is not None:
            attrs[LatscopeAttributes.STREAM_END] = end
        if attrs:
            span.set_attributes(attrs)
        if exc is not None:
            _mark_error(span, exc)
    except Exception:
        _guard.fault("inference.finish")
    finally:
        end_span(span, t_end)
    metrics = RT.metrics
    if metrics is not None and t_end is not None and req.spec is not None:
        try:
            _record_metrics(metrics, req, t_end, exc, end)
        except Exception:
            _guard.fault("metrics.record")


def _record_metrics(
    metrics: Any, req: _Request, t_end: int, exc: BaseException | None, end: str | None
) -> None:
    """``gen_ai.server.*``: the duration of every request; TTFT and TPOT of successful ones."""
    spec = req.spec
    assert spec is not None
    attrs: Mapping[str, Any] = spec.metric_attrs
    key: frozenset[Any] | None = spec.metric_key
    if req.response_model is not None:
        attrs = {**attrs, GenAIAttributes.RESPONSE_MODEL: req.response_model}
        key = None
    if exc is not None and not isinstance(exc, asyncio.CancelledError | GeneratorExit):
        attrs = {**attrs, ClientAttributes.ERROR_TYPE: type(exc).__qualname__}
        key = None
    ttft = tpot = None
    if exc is None and end is None and req.tokens:
        ttft = req.first_token - req.start
        if req.tokens > 1:
            tpot = (req.last_token - req.first_token) // (req.tokens - 1)
    metrics.server(attrs, t_end - req.start, ttft, tpot, key)


@overload
def inference(fn: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def inference(
    *,
    model: str | None = None,
    operation: str = "chat",
    name: str | None = None,
    provider: str | None = None,
    system: str | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def inference(
    fn: Callable[P, R] | None = None,
    /,
    *,
    model: str | None = None,
    operation: str = "chat",
    name: str | None = None,
    provider: str | None = None,
    system: str | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> Any:
    """Make each call of the handler one SERVER span: a request, with its phases and tokens.

    Works bare or with arguments, on sync, async, generator and async-generator functions and on
    callable objects (an ``async def __call__`` is traced as async). A streaming handler's span
    ends when the stream is exhausted or closed; an early close is recorded as
    ``latscope.stream.end = "client_disconnect"`` and a cancellation as ``"cancelled"``; a
    handler returning a streaming response (Starlette's ``body_iterator``) lasts until its body
    is sent. The parent comes from the incoming ``traceparent`` when ``TraceparentMiddleware``
    (or ``extract_context``) put it in the context. ``provider`` is the GenAI semantic
    conventions' ``gen_ai.provider.name`` (``system`` is its deprecated spelling); each call also
    feeds the ``gen_ai.server.*`` histograms.

    Example::

        @inference(model="llama-3-8b")
        async def generate(prompt: str): ...
    """
    if fn is None:
        if not isinstance(operation, str) or not operation:
            raise ValueError('operation must be a non-empty string such as "chat"')
        if model is not None and not isinstance(model, str):
            raise ValueError("model must be a string such as 'llama-3-8b'")
        return functools.partial(
            inference,
            model=model,
            operation=operation,
            name=name,
            provider=provider,
            system=system,
            attributes=attributes,
        )
    if not callable(fn):
        raise ValueError(
            "@inference decorates a function: write @inference or @inference(model=...)"
        )
    if name is None and model is None:
        fn_name = getattr(fn, "__name__", None)
        if not isinstance(fn_name, str):
            raise ValueError(
                f"@inference cannot name the span of {fn!r}: it has no __name__. Give it a name "
                "or a model: sdk.inference(name='chat my-model')(handler) or "
                "sdk.inference(model='my-model')(handler)"
            )
        name = f"{operation} {fn_name}"
    provider = provider if provider is not None else system
    metric_attrs: dict[str, Any] = {GenAIAttributes.OPERATION_NAME: operation}
    if provider is not None:
        metric_attrs[GenAIAttributes.PROVIDER_NAME] = provider
    if model is not None:
        metric_attrs[GenAIAttributes.REQUEST_MODEL] = model
    attrs: dict[str, Any] = {**dict(attributes or {}), **metric_attrs}
    spec = _Spec(name or f"{operation} {model}", attrs, metric_attrs)

    kind = _kind(fn)
    if kind == _AGEN:
        wrapper = _wrap_async_gen(fn, spec)
    elif kind == _GEN:
        wrapper = _wrap_gen(fn, spec)
    elif kind == _ASYNC:
        wrapper = _wrap_async(fn, spec)
    else:
        wrapper = _wrap_sync(fn, spec)
    return functools.wraps(fn)(wrapper)


def _wrap_sync(fn: Callable[..., Any], spec: _Spec) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        req = _start(spec)
        if req is None:
            return fn(*args, **kwargs)
        tokens = _enter(req)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            _exit(tokens)
            _finish(req, exc)
            raise
        _exit(tokens)
        if not _defer_to_body(req, result):
            _finish(req)
        return result

    return wrapper


def _wrap_async(fn: Callable[..., Any], spec: _Spec) -> Callable[..., Any]:
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        req = _start(spec)
        if req is None:
            return await fn(*args, **kwargs)
        tokens = _enter(req)
        try:
            result = await fn(*args, **kwargs)
        except asyncio.CancelledError as exc:
            _exit(tokens)
            _finish(req, exc, ServerAttributes.END_CANCELLED)
            raise
        except BaseException as exc:
            _exit(tokens)
            _finish(req, exc)
            raise
        _exit(tokens)
        if not _defer_to_body(req, result):
            _finish(req)
        return result

    return wrapper


def _defer_to_body(req: _Request, result: Any) -> bool:
    """A returned streaming response (Starlette's ``body_iterator``): the request lasts until
    its body is sent, so end the span then rather than when the handler returned."""
    try:
        body = getattr(result, "body_iterator", None)
        if body is None or not hasattr(body, "__anext__"):
            return False
        result.body_iterator = _drive_body(req, body)
        return True
    except Exception:
        _guard.fault("inference.body")
    return False


async def _drive_body(req: _Request, body: Any) -> AsyncIterator[Any]:
    while True:
        tokens = _enter(req)
        try:
            item = await body.__anext__()
        except StopAsyncIteration:
            _finish(req)
            return
        except asyncio.CancelledError as exc:
            _finish(req, exc, ServerAttributes.END_CANCELLED)
            raise
        except BaseException as exc:
            _finish(req, exc)
            raise
        finally:
            _exit(tokens)
        try:
            yield item
        except GeneratorExit:
            try:
                if hasattr(body, "aclose"):
                    await body.aclose()
            finally:
                _finish(req, None, ServerAttributes.END_CLIENT_DISCONNECT)
            raise


def _wrap_gen(fn: Callable[..., Any], spec: _Spec) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        req = _start(spec)
        if req is None:
            return (yield from fn(*args, **kwargs))
        # The generator runs every step in a Context of its own: frameworks step sync
        # generators from worker threads, each in a fresh copy of the caller's context.
        ctx = contextvars.copy_context()
        ctx.run(_enter, req)
        try:
            gen = ctx.run(fn, *args, **kwargs)
        except BaseException as exc:
            _finish(req, exc)
            raise
        step: Callable[..., Any] = gen.__next__
        arg: tuple[Any, ...] = ()
        while True:
            try:
                item = ctx.run(step, *arg)
            except StopIteration as stop:
                _finish(req)
                return stop.value
            except BaseException as exc:
                _finish(req, exc)
                raise
            try:
                sent = yield item
            except GeneratorExit:
                try:
                    ctx.run(gen.close)
                finally:
                    _finish(req, None, ServerAttributes.END_CLIENT_DISCONNECT)
                raise
            except BaseException as exc:
                step, arg = gen.throw, (exc,)
                continue
            step, arg = (gen.__next__, ()) if sent is None else (gen.send, (sent,))

    return wrapper


def _wrap_async_gen(fn: Callable[..., Any], spec: _Spec) -> Callable[..., Any]:
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        req = _start(spec)
        if req is None:
            async for item in fn(*args, **kwargs):
                yield item
            return
        tokens = _enter(req)
        try:
            agen = fn(*args, **kwargs)
        finally:
            _exit(tokens)
        step: Callable[..., Any] = agen.__anext__
        arg: tuple[Any, ...] = ()
        while True:
            # Set and reset around each step: between steps the caller's context stays clean.
            tokens = _enter(req)
            try:
                item = await step(*arg)
            except StopAsyncIteration:
                _finish(req)
                return
            except asyncio.CancelledError as exc:
                _finish(req, exc, ServerAttributes.END_CANCELLED)
                raise
            except BaseException as exc:
                _finish(req, exc)
                raise
            finally:
                _exit(tokens)
            try:
                sent = yield item
            except GeneratorExit:
                tokens = _enter(req)
                try:
                    await agen.aclose()
                finally:
                    _exit(tokens)
                    _finish(req, None, ServerAttributes.END_CLIENT_DISCONNECT)
                raise
            except BaseException as exc:
                step, arg = agen.athrow, (exc,)
                continue
            step, arg = (agen.__anext__, ()) if sent is None else (agen.asend, (sent,))

    return wrapper
