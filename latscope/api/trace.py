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

import contextlib
import gc
import itertools
import re
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import TypeAdapter

from latscope.api.errors import InvalidParameter, NotFound, QueryError
from latscope.api.schemas import (
    Attribution,
    Explain,
    RequestTokens,
    Run,
    Span,
    TraceExplain,
    TraceRequests,
    TraceSpans,
)
from latscope.api.timerange import TimeRange
from latscope.attribution import (
    Request,
    RequestAttribution,
    SpanRecord,
    aggregates,
    attribute_request,
    explain_run,
    find_requests,
    load_trace,
    rules,
)
from latscope.attribution.engine import TraceIndex, timed_decode, timeline
from latscope.attribution.runs import RunExplanation
from latscope.config import DEFAULT_MAX_TRACE_SPANS
from latscope.semconv import LatscopeAttributes
from latscope.storage import SPANS_TABLE, Store
from latscope.tokens import DEFAULT_STALL_NS

TRACE_ID_PATTERN = r"^[0-9a-fA-F]{32}$"
REQUEST_ID_PATTERN = r"^[0-9a-fA-F]{32}(-[0-9a-fA-F]{16})?$"
_TRACE_ID = re.compile(TRACE_ID_PATTERN)
_REQUEST_ID = re.compile(REQUEST_ID_PATTERN)
#: The attributor's default stall threshold; the API passes the configured one
#: (``--stall-threshold-ms``) so the timeline and the stored ``stalls`` count agree.
DEFAULT_STALL_MS = DEFAULT_STALL_NS / 1e6
#: The token timeline lists at most this many tokens (the SDK caps what it records anyway).
MAX_TOKENS = 100_000
#: Trace answers worked out at once in this process; more wait for a slot.
TRACE_SLOTS = 2
#: Trace answers waiting for a slot at most; past that one is refused at once (503 ``busy``), so
#: requests for wide traces cannot take every thread of the HTTP server's pool.
TRACE_WAITING = 16
_T = TypeVar("_T")
#: A trace's state: its spans counted (to ``limit``) and a fingerprint of which are stored. Spans
#: are only ever added (or dropped with their day), so an answer worked out from a state holds
#: for as long as the trace counts and fingerprints the same.
_STATE = f"""
SELECT count(), sum(h) FROM (
    SELECT cityHash64(SpanId, Timestamp, Duration) AS h FROM {SPANS_TABLE}
    WHERE TraceId = {{trace_id:String}} LIMIT {{limit:UInt64}}
)
"""


class _Gate:
    """``TRACE_SLOTS`` answers at once, at most ``TRACE_WAITING`` waiting."""

    def __init__(self, slots: int, waiting: int) -> None:
        self._slots = threading.BoundedSemaphore(slots)
        self._waiting = waiting
        self._queued = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def slot(self, deadline: float, what: str) -> Iterator[None]:
        with self._lock:
            if self._queued >= self._waiting:
                raise QueryError(
                    503, "busy",
                    f"{self._queued} trace answers are waiting already; retry {what} later",
                )  # fmt: skip
            self._queued += 1
        try:
            got = self._slots.acquire(timeout=max(0.0, deadline - time.monotonic()))
        finally:
            with self._lock:
                self._queued -= 1
        if not got:
            raise _timed_out(what)
        try:
            yield
        finally:
            self._slots.release()


_GATE = _Gate(TRACE_SLOTS, TRACE_WAITING)


class _CyclesLater:
    """Python's cyclic garbage collector paused while any trace answer is worked out: an answer
    allocates an object or more per span and per field, which sets off collections of the whole
    heap again and again (a third of a wide trace's answer); what it leaves is freed by reference
    counting, and any cycles at the next collection after the last answer ends. Answers that
    follow one another without a gap (clients asking for a trace over and over) would keep it
    paused for good while the rest of the process makes cycles too: an answer ending more than
    ``most_s`` after the pause began collects them."""

    def __init__(self, most_s: float = 2.0) -> None:
        self._lock = threading.Lock()
        self._answers = 0
        self._was_enabled = True
        self._most_s = most_s
        self._since = 0.0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        with self._lock:
            if self._answers == 0:
                self._was_enabled = gc.isenabled()
                self._since = time.monotonic()
                gc.disable()
            self._answers += 1
        try:
            yield
        finally:
            with self._lock:
                self._answers -= 1
                if self._answers == 0 and self._was_enabled:
                    gc.enable()
                elif self._was_enabled and time.monotonic() - self._since > self._most_s:
                    gc.collect()
                    self._since = time.monotonic()


