"""Per-request attribution: one trace's spans -> its inference calls, each in seven buckets.

This is the reference implementation, written for clarity: the REST endpoints for one request or
one trace use it, and the production attributor (SQL inside ClickHouse, ``attribution/sql/``) is
tested against it. The rules are documented in docs/attribution.md; in short:

1. **Requests, not traces.** A trace holds any number of inference calls. Each *inference span*
   is a request's server side: a span that owns phase spans (the nearest SERVER or
   ``gen_ai.latency``-carrying ancestor of a ``latscope.phase`` span, or of an SGLang stage slice,
   at most ``MAX_PHASE_DEPTH`` levels up) or that carries ``gen_ai.latency.*`` whatever its kind
   (vLLM's ``llm_request``, SGLang's request root). A trace without any falls back to the
   innermost SERVER spans that have a client (outside tool calls). A request's client span is
   the nearest CLIENT ancestor of its inference span, reached without crossing a server of
   another service;
   every inference span under the same client is an *attempt* of that request (retries, and
   vLLM's ``n > 1`` samples, which overlap and so count as one attempt). A request's id is its
   client span's id, else its inference span's, after the trace id.
2. **Clock skew.** Attempts are on the server's clock, the client span on the client's. When the
   attempts' hull fits inside the client span as recorded, nothing moves (skew 0). Otherwise the
   hull is placed in the middle of the client span (symmetric network, as Jaeger's adjuster does)
   or, when it is longer than the client span: if the client span may have ended at the response
   headers (it does not say it read the whole response, as latscope's client does), it is
   *headers-only*, the server started in its middle and the request runs to the server's end plus
   the same return leg; else the hull's start is aligned with the client's and the excess is work
   after the response. ``clock_skew_ns`` is how far the server's clock runs ahead.
3. **Sweep.** The timeline is the client span (extended when headers-only; else the server span).
   Every instant goes to the highest-priority phase covering it (``PHASE_PRIORITY``), else to
   ``other`` when an attempt covers it, else to ``network`` (client time outside every attempt:
   wire, proxies, retry back-off). Phases are clipped to their attempt, attempts to the timeline.
   Without a client span ``network`` is None.
4. **vLLM / SGLang.** An attempt with no phase spans but ``gen_ai.latency.*`` attributes gets
   synthetic phases anchored at its first token: prefill ``[ttft - prefill, ttft]``, queue just
   before it, decode ``[ttft, ttft + decode]`` (decode = e2e - ttft where the split is missing).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from latscope.attribution.model import RequestAttribution, SpanRecord, parse_int
from latscope.semconv import (
    BUCKETS,
    SGLANG_STAGES,
    ClientAttributes,
    GenAIAttributes,
    GenAIOperation,
    HttpAttributes,
    LatscopeAttributes,
    Phase,
    SpanKind,
    VllmAttributes,
)

#: Overlapping phases: the first listed wins the overlapping time. The work nearest the GPU is
#: what the request was waiting on (a queue span that wraps the whole request must not hide the
#: prefill and decode inside it).
PHASE_PRIORITY: tuple[str, ...] = (
    Phase.DECODE,
    Phase.PREFILL,
    Phase.PREPROCESS,
    Phase.POSTPROCESS,
    Phase.QUEUE,
)
#: Rank of attempt windows ("other") and of uncovered client time ("network") after the phases.
OTHER_RANK = len(PHASE_PRIORITY)
NETWORK_RANK = OTHER_RANK + 1
RANK: dict[str, int] = {p: i for i, p in enumerate(PHASE_PRIORITY)}

#: How far below its server span a phase span may sit.
MAX_PHASE_DEPTH = 8
#: How far up a span's ancestry the rules look (the client of an inference span, the tool call
#: around a server span, ...): deeper than any real call chain, a bound against cycles.
MAX_ANCESTRY = 32
#: The client span and at most this many CLIENT spans directly above it give the request's
#: client-side attributes (openai-v2's ``chat`` span over an httpx span).
CLIENT_CHAIN = 3

#: Default gap between two tokens that counts as a stall.
DEFAULT_STALL_NS = 250_000_000

GPU_KEYS: dict[str, str] = {
    LatscopeAttributes.GPU_UTIL_MEAN: "utilization_mean",
    LatscopeAttributes.GPU_UTIL_MAX: "utilization_max",
    LatscopeAttributes.GPU_MEMORY_USED_MAX: "memory_used_max",
    LatscopeAttributes.GPU_POWER_MEAN: "power_mean",
    LatscopeAttributes.GPU_SM_CLOCK: "sm_clock",
    LatscopeAttributes.GPU_ENERGY_MJ: "energy_mj",
}
GPU_PHASES = (Phase.PREFILL, Phase.DECODE)

#: Any of these on a span makes it an inference span (vLLM's ``llm_request``, SGLang's root).
LATENCY_KEYS = (
    VllmAttributes.TIME_IN_QUEUE,
    VllmAttributes.TIME_TO_FIRST_TOKEN,
    VllmAttributes.TIME_IN_MODEL_PREFILL,
    VllmAttributes.TIME_IN_MODEL_DECODE,
    VllmAttributes.E2E,
)

#: Token counts outside this range are not believed (the table stores UInt32).
MAX_TOKENS = 2**32 - 1


#: A figure in seconds reads as at most this many (11.6 days) in magnitude, so that every time the
#: rules derive from a few of them stays far inside Int64 ns, in Python as in SQL.
MAX_SECONDS = 1e6


def seconds_to_ns(value: float) -> int:
    """vLLM's float seconds -> integer ns, rounded half up (the SQL attributor rounds the same),
    the seconds clamped to [-MAX_SECONDS, MAX_SECONDS]."""
    return math.floor(min(max(value, -MAX_SECONDS), MAX_SECONDS) * 1e9 + 0.5)


def sweep(window: tuple[int, int], phases: Sequence[tuple[str, int, int]]) -> dict[str, int]:
    """Split ``window`` among ``(phase, start, end)`` intervals by priority; the rest is other.

    >>> sweep((0, 100), [("queue", 0, 50), ("prefill", 40, 70)])
    {'queue': 40, 'preprocess': 0, 'prefill': 30, 'decode': 0, 'postprocess': 0, 'other': 30}
    """
    ranked = [(RANK[n], s, e) for n, s, e in phases if n in RANK]
    ranked.append((OTHER_RANK, *window))
    out = dict.fromkeys(BUCKETS[1:], 0)
    for r, a, b in ranked_segments(window, ranked):
        out[rank_name(r, client=False)] += b - a
    return out


def rank_name(rank: int, *, client: bool) -> str:
    if rank < OTHER_RANK:
        return PHASE_PRIORITY[rank]
    return "network" if rank == NETWORK_RANK and client else "other"


def ranked_segments(
    window: tuple[int, int], intervals: Sequence[tuple[int, int, int]]
) -> list[tuple[int, int, int]]:
    """Elementary-segment sweep: ``window`` cut at every interval end, each piece ``(rank, a, b)``
    labelled with the lowest rank covering it (``NETWORK_RANK`` where none does)."""
    lo, hi = window
    if hi <= lo:
        return []
    clipped = [(r, max(s, lo), min(e, hi)) for r, s, e in intervals]
    clipped = [c for c in clipped if c[2] > c[1]]
    cuts = sorted({lo, hi, *(c[1] for c in clipped), *(c[2] for c in clipped)})
    out = []
    for a, b in itertools.pairwise(cuts):
        ranks = [r for r, s, e in clipped if s <= a and e >= b]
        out.append((min(ranks) if ranks else NETWORK_RANK, a, b))
    return out


def linear_quantile(values: Sequence[float], q: float) -> float:
    """Quantile with linear interpolation between order statistics (numpy's and polars' default)."""
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    i = math.floor(pos)
    if i + 1 >= len(ordered):
        return float(ordered[-1])
    return float(ordered[i] + (ordered[i + 1] - ordered[i]) * (pos - i))


#: What ``token_figures`` gives, by position.
FIRST_OFFSET_US, TPOT_NS, ITL_P50_NS, ITL_P99_NS, ITL_MAX_NS, STALLS, TOKENS = range(7)


def token_figures(offsets_us: Sequence[int], stall_threshold_ns: int) -> list[float]:
    """The streaming figures of a decode span's token offsets (us from its start; not empty):
    the first offset (us), TPOT, ITL p50 / p99 / max (ns), the gaps longer than
    ``stall_threshold_ns`` and the number of tokens, indexed by ``FIRST_OFFSET_US`` .. ``TOKENS``.
    With one token there are no gaps, and the four gap figures are 0. Every figure is a double
    computed as ClickHouse and C compute it (TPOT: the span's length, rounded to a double, over
    the gaps), so the three give the same bits.

    The one arithmetic of these figures: the rules (``_streaming``) read them from here, the
    collector stores them with each span at the default stall threshold (its C decoder by the
    same operations, a test holds the two equal), and the SQL attributor reads those or computes
    them from the offsets by the same formulas (``latscope.attribution.sql.token_figures``)."""
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(offsets_us)]
    if not gaps:
        return [float(offsets_us[0]), 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    return [
        float(offsets_us[0]),
        float((offsets_us[-1] - offsets_us[0]) * 1000) / len(gaps),
        linear_quantile(gaps, 0.5),
        linear_quantile(gaps, 0.99),
        float(max(gaps)),
        float(sum(1 for g in gaps if g > stall_threshold_ns)),
        float(len(offsets_us)),
    ]


# -- which spans make each request ---------------------------------------------------------------


def has_latency(span: SpanRecord) -> bool:
    """The span carries vLLM / SGLang ``gen_ai.latency.*`` figures."""
    # Most spans carry none of the keys: one set test (in C) answers for them.
    if span.attributes.keys().isdisjoint(LATENCY_KEYS):
        return False
    return any(span.attr_float(k) is not None for k in LATENCY_KEYS)


def _server_like(span: SpanRecord) -> bool:
    return span.kind == SpanKind.SERVER or has_latency(span)


@dataclass(frozen=True)
class Request:
    """The spans of one inference call: its client span (if seen), its attempts oldest first
    (start, then span id) and each attempt's phases as ``(bucket, span)``."""

    client: SpanRecord | None
    attempts: tuple[SpanRecord, ...]
    phases: dict[str, tuple[tuple[str, SpanRecord], ...]]
    #: The client span and the CLIENT spans directly above it, nearest first.
    client_chain: tuple[SpanRecord, ...] = ()

    @property
    def span_id(self) -> str:
        return self.client.span_id if self.client is not None else self.attempts[0].span_id

    @property
    def start_ns(self) -> int:
        return self.client.start_ns if self.client is not None else self.attempts[0].start_ns


