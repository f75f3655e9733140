"""Answers about one request: its attribution, its spans as a waterfall, its token timeline.

Each function reads the request's spans from the store and returns the JSON shape the REST API
serves (milliseconds as floats); the CLI's direct mode and the gRPC service call the same ones.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Any

from latscope.api.errors import InvalidParameter, NotFound
from latscope.attribution import RequestAttribution, SpanRecord, attribute_trace, load_trace
from latscope.attribution.engine import DEFAULT_STALL_NS
from latscope.semconv import LatscopeAttributes, Phase, SpanKind
from latscope.storage import Store

_TRACE_ID = re.compile(r"^[0-9a-fA-F]{32}$")
#: The attributor's default stall threshold; the API passes the configured one
#: (``--stall-threshold-ms``) so the timeline and the stored ``stalls`` count agree.
DEFAULT_STALL_MS = DEFAULT_STALL_NS / 1e6
#: The token timeline lists at most this many tokens (the SDK caps what it records anyway).
MAX_TOKENS = 100_000


def check_trace_id(trace_id: str) -> str:
    """The trace id in lowercase, or InvalidParameter when it is not 32 hex digits."""
    if not _TRACE_ID.match(trace_id):
        raise InvalidParameter("invalid_trace_id", "trace_id must be 32 hexadecimal characters")
    return trace_id.lower()


def _load(store: Store, trace_id: str) -> list[SpanRecord]:
    spans = load_trace(store, trace_id)
    if not spans:
        raise NotFound("trace_not_found", f"no spans stored for trace {trace_id}")
    return spans


def _attribute(
    trace_id: str, spans: Sequence[SpanRecord], stall_threshold_ms: float
) -> RequestAttribution:
    result = attribute_trace(trace_id, spans, stall_threshold_ns=round(stall_threshold_ms * 1e6))
    if result is None:
        raise NotFound(
            "no_server_span",
            f"trace {trace_id} has {len(spans)} span(s) but no SERVER span to attribute",
        )
    return result


def request_attribution(
    store: Store, trace_id: str, *, stall_threshold_ms: float = DEFAULT_STALL_MS
) -> dict[str, Any]:
    """``GET /v1/requests/{trace_id}/attribution``: the seven buckets of one request.

    ``stall_threshold_ms``: the gap between tokens that counts as a stall (the attributor's
    setting, so ``stalls`` here equals the stored count).
    """
    trace_id = check_trace_id(trace_id)
    return _attribute(trace_id, _load(store, trace_id), stall_threshold_ms).to_json()


def _server_side(spans: Sequence[SpanRecord]) -> set[str]:
    """Span ids measured on a server's clock: SERVER spans and everything under them."""
    kids: dict[str, list[SpanRecord]] = {}
    for s in spans:
        kids.setdefault(s.parent_span_id, []).append(s)
    out: set[str] = set()
    stack = [s for s in spans if s.kind == SpanKind.SERVER]
    while stack:
        span = stack.pop()
        if span.span_id in out:
            continue
        out.add(span.span_id)
        stack.extend(kids.get(span.span_id, ()))
    return out


def _depths(spans: Sequence[SpanRecord]) -> dict[str, int]:
    by_id = {s.span_id: s for s in spans}
    depth: dict[str, int] = {}
    for s in spans:
        d, cur, seen = 0, s, {s.span_id}
        while cur.parent_span_id in by_id and cur.parent_span_id not in seen:
            cur = by_id[cur.parent_span_id]
            seen.add(cur.span_id)
            d += 1
        depth[s.span_id] = d
    return depth


def _origin(result: RequestAttribution | None, spans: Sequence[SpanRecord]) -> int:
    return result.start_ns if result is not None else min(s.start_ns for s in spans)