_CYCLES = _CyclesLater()


def _timed_out(what: str) -> QueryError:
    return QueryError(
        503, "query_timeout",
        f"answering {what} took longer than the query time limit (--query-timeout-s); retry "
        "when the server is less busy",
    )  # fmt: skip


class TraceTooLarge(QueryError):
    """A trace holds more spans than this process answers a trace with."""

    def __init__(self, trace_id: str, spans: int, max_spans: int) -> None:
        super().__init__(
            422,
            "trace_too_large",
            f"trace {trace_id} holds more than {max_spans:,} spans, the most latscope answers a "
            f"trace with (--max-trace-spans; {spans:,} counted so far). Its inference calls are "
            "attributed all the same: /v1/requests?since=...&service=... lists the slowest, and "
            "/v1/export/requests their rows. To see this trace, raise --max-trace-spans (an "
            "answer takes 0.04-0.15 CPU s more per 1,000 spans) or read its spans from "
            f"ClickHouse ({SPANS_TABLE} WHERE TraceId = '{trace_id}').",
        )


class _Worked:
    """One state of a trace (``_STATE``) and what is worked out of it, by name: its spans, their
    index, its calls, each call's attribution, the run, the answers built. Every answer about
    that state shares it: the first to need a piece works it out, and others needing it then
    wait for it (each until its own deadline) instead of working it out again."""

    def __init__(self, spans: int, rulebook: rules.Rulebook) -> None:
        self.spans = spans
        #: The rulebook the calls were found with (held, so that its id in the key stays its).
        self.rulebook = rulebook
        self.lock = threading.RLock()
        self.pieces: dict[Hashable, Any] = {}
        #: The characters of its spans' attribute values, once they are read.
        self.text = 0


#: The most characters of attribute values the kept states' spans hold together: a trace of
#: spans carrying prompts is not kept past its answers, so what stays in memory between answers
#: is bounded whatever the spans carry.
KEPT_TEXT = 64 << 20


class _Kept:
    """The states of the traces answered last, the newest first, as many as hold at most
    ``budget`` spans (``--max-trace-spans``: one trace at the cap) and ``KEPT_TEXT`` together,
    so that the routes a trace's page asks one after the other, and askers of one trace at once,
    work it out once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: OrderedDict[Hashable, _Worked] = OrderedDict()

    def state(self, key: Hashable, spans: int, budget: int) -> _Worked:
        rulebook = rules.active()
        key = (key, id(rulebook))
        with self._lock:
            worked = self._states.get(key)
            if worked is None:
                worked = self._states[key] = _Worked(spans, rulebook)
            self._states.move_to_end(key, last=False)
            self._trim(budget, worked)
            return worked

    def trim(self, budget: int) -> None:
        """Let go of the states past the bounds (once an answer is done, its own too)."""
        with self._lock:
            self._trim(budget, None)

    def _trim(self, budget: int, keep: _Worked | None) -> None:
        spans = text = 0
        for k, w in list(self._states.items()):
            spans, text = spans + w.spans, text + w.text
            if (spans > budget or text > KEPT_TEXT) and w is not keep:
                del self._states[k]
                spans, text = spans - w.spans, text - w.text

    def clear(self) -> None:
        with self._lock:
            self._states.clear()


_KEPT = _Kept()


@dataclass
class _Trace:
    """One trace as an answer reads it: the state it was counted in (its pieces worked out at
    most once, ``_Worked``), and the deadline this answer keeps."""

    trace_id: str
    worked: _Worked
    deadline: float
    what: str
    store: Store | None = None

    def piece(self, name: Hashable, work: Callable[[], _T]) -> _T:
        """The piece ``name`` of the trace's state: ``work()``'s, worked out once."""
        worked = self.worked
        if not worked.lock.acquire(timeout=max(0.0, self.deadline - time.monotonic())):
            raise _timed_out(self.what)
        try:
            if name not in worked.pieces:
                worked.pieces[name] = work()
                self.check()
            return worked.pieces[name]
        finally:
            worked.lock.release()

    @property
    def spans(self) -> list[SpanRecord]:
        assert self.store is not None
        store = self.store

        def work() -> list[SpanRecord]:
            spans = _load(store, self.trace_id)
            self.worked.text = sum(
                len(v) for s in spans for d in (s.attributes, s.resource) for v in d.values()
            )
            return spans

        return self.piece("spans", work)

    @property
    def index(self) -> TraceIndex:
        return self.piece("index", lambda: TraceIndex(self.spans))

    @property
    def requests(self) -> list[Request]:
        return self.piece("requests", lambda: find_requests(self.spans))

    def check(self) -> None:
        """Stop once the deadline passed (between steps: each is bounded by the span cap)."""
        if time.monotonic() > self.deadline:
            raise _timed_out(self.what)

    def attributions(self, stall_threshold_ms: float) -> list[RequestAttribution]:
        """Each call's attribution, in ``requests``' order: the run's when it is worked out."""

        def work() -> list[RequestAttribution]:
            run = self.worked.pieces.get(("run", stall_threshold_ms))
            if run is not None:
                return [c.attribution for c in run.calls]
            stall = _stall_ns(stall_threshold_ms)
            out = []
            for i, r in enumerate(self.requests):
                out.append(attribute_request(self.trace_id, r, stall_threshold_ns=stall))
                if i % 256 == 255:
                    self.check()
            return out

        return self.piece(("attributions", stall_threshold_ms), work)

    def run(self, stall_threshold_ms: float) -> RunExplanation:
        """The trace as one run (``explain_run``), over the index, calls and attributions worked
        out already."""

        def work() -> RunExplanation:
            run = explain_run(
                self.trace_id, self.spans, stall_threshold_ns=_stall_ns(stall_threshold_ms),
                index=self.index, requests=self.requests,
                attributions=self.worked.pieces.get(("attributions", stall_threshold_ms)),
            )  # fmt: skip
            assert run is not None  # spans is not empty
            return run

        return self.piece(("run", stall_threshold_ms), work)

    def skews(self) -> dict[str, int]:
        """Request span id -> its server clock's skew (``clock_skew_ns``: ``-timeline.offset``),
        for every request whose server runs on another clock."""
        return self.piece(
            "skews",
            lambda: {r.span_id: -tl.offset for r in self.requests if (tl := timeline(r)).offset},
        )