class TraceIndex:
    """Parent and child lookups over one trace's spans (span ids unique)."""

    def __init__(self, spans: Sequence[SpanRecord]) -> None:
        self.spans = spans
        self.by_id = {s.span_id: s for s in spans}
        self.children: dict[str, list[SpanRecord]] = {}
        for s in spans:
            self.children.setdefault(s.parent_span_id, []).append(s)

    def ancestors(self, span: SpanRecord, limit: int = MAX_ANCESTRY) -> Iterator[SpanRecord]:
        """Parent, grandparent, ... at most ``limit`` of them, while they are stored."""
        parent = span.parent_span_id
        for _ in range(limit):
            node = self.by_id.get(parent)
            if node is None:
                return
            yield node
            parent = node.parent_span_id


def _phase_owner(index: TraceIndex, span: SpanRecord) -> tuple[str, str] | None:
    """(bucket, owning span id) when ``span`` is a phase of some inference span."""
    phase = span.attributes.get(LatscopeAttributes.PHASE)
    stage = None if phase in Phase.ALL else SGLANG_STAGES.get(span.name)
    if phase not in Phase.ALL and stage is None:
        return None
    for node in index.ancestors(span, MAX_PHASE_DEPTH):
        if _server_like(node):
            if stage is not None and not has_latency(node):
                return None  # a span named like an SGLang stage outside an SGLang request
            return (phase if phase in Phase.ALL else stage), node.span_id  # type: ignore[return-value]
    return None


