"""A trace with several inference calls (an agent run, a RAG pipeline), explained as a whole.

The run's end-to-end time is its root span's. Along its *critical path* (the chain of work the
root waited on) every instant is counted once, in one of: an LLM call's seven buckets, a tool
call (a span with ``gen_ai.operation.name = execute_tool`` and everything under it that is not an
LLM call), or the app's own time (orchestration, and calls to other services). These add up to
the root's duration.

The critical path is Jaeger's, made exact: from the end of a span, walk back; at each point take
the child that finished last at or before that point (clipped to it), count the gap after it as
the span's own time, count the child down to its start recursively, continue from the child's
start. So back-to-back children are both on the path, a parallel group counts its last-finishing
branch (and whatever ran before that branch started), and a child outliving its parent counts
only up to the parent's end. An LLM call is one step: its client span (extended to the server's
end for a headers-only client) holds its bucket timeline from ``engine.named_pieces``, clipped
to the part of the call the path covers. The walk does not descend from a span into a SERVER child
of another service (another host's clock): a call to another service is one step of its caller's
category.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from latscope.attribution.engine import (
    Request,
    Timeline,
    TraceIndex,
    attribute_request,
    find_requests,
    named_pieces,
    ranked_pieces,
)
from latscope.attribution.model import RequestAttribution, SpanRecord
from latscope.semconv import (
    BUCKETS,
    GenAIAttributes,
    GenAIOperation,
    OpenInferenceAttributes,
    SpanKind,
)
from latscope.tokens import DEFAULT_STALL_NS

APP = "app"
TOOL = "tool"
LLM = "llm"


@dataclass
class PathStep:
    """One piece of the critical path: ``[start_ns, end_ns)`` on the root's clock."""

    span_id: str
    name: str
    category: str  # APP, TOOL or LLM
    start_ns: int
    end_ns: int
    request_id: str | None = None
    bucket: str | None = None  # for LLM steps


@dataclass
class CallOnPath:
    """An LLM call of the run and how much of it the root waited for."""

    attribution: RequestAttribution
    on_path_ns: int = 0
    on_path_buckets_ns: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0))


@dataclass
class ToolOnPath:
    span: SpanRecord
    on_path_ns: int = 0


@dataclass
class RunExplanation:
    trace_id: str
    root: SpanRecord
    e2e_ns: int
    llm_ns: dict[str, int]  # per bucket, on the critical path
    tool_ns: int
    app_ns: int
    calls: list[CallOnPath]
    tools: list[ToolOnPath]
    path: list[PathStep]
    #: spans whose parent link closed a cycle (a span its own ancestor) and was left out
    cycles: list[str] = field(default_factory=list)


def _calls_a_model(span: SpanRecord) -> bool:
    """A client-side span of a model call: a CLIENT span, a GenAI model operation, or an
    OpenInference LLM span (INTERNAL around the HTTP exchange)."""
    return (
        span.kind == SpanKind.CLIENT
        or span.attributes.get(GenAIAttributes.OPERATION_NAME) in GenAIOperation.MODEL_CALLS
        or span.attributes.get(OpenInferenceAttributes.SPAN_KIND) == OpenInferenceAttributes.LLM
    )


def _is_tool(span: SpanRecord) -> bool:
    return span.attributes.get(GenAIAttributes.OPERATION_NAME) == GenAIOperation.EXECUTE_TOOL


def _root(spans: Sequence[SpanRecord], index: TraceIndex) -> SpanRecord:
    """The earliest span whose parent is not stored (the longest on a tie)."""
    roots = [s for s in spans if s.parent_span_id not in index.by_id] or list(spans)
    return min(roots, key=lambda s: (s.start_ns, -s.duration_ns, s.span_id))


def _placement(outer: tuple[int, int], inner: tuple[int, int]) -> int:
    """The offset that puts ``inner`` (another host's clock) inside ``outer``: none when it fits
    as recorded, else centred (the symmetric network assumption of the skew adjuster), or start
    aligned when it is longer."""
    lo, hi = outer
    a, b = inner
    if a >= lo and b <= hi:
        return 0
    if b - a <= hi - lo:
        return lo + ((hi - lo) - (b - a)) // 2 - a
    return lo - a