@contextlib.contextmanager
def _reading(store: Store, trace_id: str, what: str, max_spans: int) -> Iterator[_Trace]:
    """The trace in its current state, within the bounds (the module's docstring); NotFound
    when it has no spans."""
    deadline = time.monotonic() + store.query_timeout_s
    with _GATE.slot(deadline, what), _CYCLES.paused():
        counted, fingerprint = store.query_rows(
            _STATE, {"trace_id": trace_id, "limit": max_spans + 1}
        )[0]
        counted = int(counted)
        if counted > max_spans:
            raise TraceTooLarge(trace_id, counted, max_spans)
        if not counted:
            raise _not_found(trace_id)
        key = (weakref.ref(store), trace_id, counted, int(fingerprint))
        loaded = _Trace(trace_id, _KEPT.state(key, counted, max_spans), deadline, what, store)
        try:
            loaded.check()
            yield loaded
        finally:
            _KEPT.trim(max_spans)


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


def _not_found(trace_id: str) -> NotFound:
    return NotFound("trace_not_found", f"no spans stored for trace {trace_id}")


def _load(store: Store, trace_id: str) -> list[SpanRecord]:
    spans = load_trace(store, trace_id)
    if not spans:
        raise _not_found(trace_id)
    return spans


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


def _stall_ns(stall_threshold_ms: float) -> int:
    return round(stall_threshold_ms * 1e6)


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
        return t.piece(
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


def _tree_order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The waterfall's rows depth-first, as Jaeger lists a trace: each span's children right
    under it, siblings (and roots) by start; ``depth`` set on each. A root is a span whose parent
    is not stored; where parent links close a cycle (a client can send one), the earliest span
    of what is left counts as a root. No recursion: a trace may be 100,000 spans deep."""
    by_start = sorted(rows, key=lambda r: (r["start_ms"], r["span_id"]))
    ids = {r["span_id"] for r in rows}
    children: dict[str, list[dict[str, Any]]] = {}
    for r in by_start:
        if r["parent_span_id"] in ids and r["parent_span_id"] != r["span_id"]:
            children.setdefault(r["parent_span_id"], []).append(r)
    roots = [r for r in by_start if r["parent_span_id"] not in ids]
    ordered: list[dict[str, Any]] = []
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


def _waterfall(t: _Trace, origin: int, skews: dict[str, int]) -> list[dict[str, Any]]:
    """Every span as a row of the waterfall, ms from ``origin``, in tree order; each call's
    client span (its server span without one) marked with its request id."""
    shift = _shifts(t, skews)
    calls = {r.span_id: f"{t.trace_id}-{r.span_id}" for r in t.requests}
    t.check()
    rows = []
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


_SPAN_ROWS = TypeAdapter(list[Span])


def _rows(t: _Trace, origin: int, skews: dict[str, int]) -> list[Span]:
    """The waterfall's rows as answer models, worked out once per origin and clock skews: the
    trace view and ``/spans`` share them (their origin is the root's start when it starts
    first)."""
    return t.piece(
        ("rows", origin, tuple(sorted(skews.items()))),
        lambda: _SPAN_ROWS.validate_python(_waterfall(t, origin, skews)),
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
            return TraceSpans.model_validate(
                {
                    "trace_id": trace_id,
                    "start_unix_ms": origin / 1e6,
                    "clock_skew_ms": skew / 1e6,
                    "spans": _rows(t, origin, t.skews()),
                }
            )

        return t.piece("spans answer", answer)


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
        spans = _waterfall(t, result.start_ns, t.skews())
        tokens = _timeline(request, result, stall_ms or stall_threshold_ms)
    # A query over the attribution table, not the trace: outside the trace answers' slots.
    return Explain.model_validate(
        {
            "attribution": result.to_json(),
            "standing": standing(store, result),
            "spans": spans,
            "tokens": tokens,
        }
    )


def standing(store: Store, result: RequestAttribution) -> dict[str, Any]:
    """Where ``result`` stands among the requests of its service and model that started in the
    hour before it (``aggregates.standing``), as ``Standing``'s JSON."""
    ttft = result.ttft_client_ns if result.ttft_client_ns is not None else result.ttft_server_ns
    values = {"e2e": result.e2e_ns, **result.buckets_ns, "ttft": ttft, "tpot": result.tpot_ns}
    found = aggregates.standing(
        store,
        service=result.service,
        model=result.model,
        start_ns=result.start_ns,
        values=values,
        request=(result.trace_id, result.request_span_id),
    )
    return {
        **TimeRange.from_ns(found["since_ns"], found["until_ns"]).to_json(),
        "peers": found["peers"],
        "percentiles": found["percentiles"],
    }


def run_answer(run: RunExplanation) -> Run:
    """A run explanation as its answer (ms from the root's start)."""
    origin = run.root.start_ns

    def ms(ns: float) -> float:
        return ns / 1e6

    llm_total = sum(run.llm_ns.values())
    return Run.model_validate({
        "trace_id": run.trace_id,
        "root": {
            "span_id": run.root.span_id,
            "name": run.root.name,
            "service": run.root.service,
            "kind": run.root.kind,
        },
        "e2e_ms": ms(run.e2e_ns),
        "critical_path_ms": {
            "llm": ms(llm_total),
            "llm_buckets": {b: ms(v) for b, v in run.llm_ns.items()},
            "tool": ms(run.tool_ns),
            "app": ms(run.app_ns),
        },
        "calls": [
            {
                "request_id": c.attribution.request_id,
                "start_ms": ms(c.attribution.start_ns - origin),
                "e2e_ms": ms(c.attribution.e2e_ns),
                "on_critical_path_ms": ms(c.on_path_ns),
                "on_critical_path_buckets_ms": {b: ms(v) for b, v in c.on_path_buckets_ns.items()},
                "attribution": c.attribution.to_json(),
            }
            for c in run.calls
        ],
        "tools": [
            {
                "span_id": t.span.span_id,
                "name": t.span.name,
                "tool": t.span.attributes.get("gen_ai.tool.name", ""),
                "start_ms": ms(t.span.start_ns - origin),
                "duration_ms": ms(t.span.duration_ns),
                "on_critical_path_ms": ms(t.on_path_ns),
            }
            for t in run.tools
        ],
        "path": [
            {
                "span_id": p.span_id,
                "name": p.name,
                "category": p.category,
                "bucket": p.bucket,
                "request_id": p.request_id,
                "start_ms": ms(p.start_ns - origin),
                "end_ms": ms(p.end_ns - origin),
            }
            for p in run.path
        ],
        "cycles": run.cycles,
    })  # fmt: skip


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
    return t.piece(
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
            return TraceExplain.model_validate(
                {
                    "trace_id": trace_id,
                    "run": _run_answer(t, stall_threshold_ms),
                    "spans": _rows(t, run.root.start_ns, skews),
                }
            )

        return t.piece(("trace answer", stall_threshold_ms), answer)


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