def _waterfall(
    spans: Sequence[SpanRecord], result: RequestAttribution | None
) -> list[dict[str, Any]]:
    origin = _origin(result, spans)
    skew = result.clock_skew_ns if result is not None else 0
    server_side = _server_side(spans)
    depth = _depths(spans)
    rows = []
    for s in spans:
        # Server-side spans are moved onto the client's clock so the waterfall nests.
        shift = skew if s.span_id in server_side else 0
        rows.append(
            {
                "span_id": s.span_id,
                "parent_span_id": s.parent_span_id,
                "name": s.name,
                "kind": s.kind,
                "service": s.service,
                "phase": s.attributes.get(LatscopeAttributes.PHASE) or None,
                "start_ms": (s.start_ns - shift - origin) / 1e6,
                "duration_ms": s.duration_ns / 1e6,
                "depth": depth[s.span_id],
                "status": s.status,
                "attributes": dict(sorted(s.attributes.items())),
                "events": [
                    {"name": name, "at_ms": (t - shift - origin) / 1e6} for name, t in s.events
                ],
            }
        )
    rows.sort(key=lambda r: (r["start_ms"], r["depth"]))
    return rows


def trace_spans(store: Store, trace_id: str) -> dict[str, Any]:
    """``GET /v1/traces/{trace_id}/spans``: every span, placed on one clock, oldest first."""
    trace_id = check_trace_id(trace_id)
    spans = _load(store, trace_id)
    result = attribute_trace(trace_id, spans)
    return {
        "trace_id": trace_id,
        "start_unix_ms": _origin(result, spans) / 1e6,
        "clock_skew_ms": (result.clock_skew_ns if result else 0) / 1e6,
        "spans": _waterfall(spans, result),
    }


def _decode_span(spans: Sequence[SpanRecord]) -> SpanRecord | None:
    decodes = [s for s in spans if s.attributes.get(LatscopeAttributes.PHASE) == Phase.DECODE]
    return max(decodes, key=lambda s: s.start_ns) if decodes else None


def _timeline(
    spans: Sequence[SpanRecord], result: RequestAttribution, stall_ms: float
) -> dict[str, Any]:
    decode = _decode_span(spans)
    offsets = decode.attr_int_list(LatscopeAttributes.TOKEN_OFFSETS_US) if decode else []
    offsets = offsets[:MAX_TOKENS]
    origin = result.start_ns
    skew = result.clock_skew_ns
    times = (
        [(decode.start_ns + us * 1000 - skew - origin) / 1e6 for us in offsets] if decode else []
    )
    gaps = [b - a for a, b in itertools.pairwise(times)]
    threshold = stall_ms
    stalls = [
        {"index": i + 1, "at_ms": times[i + 1], "gap_ms": gap}
        for i, gap in enumerate(gaps)
        if gap > threshold
    ]
    # On the request's axis: the client saw the first token at its TTFT; without a client span,
    # the first recorded token time stands for it.
    if result.ttft_client_ns is not None:
        first: float | None = result.ttft_client_ns / 1e6
    else:
        first = times[0] if times else None
    return {
        "count": len(times),
        "times_ms": times,
        "first_token_ms": first,
        "stall_threshold_ms": threshold,
        "stalls": stalls,
    }


def token_timeline(
    store: Store,
    trace_id: str,
    stall_ms: float | None = None,
    *,
    stall_threshold_ms: float = DEFAULT_STALL_MS,
) -> dict[str, Any]:
    """``GET /v1/requests/{trace_id}/tokens``: when each token came, and the stalls (gaps over
    ``stall_ms``, by default the attributor's ``stall_threshold_ms``)."""
    trace_id = check_trace_id(trace_id)
    spans = _load(store, trace_id)
    result = _attribute(trace_id, spans, stall_threshold_ms)
    return {"trace_id": trace_id, **_timeline(spans, result, stall_ms or stall_threshold_ms)}


def explain(
    store: Store,
    trace_id: str,
    stall_ms: float | None = None,
    *,
    stall_threshold_ms: float = DEFAULT_STALL_MS,
) -> dict[str, Any]:
    """``GET /v1/requests/{trace_id}``: attribution, waterfall and token timeline at once."""
    trace_id = check_trace_id(trace_id)
    spans = _load(store, trace_id)
    result = _attribute(trace_id, spans, stall_threshold_ms)
    return {
        "attribution": result.to_json(),
        "spans": _waterfall(spans, result),
        "tokens": _timeline(spans, result, stall_ms or stall_threshold_ms),
    }