def explain_run(
    trace_id: str,
    spans: Sequence[SpanRecord],
    *,
    stall_threshold_ns: int = DEFAULT_STALL_NS,
    index: TraceIndex | None = None,
    requests: Sequence[Request] | None = None,
    attributions: Sequence[RequestAttribution] | None = None,
    call_pieces: Sequence[tuple[Timeline, list[tuple[int, int, int]]]] | None = None,
) -> RunExplanation | None:
    """The run's critical path split into LLM buckets, tool time and app time; None for a trace
    with no spans. ``index``, ``requests``, ``attributions`` and ``call_pieces``: the spans'
    ``TraceIndex``, their ``find_requests``, each request's ``attribute_request`` (same order,
    same stall threshold) and its ``ranked_pieces``, when the caller has them already."""
    if not spans:
        return None
    index = index or TraceIndex(spans)
    root = _root(spans, index)
    requests = find_requests(spans) if requests is None else requests
    # An LLM call is entered at its client span, or at its first attempt when it has none.
    entry: dict[str, tuple[CallOnPath, int, int, list[tuple[str, int, int]]]] = {}
    calls = []
    for i, r in enumerate(requests):
        tl, ranked = computed = ranked_pieces(r) if call_pieces is None else call_pieces[i]
        pieces = named_pieces(r, ranked)
        call = CallOnPath(
            attribute_request(trace_id, r, stall_threshold_ns=stall_threshold_ns, pieces=computed)
            if attributions is None
            else attributions[i]
        )
        entry[r.span_id] = (call, tl.lo, tl.hi, pieces)
        calls.append(call)
    # Spans with an LLM call at or below them: a CLIENT span among them wraps a call (a GenAI
    # client span around the HTTP exchange, a gateway hop), and its own time is the call's network.
    holds_call: set[str] = set()
    for span_id in entry:
        node = index.by_id.get(span_id)
        while node is not None and node.span_id not in holds_call:
            holds_call.add(node.span_id)
            node = index.by_id.get(node.parent_span_id)
    tools: dict[str, ToolOnPath] = {}
    path: list[PathStep] = []
    totals = {APP: 0, TOOL: 0}
    llm = dict.fromkeys(BUCKETS, 0)
    tool_stack: list[str] = []

    def interval(span: SpanRecord, offset: int) -> tuple[int, int]:
        hit = entry.get(span.span_id)
        lo, hi = (hit[1], hit[2]) if hit is not None else (span.start_ns, span.end_ns)
        return lo + offset, hi + offset

    def own(span: SpanRecord, category: str, a: int, b: int) -> None:
        if b <= a:
            return
        if category == LLM:
            llm["network"] += b - a
            path.append(PathStep(span.span_id, span.name, LLM, a, b, bucket="network"))
            return
        totals[category] += b - a
        path.append(PathStep(span.span_id, span.name, category, a, b))
        for tool_id in tool_stack:
            tools[tool_id].on_path_ns += b - a

    def walk(
        span: SpanRecord, lo: int, hi: int, category: str, offset: int
    ) -> Iterator[tuple[SpanRecord, int, int, str, int]]:
        """One span's part of the path; yields each child to walk (the driver below keeps the
        stack, so a deep or cyclic trace, which a client controls, cannot exhaust Python's)."""
        hit = entry.get(span.span_id)
        if hit is not None:
            call, _, _, pieces = hit
            request_id = call.attribution.request_id
            for name, a, b in pieces:
                a, b = max(a + offset, lo), min(b + offset, hi)
                if b > a:
                    llm[name] += b - a
                    call.on_path_ns += b - a
                    call.on_path_buckets_ns[name] += b - a
                    path.append(PathStep(span.span_id, span.name, LLM, a, b, request_id, name))
            return
        is_tool = _is_tool(span)
        if is_tool:
            category = TOOL
            tools.setdefault(span.span_id, ToolOnPath(span))
            tool_stack.append(span.span_id)
        elif span.span_id in holds_call and _calls_a_model(span):
            category = LLM
        # Children on this span's clock; a SERVER child of another service is on its own host's
        # clock and is placed inside this span first. A child already on the way down here is a
        # cycle in the parent links (a span its own ancestor): that link is left out.
        # (c_hi, c_lo, span id, child, shift) of the children that can be on the path: those
        # ending after lo and after they start, latest end first.
        kids = []
        here = (span.start_ns + offset, span.end_ns + offset)
        for c in index.children.get(span.span_id, ()):
            if c.span_id in walking:
                broken.add(c.span_id)
                continue
            shift = offset
            if c.kind == SpanKind.SERVER and c.service != span.service:
                shift = offset + _placement(here, (c.start_ns + offset, c.end_ns + offset))
            c_lo, c_hi = interval(c, shift)
            if c_hi > lo and c_hi > c_lo:
                kids.append((c_hi, c_lo, c.span_id, c, shift))
        kids.sort(key=lambda k: k[0], reverse=True)
        # At each point t, the child that finished last at or before t (clipped to t) is next:
        # every child still running at t ends there, and of those the one that started first
        # (then the largest span id) is taken. Those are kept in a heap as t moves back, by
        # (start, rank of the span id from the largest), and one starting at or after t can
        # never be taken again; so each child is looked at a bounded number of times, and a
        # span with many children (a long agent run) is walked in n log n, not n squared.
        rank = {k[2]: i for i, k in enumerate(sorted(kids, key=lambda k: k[2], reverse=True))}
        running: list[tuple[int, int, int]] = []
        taken = 0  # kids[:taken] are in the heap (or were)
        t = hi
        while t > lo:
            while taken < len(kids) and kids[taken][0] >= t:
                heapq.heappush(running, (kids[taken][1], rank[kids[taken][2]], taken))
                taken += 1
            while running and running[0][0] >= t:
                heapq.heappop(running)
            if not running:
                if taken == len(kids):
                    own(span, category, lo, t)
                    break
                # None runs at t: the next to end is the latest end before it.
                end = kids[taken][0]
                own(span, category, end, t)
                t = end
                continue
            _, _, i = heapq.heappop(running)
            _, c_lo, _, child, shift = kids[i]
            start = max(c_lo, lo)
            yield child, start, t, category, shift
            t = start
        if is_tool:
            tool_stack.pop()

    # The spans being walked (the path from the root down), and the spans whose parent link
    # closed a cycle and was left out.
    walking: set[str] = {root.span_id}
    broken: set[str] = set()
    stack = [(root.span_id, walk(root, root.start_ns, root.end_ns, APP, 0))]
    while stack:
        step = next(stack[-1][1], None)
        if step is None:
            walking.discard(stack.pop()[0])
            continue
        walking.add(step[0].span_id)
        stack.append((step[0].span_id, walk(*step)))
    path.sort(key=lambda p: p.start_ns)
    return RunExplanation(
        trace_id=trace_id,
        root=root,
        e2e_ns=root.duration_ns,
        llm_ns=llm,
        tool_ns=totals[TOOL],
        app_ns=totals[APP],
        calls=calls,
        tools=sorted(tools.values(), key=lambda t: (t.span.start_ns, t.span.span_id)),
        path=path,
        cycles=sorted(broken),
    )