def _client_of(index: TraceIndex, span: SpanRecord) -> SpanRecord | None:
    """The nearest CLIENT ancestor, reached without crossing a server of another service: a
    client above a RAG front end called that front end, not the model server behind it, but an
    HTTP framework's SERVER span around the inference span in the same service is crossed."""
    for node in index.ancestors(span):
        if node.kind == SpanKind.CLIENT:
            return node
        if _server_like(node) and node.service != span.service:
            return None
    return None


def _in_tool_call(index: TraceIndex, span: SpanRecord) -> bool:
    return any(
        node.attributes.get(GenAIAttributes.OPERATION_NAME) == GenAIOperation.EXECUTE_TOOL
        for node in index.ancestors(span)
    )


def find_requests(spans: Sequence[SpanRecord]) -> list[Request]:
    """Every inference call of a trace, by start (client's, else the server's), then id."""
    index = TraceIndex(spans)
    owned: dict[str, list[tuple[str, SpanRecord]]] = {}
    for s in spans:
        found = _phase_owner(index, s)
        if found is not None:
            owned.setdefault(found[1], []).append((found[0], s))
    inference = [s for s in spans if has_latency(s) or (s.span_id in owned and _server_like(s))]
    if not inference:
        # No server says it ran a model: a SERVER span called by a client is taken for one,
        # except inside a tool call, and only the innermost of a chain (a gateway in front of
        # the model server is not a second call).
        called = [
            s
            for s in spans
            if s.kind == SpanKind.SERVER
            and _client_of(index, s) is not None
            and not _in_tool_call(index, s)
        ]
        above = {a.span_id for s in called for a in index.ancestors(s)}
        inference = [s for s in called if s.span_id not in above]
    groups: dict[str, list[SpanRecord]] = {}
    clients: dict[str, SpanRecord | None] = {}
    for s in inference:
        client = _client_of(index, s)
        key = client.span_id if client is not None else s.span_id
        groups.setdefault(key, []).append(s)
        clients[key] = client
    requests = []
    for key, attempts in groups.items():
        client = clients[key]
        chain: list[SpanRecord] = []
        if client is not None:
            chain.append(client)
            for node in index.ancestors(client, CLIENT_CHAIN - 1):
                if node.kind != SpanKind.CLIENT:
                    break
                chain.append(node)
        ordered = tuple(sorted(attempts, key=lambda a: (a.start_ns, a.span_id)))
        phases = {a.span_id: tuple(owned.get(a.span_id, ())) for a in ordered}
        requests.append(Request(client, ordered, phases, tuple(chain)))
    return sorted(requests, key=lambda r: (r.start_ns, r.span_id))


