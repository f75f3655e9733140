"""Answers about one request or one trace: attributions, span waterfalls, token timelines, and
the critical path of a trace with several inference calls (an agent run).

A request is named by its id, ``<trace id>-<span id>`` (its client span's, else its server
span's); a trace id names a request too when the trace holds exactly one, so single-call traces
answer as they always did. Each function reads the spans from the store and returns the answer's
model (``latscope.api.schemas``, milliseconds as floats), which the REST API serves, the gRPC
service converts and the CLI's direct mode renders.

Bounds, so that no trace ties up the API or the ingest beside it: a trace of more than
``max_spans`` spans (``--max-trace-spans``) is not answered (422 ``trace_too_large``, counted
before it is read); at most ``TRACE_SLOTS`` answers are worked out at once, the others wait
their turn (503 ``busy`` at once when ``TRACE_WAITING`` already wait), since each is Python work
that holds the GIL the collector's threads need; and an answer not ready within the store's
query time limit (``--query-timeout-s``), waiting included, stops with 503 ``query_timeout``.
Every step is linear in the trace's spans (``docs/benchmarks.md``, "Wide traces").

Each answer first reads the trace's state (its spans counted and fingerprinted, ``_STATE``); what
is worked out of a state (the spans, their calls, each call's attribution, the run, the answers
built) is worked out once and shared by every answer about it, those asked at once included
(``_Worked``). The states of the traces answered last are kept while they hold at most
``max_spans`` spans together; a trace that gains a span is a new state, worked out afresh.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Any

from latscope.api.errors import InvalidParameter, NotFound, QueryError
from latscope.api.schemas import (
    Attribution,
    Explain,
    PathBuckets,
    PathStep,
    RequestTokens,
    Run,
    RunBudget,
    RunCall,
    RunRoot,
    RunTool,
    Span,
    Standing,
    StoredSpan,
    TokenTimeline,
    TraceExplain,
    TraceRequests,
    TraceSpans,
)
from latscope.api.trace_state import (
    TraceTooLarge,
    _reading,
    _stall_ns,
    _Trace,
)
from latscope.attribution import (
    Request,
    RequestAttribution,
    SpanRecord,
    aggregates,
    attribute_request,
    find_requests,
)
from latscope.attribution.engine import timed_decode, timeline
from latscope.attribution.queries import SPAN_STORED
from latscope.attribution.runs import RunExplanation
from latscope.config import DEFAULT_MAX_TRACE_SPANS
from latscope.semconv import LatscopeAttributes, SpanKind, StatusCode
from latscope.storage import Store
from latscope.tokens import DEFAULT_STALL_NS

TRACE_ID_PATTERN = r"^[0-9a-fA-F]{32}$"
REQUEST_ID_PATTERN = r"^[0-9a-fA-F]{32}(-[0-9a-fA-F]{16})?$"
SPAN_ID_PATTERN = r"^[0-9a-fA-F]{16}$"
_SPAN_ID = re.compile(SPAN_ID_PATTERN)
_TRACE_ID = re.compile(TRACE_ID_PATTERN)
_REQUEST_ID = re.compile(REQUEST_ID_PATTERN)
#: The attributor's default stall threshold; the API passes the configured one
#: (``--stall-threshold-ms``) so the timeline and the stored ``stalls`` count agree.
DEFAULT_STALL_MS = DEFAULT_STALL_NS / 1e6
#: The token timeline lists at most this many tokens (the SDK caps what it records anyway).
MAX_TOKENS = 100_000


class SeveralRequests(QueryError):
    """A trace id was given where a request is meant, and the trace holds several."""

    def __init__(self, trace_id: str, ids: list[str]) -> None:
        super().__init__(
            409,
            "several_requests",
            f"trace {trace_id} holds {len(ids)} inference calls: name one by its request id "
            f"({', '.join(ids[:5])}{', ...' if len(ids) > 5 else ''}), or list them all with "
            f"/v1/traces/{trace_id}/requests",
        )
        self.request_ids = ids


def check_trace_id(trace_id: str) -> str:
    """The trace id in lowercase, or InvalidParameter when it is not 32 hex digits."""
    if not _TRACE_ID.match(trace_id):
        raise InvalidParameter("invalid_trace_id", "trace_id must be 32 hexadecimal characters")
    return trace_id.lower()


def check_request_id(request_id: str) -> tuple[str, str | None]:
    """(trace id, span id or None) of a request id or a bare trace id, lowercase."""
    if not _REQUEST_ID.match(request_id):
        raise InvalidParameter(
            "invalid_request_id",
            "a request id is a trace id (32 hexadecimal characters), optionally followed by '-' "
            "and the request's span id (16 hexadecimal characters)",
        )
    trace_id, _, span_id = request_id.lower().partition("-")
    return trace_id, span_id or None


def _no_calls(trace_id: str, spans: Sequence[SpanRecord]) -> NotFound:
    return NotFound(
        "no_inference_call",
        f"trace {trace_id} has {len(spans)} span(s) but no inference call: no SERVER span "
        "owning latscope.phase spans, no span carrying gen_ai.latency.* (vLLM, SGLang), and no "
        "SERVER span that says it serves a model (gen_ai.request.model, an inference http.route "
        "such as /v1/chat/completions) or is called by a GenAI client operation",
    )


def _select(
    trace_id: str,
    span_id: str | None,
    spans: Sequence[SpanRecord],
    requests: list[Request] | None = None,
) -> Request:
    if requests is None:
        requests = find_requests(spans)
    if not requests:
        raise _no_calls(trace_id, spans)
    if span_id is None:
        if len(requests) > 1:
            raise SeveralRequests(trace_id, [f"{trace_id}-{r.span_id}" for r in requests])
        return requests[0]
    for r in requests:
        if r.span_id == span_id:
            return r
    raise NotFound(
        "request_not_found",
        f"trace {trace_id} has no inference call with span id {span_id}; its calls are "
        + ", ".join(f"{trace_id}-{r.span_id}" for r in requests),
    )


def request_attribution(
    store: Store,
    request_id: str,
    *,
    stall_threshold_ms: float = DEFAULT_STALL_MS,
    max_spans: int = DEFAULT_MAX_TRACE_SPANS,
) -> Attribution:
    """``GET /v1/requests/{id}/attribution``: the seven buckets of one request.

    ``stall_threshold_ms``: the gap between tokens that counts as a stall (the attributor's
    setting, so ``stalls`` here equals the stored count).
    """
    trace_id, span_id = check_request_id(request_id)
    with _reading(store, trace_id, f"request {request_id}", max_spans) as t:
        request = _select(trace_id, span_id, t.spans, t.requests)
        return Attribution.model_validate(
            attribute_request(
                trace_id, request, stall_threshold_ns=_stall_ns(stall_threshold_ms)
            ).to_json()
        )


def trace_requests(
    store: Store,
    trace_id: str,
    *,
    stall_threshold_ms: float = DEFAULT_STALL_MS,
    max_spans: int = DEFAULT_MAX_TRACE_SPANS,
) -> TraceRequests:
    """``GET /v1/traces/{trace_id}/requests``: every inference call of a trace, by start."""
    trace_id = check_trace_id(trace_id)
    with _reading(store, trace_id, f"trace {trace_id}", max_spans) as t:
        return t.answer(
            ("requests answer", stall_threshold_ms),
            lambda: TraceRequests.model_validate(
                {
                    "trace_id": trace_id,
                    "requests": [a.to_json() for a in t.attributions(stall_threshold_ms)],
                }
            ),
        )


def _shifts(t: _Trace, skews: dict[str, int]) -> dict[str, int]:
    """Span id -> the clock offset that moves it onto its caller's clock: the spans of each
    request's server side (its attempts and everything under them) by that request's skew
    (request span id -> ``clock_skew_ns``)."""
    shift: dict[str, int] = {}
    children = t.index.children
    for request in t.requests:
        skew = skews.get(request.span_id)
        if not skew:
            continue
        stack = [request.window(a) for a in request.attempts]
        while stack:
            span = stack.pop()
            if span.span_id in shift:
                continue
            shift[span.span_id] = skew
            stack.extend(children.get(span.span_id, ()))
    return shift


def _tree_order(rows: list[Span]) -> list[Span]:
    """The waterfall's rows depth-first, as Jaeger lists a trace: each span's children right
    under it, siblings (and roots) by start; ``depth`` set on each. A root is a span whose parent
    is not stored; where parent links close a cycle (a client can send one), the earliest span
    of what is left counts as a root. No recursion: a trace may be 100,000 spans deep."""
    by_start = sorted(rows, key=lambda r: (r["start_ms"], r["span_id"]))
    ids = {r["span_id"] for r in rows}
    children: dict[str, list[Span]] = {}
    for r in by_start:
        if r["parent_span_id"] in ids and r["parent_span_id"] != r["span_id"]:
            children.setdefault(r["parent_span_id"], []).append(r)
    roots = [r for r in by_start if r["parent_span_id"] not in ids]
    ordered: list[Span] = []
    placed: set[str] = set()
    # The stored roots first; then whatever a cycle left unplaced, earliest first.
    for start in itertools.chain(roots, by_start):
        stack = [(start, 0)]
        while stack:
            row, depth = stack.pop()
            if row["span_id"] in placed:
                continue
            placed.add(row["span_id"])
            row["depth"] = depth
            ordered.append(row)
            stack.extend((c, depth + 1) for c in reversed(children.get(row["span_id"], ())))
    return ordered


def _waterfall(t: _Trace, origin: int, skews: dict[str, int]) -> list[Span]:
    """Every span as a row of the waterfall, ms from ``origin``, in tree order; each call's
    client span (its server span without one) marked with its request id.

    The rows are ``Span`` typed dicts written out here, checked by the type checker (every key,
    none other, each value's type) rather than validated again at run time: a wide trace has
    tens of thousands of them."""
    shift = _shifts(t, skews)
    calls = {r.span_id: f"{t.trace_id}-{r.span_id}" for r in t.requests}
    t.check()
    rows: list[Span] = []
    for s in t.spans:
        # Server-side spans are moved onto the client's clock so the waterfall nests.
        d = shift.get(s.span_id, 0)
        rows.append(
            {
                "span_id": s.span_id,
                "parent_span_id": s.parent_span_id,
                "name": s.name,
                "kind": s.kind,
                "service": s.service,
                "phase": s.attributes.get(LatscopeAttributes.PHASE) or None,
                "request_id": calls.get(s.span_id),
                "start_ms": (s.start_ns - d - origin) / 1e6,
                "duration_ms": s.duration_ns / 1e6,
                "depth": 0,
                "status": s.status,
                "attributes": dict(sorted(s.attributes.items())),
                "events": [
                    {"name": name, "at_ms": (at - d - origin) / 1e6} for name, at in s.events
                ],
            }
        )
    t.check()
    ordered = _tree_order(rows)
    t.check()
    return ordered


def _rows(t: _Trace, origin: int, skews: dict[str, int]) -> list[Span]:
    """The waterfall's rows, worked out once per origin and clock skews: the trace view and
    ``/spans`` share them (their origin is the root's start when it starts first)."""
    return t.piece(
        ("rows", origin, tuple(sorted(skews.items()))), lambda: _waterfall(t, origin, skews)
    )


def trace_spans(
    store: Store, trace_id: str, *, max_spans: int = DEFAULT_MAX_TRACE_SPANS
) -> TraceSpans:
    """``GET /v1/traces/{trace_id}/spans``: every span, placed on one clock, in tree order."""
    trace_id = check_trace_id(trace_id)
    with _reading(store, trace_id, f"trace {trace_id}", max_spans) as t:

        def answer() -> TraceSpans:
            origin = min(s.start_ns for s in t.spans)
            skew = 0
            if len(t.requests) == 1:
                only = timeline(t.requests[0])
                origin, skew = only.lo, -only.offset
            # Built, not validated: the rows are type-checked where they are written
            # (``_waterfall``).
            return TraceSpans.model_construct(
                trace_id=trace_id,
                start_unix_ms=origin / 1e6,
                clock_skew_ms=skew / 1e6,
                spans=_rows(t, origin, t.skews()),
            )

        return t.answer("spans answer", answer)


def stored_span(store: Store, trace_id: str, span_id: str) -> StoredSpan:
    """``GET /v1/traces/{trace_id}/spans/{span_id}``: the span as stored, every value whole. One
    span's read: outside the trace answers' slots and cap (a span of a trace past the cap is read
    all the same)."""
    trace_id = check_trace_id(trace_id)
    if not _SPAN_ID.match(span_id):
        raise InvalidParameter("invalid_span_id", "span_id must be 16 hexadecimal characters")
    span_id = span_id.lower()
    rows = store.query_rows(SPAN_STORED, {"trace_id": trace_id, "span_id": span_id})
    if not rows:
        raise NotFound("span_not_found", f"no span {span_id} stored in trace {trace_id}")
    row = rows[0]
    (parent, name, kind, service, start, duration, status, message, attributes, resource) = row[:10]
    names, times, event_attributes, link_traces, link_spans, link_attributes = row[10:]
    return StoredSpan(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent,
        name=name,
        kind=SpanKind.normalize(kind),
        service=service,
        start_unix_ns=int(start),
        duration_ms=int(duration) / 1e6,
        status=StatusCode.normalize(status),
        status_message=message,
        attributes=dict(attributes),
        resource=dict(resource),
        events=[
            {"name": n, "at_unix_ns": int(t), "attributes": dict(a)}
            for n, t, a in zip(names, times, event_attributes, strict=True)
        ],
        links=[
            {"trace_id": t, "span_id": sp, "attributes": dict(a)}
            for t, sp, a in zip(link_traces, link_spans, link_attributes, strict=True)
        ],
    )


def _timeline(request: Request, result: RequestAttribution, stall_ms: float) -> dict[str, Any]:
    found = timed_decode(request)
    decode = found[0] if found else None
    offsets = (
        decode.attr_int_list(LatscopeAttributes.TOKEN_OFFSETS_US)[:MAX_TOKENS] if decode else []
    )
    origin = result.start_ns
    skew = result.clock_skew_ns
    times = (
        [(decode.start_ns + us * 1000 - skew - origin) / 1e6 for us in offsets] if decode else []
    )
    gaps = [b - a for a, b in itertools.pairwise(times)]
    stalls = [
        {"index": i + 1, "at_ms": times[i + 1], "gap_ms": gap}
        for i, gap in enumerate(gaps)
        if gap > stall_ms
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
        "stall_threshold_ms": stall_ms,
        "stalls": stalls,
    }


def token_timeline(
    store: Store,
    request_id: str,
    stall_ms: float | None = None,
    *,
    stall_threshold_ms: float = DEFAULT_STALL_MS,
    max_spans: int = DEFAULT_MAX_TRACE_SPANS,
) -> RequestTokens:
    """``GET /v1/requests/{id}/tokens``: when each token came, and the stalls (gaps over
    ``stall_ms``, by default the attributor's ``stall_threshold_ms``). The tokens are those of
    the request's decode span that attribution reads (``engine.timed_decode``)."""
    trace_id, span_id = check_request_id(request_id)
    with _reading(store, trace_id, f"request {request_id}", max_spans) as t:
        request = _select(trace_id, span_id, t.spans, t.requests)
        result = attribute_request(
            trace_id, request, stall_threshold_ns=_stall_ns(stall_threshold_ms)
        )
        return RequestTokens.model_validate(
            {
                "trace_id": trace_id,
                "request_id": result.request_id,
                **_timeline(request, result, stall_ms or stall_threshold_ms),
            }
        )


def explain(
    store: Store,
    request_id: str,
    stall_ms: float | None = None,
    *,
    stall_threshold_ms: float = DEFAULT_STALL_MS,
    max_spans: int = DEFAULT_MAX_TRACE_SPANS,
) -> Explain:
    """``GET /v1/requests/{id}``: attribution, waterfall and token timeline at once."""
    trace_id, span_id = check_request_id(request_id)
    with _reading(store, trace_id, f"request {request_id}", max_spans) as t:
        request = _select(trace_id, span_id, t.spans, t.requests)
        result = attribute_request(
            trace_id, request, stall_threshold_ns=_stall_ns(stall_threshold_ms)
        )
        skews = t.skews()
        spans = t.latest(
            "call rows",
            (result.start_ns, tuple(sorted(skews.items()))),
            lambda: _waterfall(t, result.start_ns, skews),
        )
        tokens = _timeline(request, result, stall_ms or stall_threshold_ms)
    # A query over the attribution table, not the trace: outside the trace answers' slots. The
    # answer is built around the rows, type-checked where they are written (``_waterfall``).
    return Explain.model_construct(
        attribution=Attribution.model_validate(result.to_json()),
        standing=standing(store, result),
        spans=spans,
        tokens=TokenTimeline.model_validate(tokens),
    )


def standing(store: Store, result: RequestAttribution) -> Standing:
    """Where ``result`` stands among the requests of its service and model that started in the
    hour before it (``aggregates.standing``)."""
    ttft = result.ttft_client_ns if result.ttft_client_ns is not None else result.ttft_server_ns
    values = {"e2e": result.e2e_ns, **result.buckets_ns, "ttft": ttft, "tpot": result.tpot_ns}
    return aggregates.standing(
        store,
        service=result.service,
        model=result.model,
        start_ns=result.start_ns,
        values=values,
        request=(result.trace_id, result.request_span_id),
    )


def _path_buckets(ns: dict[str, int]) -> PathBuckets:
    """Per-bucket ns (every bucket a key) as the answer's ms."""
    return {
        "network": ns["network"] / 1e6,
        "queue": ns["queue"] / 1e6,
        "preprocess": ns["preprocess"] / 1e6,
        "prefill": ns["prefill"] / 1e6,
        "decode": ns["decode"] / 1e6,
        "postprocess": ns["postprocess"] / 1e6,
        "other": ns["other"] / 1e6,
    }


def run_answer(run: RunExplanation) -> Run:
    """A run explanation as its answer (ms from the root's start).

    Its long lists (the calls, tools and path steps: tens of thousands of rows in a long agent
    run) are typed dicts written out here, checked by the type checker rather than validated
    again at run time; the rest is validated (each call's attribution too)."""
    origin = run.root.start_ns
    calls: list[RunCall] = [
        {
            "request_id": c.attribution.request_id,
            "start_ms": (c.attribution.start_ns - origin) / 1e6,
            "e2e_ms": c.attribution.e2e_ns / 1e6,
            "on_critical_path_ms": c.on_path_ns / 1e6,
            "on_critical_path_buckets_ms": _path_buckets(c.on_path_buckets_ns),
            "attribution": Attribution.model_validate(c.attribution.to_json()),
        }
        for c in run.calls
    ]
    tools: list[RunTool] = [
        {
            "span_id": t.span.span_id,
            "name": t.span.name,
            "tool": t.span.attributes.get("gen_ai.tool.name", ""),
            "start_ms": (t.span.start_ns - origin) / 1e6,
            "duration_ms": t.span.duration_ns / 1e6,
            "on_critical_path_ms": t.on_path_ns / 1e6,
        }
        for t in run.tools
    ]
    path: list[PathStep] = [
        {
            "span_id": p.span_id,
            "name": p.name,
            "category": p.category,
            "bucket": p.bucket,
            "request_id": p.request_id,
            "start_ms": (p.start_ns - origin) / 1e6,
            "end_ms": (p.end_ns - origin) / 1e6,
        }
        for p in run.path
    ]
    return Run.model_construct(
        trace_id=run.trace_id,
        root=RunRoot.model_validate(
            {
                "span_id": run.root.span_id,
                "name": run.root.name,
                "service": run.root.service,
                "kind": run.root.kind,
            }
        ),
        e2e_ms=run.e2e_ns / 1e6,
        critical_path_ms=RunBudget.model_validate(
            {
                "llm": sum(run.llm_ns.values()) / 1e6,
                "llm_buckets": _path_buckets(run.llm_ns),
                "tool": run.tool_ns / 1e6,
                "app": run.app_ns / 1e6,
            }
        ),
        calls=calls,
        tools=tools,
        path=path,
        cycles=list(run.cycles),
    )


def trace_run(
    store: Store,
    trace_id: str,
    *,
    stall_threshold_ms: float = DEFAULT_STALL_MS,
    max_spans: int = DEFAULT_MAX_TRACE_SPANS,
) -> Run:
    """``GET /v1/traces/{trace_id}/run``: the trace as one run: its root's end-to-end time and,
    along its critical path, the time in each LLM call's buckets, in tool calls and in the app."""
    trace_id = check_trace_id(trace_id)
    with _reading(store, trace_id, f"trace {trace_id}", max_spans) as t:
        return _run_answer(t, stall_threshold_ms)


def _run_answer(t: _Trace, stall_threshold_ms: float) -> Run:
    return t.answer(
        ("run answer", stall_threshold_ms), lambda: run_answer(t.run(stall_threshold_ms))
    )


def trace_explain(
    store: Store,
    trace_id: str,
    *,
    stall_threshold_ms: float = DEFAULT_STALL_MS,
    max_spans: int = DEFAULT_MAX_TRACE_SPANS,
) -> TraceExplain:
    """``GET /v1/traces/{trace_id}``: a trace at once: its run, every call, and the waterfall
    with each call's spans on its caller's clock."""
    trace_id = check_trace_id(trace_id)
    with _reading(store, trace_id, f"trace {trace_id}", max_spans) as t:

        def answer() -> TraceExplain:
            run = t.run(stall_threshold_ms)
            skews = {
                c.attribution.request_span_id: c.attribution.clock_skew_ns
                for c in run.calls
                if c.attribution.clock_skew_ns
            }
            # Both parts are built already (the run answer and the rows): not validated again.
            return TraceExplain.model_construct(
                trace_id=trace_id,
                run=_run_answer(t, stall_threshold_ms),
                spans=_rows(t, run.root.start_ns, skews),
            )

        return t.answer(("trace answer", stall_threshold_ms), answer)


__all__ = [
    "DEFAULT_MAX_TRACE_SPANS",
    "REQUEST_ID_PATTERN",
    "TRACE_ID_PATTERN",
    "SeveralRequests",
    "TraceTooLarge",
    "check_request_id",
    "check_trace_id",
    "explain",
    "request_attribution",
    "token_timeline",
    "trace_explain",
    "trace_requests",
    "trace_run",
    "trace_spans",
]
