"""The places the SDK reaches past OpenTelemetry's public API, each with a public fallback.

latscope runs on every OpenTelemetry in its declared range (``pyproject.toml``), so nothing here
may assume one version's internals: each shortcut is feature-checked, and when the check fails
(an older or newer SDK, another context runtime) the public API does the same job, a little
slower. Tests run both paths (``tests/test_sdk_compat.py``) and CI runs the SDK tests on the
lowest declared versions.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes

logger = logging.getLogger("latscope.sdk")

#: ``BoundedAttributes._setitem_locked`` (OpenTelemetry 1.3x+): stores a value without
#: re-validating it. None where this OpenTelemetry has no such method.
SETITEM_LOCKED: Any = getattr(BoundedAttributes, "_setitem_locked", None)


def set_trusted(span: trace.Span, key: str, value: tuple[int, ...]) -> None:
    """Set an attribute whose value the SDK built itself (a tuple of ints).

    ``set_attribute`` re-validates every element (about 100 ns each, more than recording the
    token did); on an SDK span whose attributes offer ``_setitem_locked`` this stores the tuple
    directly. Anything unexpected (another span type, a changed internal) takes the public path.
    """
    global SETITEM_LOCKED
    setitem = SETITEM_LOCKED
    if setitem is not None and span.is_recording():
        attrs = getattr(span, "_attributes", None)
        if type(attrs) is BoundedAttributes:
            try:
                with attrs._lock:
                    if not attrs._immutable and attrs.maxlen != 0:
                        setitem(attrs, key, value)
                        return
            except (AttributeError, TypeError):  # the internals changed: public API from now on
                SETITEM_LOCKED = None
                logger.debug("BoundedAttributes internals differ: set_attribute", exc_info=True)
    span.set_attribute(key, value)


def prefers_delta(exporter: object) -> bool:
    """Whether a metric exporter asked for delta histograms (else they are cumulative).

    OpenTelemetry's ``MetricExporter`` keeps its ``preferred_temporality`` argument as
    ``_preferred_temporality``, keyed by instrument class, and its own periodic reader reads it
    there; latscope's histograms honour it the same way. Anything else means cumulative, the
    OTLP default.
    """
    from opentelemetry.sdk.metrics import Histogram
    from opentelemetry.sdk.metrics.export import AggregationTemporality

    preferred = getattr(exporter, "_preferred_temporality", None)
    if not isinstance(preferred, dict):
        return False
    return preferred.get(Histogram) is AggregationTemporality.DELTA


def detach(token: object) -> None:
    """Restore the context ``token`` came from, quietly when it belongs to another Context.

    Frameworks that hop threads between the steps of a handler make that normal here, but
    ``opentelemetry.context.detach`` logs an ERROR for it. OpenTelemetry's default runtime
    context is a ``ContextVar`` whose tokens are ``contextvars.Token`` objects, so the token's own
    variable resets it (standard library only); any other runtime gets the public ``detach``.
    """
    if isinstance(token, contextvars.Token):
        # Another Context's token, or one already used: nothing of ours to restore there.
        with contextlib.suppress(ValueError, RuntimeError):
            token.var.reset(token)
        return
    otel_context.detach(token)  # type: ignore[arg-type]