def attempt_groups(attempts: Sequence[SpanRecord]) -> list[list[SpanRecord]]:
    """Attempts (oldest first) in groups that overlap in time: each group is one try, the
    parallel samples of vLLM's ``n > 1`` in one group, a retry starts a new group."""
    groups: list[list[SpanRecord]] = []
    end = 0
    for a in attempts:
        if groups and a.start_ns < end:
            groups[-1].append(a)
            end = max(end, a.end_ns)
        else:
            groups.append([a])
            end = a.end_ns
    return groups


def critical_attempts(attempts: Sequence[SpanRecord]) -> list[SpanRecord]:
    """Of each try, the attempt that ended last (then started last, then by span id): the one
    the response waited for. vLLM's ``n > 1`` samples run side by side and the response is
    complete when the last one is; the others' queue and decode are not on its critical path."""
    return [
        max(group, key=lambda a: (a.end_ns, a.start_ns, a.span_id))
        for group in attempt_groups(attempts)
    ]


# -- attributing one request ---------------------------------------------------------------------


def synthetic_phases(server: SpanRecord) -> list[tuple[str, int, int]]:
    """vLLM / SGLang latency figures as phases, anchored at the first token (every figure there
    ends or starts at it: vLLM's prefill runs from scheduling to the first token, its queue
    before that; SGLang's prefill from dispatch to the first token)."""
    q = server.attr_float(VllmAttributes.TIME_IN_QUEUE)
    ttft = server.attr_float(VllmAttributes.TIME_TO_FIRST_TOKEN)
    prefill = server.attr_float(VllmAttributes.TIME_IN_MODEL_PREFILL)
    decode = server.attr_float(VllmAttributes.TIME_IN_MODEL_DECODE)
    e2e = server.attr_float(VllmAttributes.E2E)
    q_ns = seconds_to_ns(q) if q is not None else 0
    if ttft is not None:
        ttft_ns = seconds_to_ns(ttft)
        prefill_ns = seconds_to_ns(prefill) if prefill is not None else max(0, ttft_ns - q_ns)
    else:
        prefill_ns = seconds_to_ns(prefill) if prefill is not None else 0
        ttft_ns = q_ns + prefill_ns
    if decode is not None:
        decode_ns = seconds_to_ns(decode)
    elif e2e is not None and ttft is not None:
        decode_ns = max(0, seconds_to_ns(e2e) - ttft_ns)  # older vLLM: no prefill/decode split
    else:
        decode_ns = 0
    s = server.start_ns
    return [
        (Phase.QUEUE, s + ttft_ns - prefill_ns - q_ns, s + ttft_ns - prefill_ns),
        (Phase.PREFILL, s + ttft_ns - prefill_ns, s + ttft_ns),
        (Phase.DECODE, s + ttft_ns, s + ttft_ns + decode_ns),
    ]


