"""W3C trace context in and out: ``extract_context`` and ``TraceparentMiddleware``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from latscope.sdk import _guard, _otel
from latscope.sdk._runtime import RT, force_flush, warn_if_unconfigured
from latscope.sdk._server import arrival_ns, asgi_scope

PROPAGATOR = TraceContextTextMapPropagator()


class _HeaderGetter(Getter[Mapping[str, str]]):
    """Case-insensitive lookup: HTTP header names are, whatever the mapping does."""

    def get(self, carrier: Mapping[str, str], key: str) -> list[str] | None:
        value = carrier.get(key)
        if value is None:
            low = key.lower()
            for k, v in carrier.items():
                if k.lower() == low:
                    value = v
                    break
        if value is None:
            return None
        return [value] if isinstance(value, str) else list(value)

    def keys(self, carrier: Mapping[str, str]) -> list[str]:
        return list(carrier.keys())


_GETTER = _HeaderGetter()


def extract_context(headers: Mapping[str, str] | Iterable[tuple[bytes, bytes]]) -> Context:
    """The trace context carried by ``traceparent`` / ``tracestate`` in ``headers``.

    Accepts a mapping (any case) or ASGI-style ``[(b"name", b"value"), ...]``. Returns the
    current context unchanged when there is no valid ``traceparent``; never raises.

    Example::

        token = opentelemetry.context.attach(extract_context(request.headers))
    """
    try:  # per request: ``except`` rather than a ``with`` handler (see ``_guard``)
        if not isinstance(headers, Mapping):
            headers = {
                k.decode("latin-1").lower(): v.decode("latin-1")
                for k, v in headers
                if k.lower() in (b"traceparent", b"tracestate")
            }
        return PROPAGATOR.extract(headers, getter=_GETTER)
    except Exception:
        _guard.fault("extract_context")
    return otel_context.get_current()


def inject_context(headers: MutableMapping[str, str], context: Context | None = None) -> None:
    """Write ``traceparent`` / ``tracestate`` for ``context`` (default: current) into headers."""
    PROPAGATOR.inject(headers, context=context)


class TraceparentMiddleware:
    """ASGI middleware: each HTTP request runs in the trace context its ``traceparent`` carries.

    Also notes the arrival time, so an ``@inference`` handler's span starts when the request
    arrived rather than when the framework got round to calling it, and the request's ASGI scope,
    so the span's ``http.route`` is the framework's route template, and flushes queued spans
    when the server shuts down gracefully (uvicorn re-raises SIGTERM after its shutdown, which
    skips ``atexit``).

    Example::

        app = FastAPI()
        app.add_middleware(TraceparentMiddleware)
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        kind = scope.get("type")
        if kind == "lifespan":
            await self.app(scope, receive, _flush_on_shutdown(send))
            return
        if kind != "http" or not RT.enabled:
            if kind == "http":
                warn_if_unconfigured()
            await self.app(scope, receive, send)
            return
        ctx_token = t_token = s_token = None
        try:
            t_token = arrival_ns.set(RT.clock())
            s_token = asgi_scope.set(scope)
            carrier = {}
            for k, v in scope.get("headers") or ():
                if k in (b"traceparent", b"tracestate"):
                    carrier[k.decode("latin-1")] = v.decode("latin-1")
            if carrier:
                ctx_token = otel_context.attach(PROPAGATOR.extract(carrier, getter=_GETTER))
        except Exception:
            _guard.fault("middleware")
        try:
            await self.app(scope, receive, send)
        finally:
            try:
                if ctx_token is not None:
                    _otel.detach(ctx_token)
            except Exception:
                _guard.fault("middleware.exit")
            try:
                if t_token is not None:
                    arrival_ns.reset(t_token)
                if s_token is not None:
                    asgi_scope.reset(s_token)
            except Exception:
                _guard.fault("middleware.exit")


def _flush_on_shutdown(send: Any) -> Any:
    async def wrapped(message: MutableMapping[str, Any]) -> None:
        if message.get("type") == "lifespan.shutdown.complete" and RT.enabled:
            # Blocking is fine here: the server is no longer serving. Bounded by the export timeout.
            force_flush(RT.options.export.timeout_s)
        await send(message)

    return wrapped