def _says_whole_response(client: SpanRecord) -> bool:
    """latscope's client records when it read the last byte: its span is the whole response."""
    return client.attr_int(ClientAttributes.LAST_BYTE_NS) is not None


@dataclass(frozen=True)
class Timeline:
    """A request on the client's clock: its window, the server clock's offset, and whether the
    client span ended at the response headers."""

    lo: int
    hi: int
    offset: int
    headers_only: bool


def timeline(request: Request) -> Timeline:
    attempts, client = request.attempts, request.client
    hull_lo = min(a.start_ns for a in attempts)
    hull_hi = max(a.end_ns for a in attempts)
    if client is None:
        return Timeline(attempts[0].start_ns, attempts[0].end_ns, 0, False)
    lo, dur = client.start_ns, client.duration_ns
    if hull_lo >= lo and hull_hi <= client.end_ns:
        return Timeline(lo, client.end_ns, 0, False)
    if hull_hi - hull_lo <= dur:
        return Timeline(lo, client.end_ns, lo + (dur - (hull_hi - hull_lo)) // 2 - hull_lo, False)
    if not _says_whole_response(client):
        # Headers-only: the server sent the headers as it started, half-way through the client
        # span; the response then came back over the same leg.
        offset = lo + dur // 2 - hull_lo
        return Timeline(lo, hull_hi + offset + (dur - dur // 2), offset, True)
    return Timeline(lo, client.end_ns, lo - hull_lo, False)


def request_segments(request: Request) -> tuple[Timeline, list[tuple[str, int, int]]]:
    """The request's timeline cut into ``(bucket, start, end)`` pieces on the client's clock
    (``other`` for server time and ``network`` for the rest when there is no client span)."""
    tl = timeline(request)
    intervals: list[tuple[int, int, int]] = []
    for attempt in critical_attempts(request.attempts):
        a_lo = max(attempt.start_ns + tl.offset, tl.lo)
        a_hi = min(attempt.end_ns + tl.offset, tl.hi)
        intervals.append((OTHER_RANK, a_lo, a_hi))
        mine = request.phases[attempt.span_id]
        raw = [(name, p.start_ns, p.end_ns) for name, p in mine]
        if not mine and has_latency(attempt):
            raw = synthetic_phases(attempt)
        for name, s, e in raw:
            intervals.append((RANK[name], max(s + tl.offset, a_lo), min(e + tl.offset, a_hi)))
    has_client = request.client is not None
    pieces = [
        (rank_name(r, client=has_client), a, b)
        for r, a, b in ranked_segments((tl.lo, tl.hi), intervals)
    ]
    return tl, pieces


def _merged_attributes(request: Request) -> dict[str, str]:
    """Client-side attributes (outermost first, so the nearest wins), then the last attempt's,
    which win over the client's. Empty values count as absent (the spans table cannot tell
    them apart)."""
    merged: dict[str, str] = {}
    for span in (*reversed(request.client_chain), request.attempts[-1]):
        merged.update((k, v) for k, v in span.attributes.items() if v != "")
    return merged


def _tokens(attrs: dict[str, str], *keys: str) -> int | None:
    """The first of ``keys`` that holds a number, truncated, if within [0, MAX_TOKENS]."""
    for key in keys:
        value = parse_int(attrs.get(key))
        if value is not None:
            return value if 0 <= value <= MAX_TOKENS else None
    return None


def _output_tokens(request: Request, merged: dict[str, str]) -> int | None:
    """The last try's output tokens: summed over its parallel samples (vLLM ``n > 1``), else
    what the client side says."""
    last = attempt_groups(request.attempts)[-1]
    counts = [
        n
        for a in last
        if (
            n := _tokens(
                a.attributes,
                GenAIAttributes.USAGE_OUTPUT_TOKENS,
                GenAIAttributes.USAGE_COMPLETION_TOKENS,
            )
        )
        is not None
    ]
    if counts:
        return min(sum(counts), MAX_TOKENS)
    client_side: dict[str, str] = {}
    for span in reversed(request.client_chain):
        client_side.update((k, v) for k, v in span.attributes.items() if v != "")
    return _tokens(
        client_side, GenAIAttributes.USAGE_OUTPUT_TOKENS, GenAIAttributes.USAGE_COMPLETION_TOKENS
    )


def attribute_request(
    trace_id: str,
    request: Request,
    *,
    stall_threshold_ns: int = DEFAULT_STALL_NS,
    segments: tuple[Timeline, list[tuple[str, int, int]]] | None = None,
) -> RequestAttribution:
    """One request's buckets, streaming figures, tokens, skew and GPU figures; ``segments``:
    its ``request_segments``, when the caller has them already."""
    tl, pieces = segments or request_segments(request)
    buckets: dict[str, int | None] = dict.fromkeys(BUCKETS, 0)
    for name, a, b in pieces:
        buckets[name] = (buckets[name] or 0) + (b - a)
    if request.client is None:
        buckets["network"] = None
    last = request.attempts[-1]
    attrs = _merged_attributes(request)
    result = RequestAttribution(
        trace_id=trace_id,
        request_span_id=request.span_id,
        start_ns=tl.lo,
        service=last.service,
        model=attrs.get(GenAIAttributes.REQUEST_MODEL)
        or attrs.get(GenAIAttributes.RESPONSE_MODEL)
        or "",
        operation=attrs.get(GenAIAttributes.OPERATION_NAME, ""),
        route=attrs.get(HttpAttributes.ROUTE, ""),
        e2e_ns=tl.hi - tl.lo,
        buckets_ns=buckets,
        has_client=request.client is not None,
        attempts=len(attempt_groups(request.attempts)),
        status=last.status,
        clock_skew_ns=-tl.offset,
        resource_attributes=dict(last.resource),
        provider=attrs.get(GenAIAttributes.PROVIDER_NAME)
        or attrs.get(GenAIAttributes.SYSTEM)
        or "",
        headers_only=tl.headers_only,
    )
    result.input_tokens = _tokens(
        attrs, GenAIAttributes.USAGE_INPUT_TOKENS, GenAIAttributes.USAGE_PROMPT_TOKENS
    )
    result.output_tokens = _output_tokens(request, attrs)
    _streaming(result, request, stall_threshold_ns)
    _gpu(result, request)
    return result


def attribute_requests(
    trace_id: str, spans: Sequence[SpanRecord], *, stall_threshold_ns: int = DEFAULT_STALL_NS
) -> list[RequestAttribution]:
    """Every request of a trace, attributed; [] when the trace holds no inference call.

    ``spans`` must not repeat a span id (``load_trace`` drops repeats).
    """
    return [
        attribute_request(trace_id, r, stall_threshold_ns=stall_threshold_ns)
        for r in find_requests(spans)
    ]


def _last_by_start(spans: Sequence[SpanRecord]) -> SpanRecord | None:
    return max(spans, key=lambda s: (s.start_ns, s.span_id), default=None)


def timed_decode(request: Request) -> tuple[SpanRecord, SpanRecord] | None:
    """(decode span, its attempt): the request's last decode phase span with token offsets.
    The one rule for which decode span's tokens are the request's (attribution, the token
    timeline and the SQL attributor all use it)."""
    candidates = [
        (p, a)
        for a in request.attempts
        for name, p in request.phases[a.span_id]
        if name == Phase.DECODE and p.attr_int_list(LatscopeAttributes.TOKEN_OFFSETS_US)
    ]
    if not candidates:
        return None
    return max(candidates, key=lambda pa: (pa[0].start_ns, pa[0].span_id))


def _streaming(result: RequestAttribution, request: Request, stall_threshold_ns: int) -> None:
    """TTFT (client and server), TPOT, inter-token latency and stalls."""
    found = timed_decode(request)
    last = request.attempts[-1]
    if found is not None:
        decode, attempt = found
        offsets = decode.attr_int_list(LatscopeAttributes.TOKEN_OFFSETS_US)
        figures = token_figures(offsets, stall_threshold_ns)
        result.ttft_server_ns = decode.start_ns + offsets[0] * 1000 - attempt.start_ns
        if result.output_tokens is None:
            count = decode.attr_int(LatscopeAttributes.TOKEN_COUNT)
            result.output_tokens = count if count and 0 < count <= MAX_TOKENS else len(offsets)
        if len(offsets) > 1:
            result.tpot_ns = figures[TPOT_NS]
            result.itl_ns = {
                "p50": figures[ITL_P50_NS],
                "p99": figures[ITL_P99_NS],
                "max": figures[ITL_MAX_NS],
            }
            result.stalls = int(figures[STALLS])
    else:
        # The earliest first token of the last try (vLLM's n > 1 samples start together).
        firsts = [
            seconds_to_ns(t)
            for a in attempt_groups(request.attempts)[-1]
            if (t := a.attr_float(VllmAttributes.TIME_TO_FIRST_TOKEN)) is not None
        ]
        if firsts:
            result.ttft_server_ns = min(firsts)
        ttft = last.attr_float(VllmAttributes.TIME_TO_FIRST_TOKEN)
        if ttft is not None:
            decode_ns = None
            decode_s = last.attr_float(VllmAttributes.TIME_IN_MODEL_DECODE)
            e2e_s = last.attr_float(VllmAttributes.E2E)
            if decode_s is not None:
                decode_ns = seconds_to_ns(decode_s)
            elif e2e_s is not None:
                decode_ns = max(0, seconds_to_ns(e2e_s) - seconds_to_ns(ttft))
            own = _tokens(
                last.attributes,
                GenAIAttributes.USAGE_OUTPUT_TOKENS,
                GenAIAttributes.USAGE_COMPLETION_TOKENS,
            )
            if decode_ns is not None and own is not None and own > 1:
                result.tpot_ns = decode_ns / (own - 1)
    client = request.client
    if client is not None:
        result.ttft_client_ns = _client_ttft(request, client)


def _client_ttft(request: Request, client: SpanRecord) -> int | None:
    """latscope's first-token attribute or event on the client span, else the GenAI
    ``time_to_first_chunk`` of the client chain (seconds from the span that carries it)."""
    first = client.attr_int(LatscopeAttributes.FIRST_TOKEN_NS)
    if first is None:
        first = min(
            (t for n, t in client.events if n == LatscopeAttributes.FIRST_TOKEN_EVENT),
            default=None,
        )
    if first is not None:
        return first - client.start_ns
    for span in request.client_chain:
        chunk = span.attr_float(GenAIAttributes.RESPONSE_TIME_TO_FIRST_CHUNK)
        if chunk is not None:
            return span.start_ns + seconds_to_ns(chunk) - client.start_ns
    return None


def _gpu(result: RequestAttribution, request: Request) -> None:
    """GPU figures of the (last) prefill and decode phase spans."""
    phases = [(name, p) for a in request.attempts for name, p in request.phases[a.span_id]]
    for phase in GPU_PHASES:
        span = _last_by_start(
            [
                p
                for name, p in phases
                if name == phase and any(p.attr_float(k) is not None for k in GPU_KEYS)
            ]
        )
        if span is None:
            continue
        result.gpu[phase] = {
            name: value
            for key, name in GPU_KEYS.items()
            if (value := span.attr_float(key)) is not None
        }
