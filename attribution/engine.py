"""Per-request attribution: one trace's spans -> its inference calls, each in seven buckets.

This is the reference implementation, written for clarity: the REST endpoints for one request or
one trace use it, and the production attributor (SQL inside ClickHouse, ``attribution/sql/``) is
tested against it. The rules are documented in docs/attribution.md; in short:

1. **Requests, not traces.** A trace holds any number of inference calls, each found on evidence.
   An *engine span* owns phase spans (it is the nearest SERVER or ``gen_ai.latency``-carrying
   ancestor of a ``latscope.phase`` span, or of an SGLang stage slice, at most
   ``MAX_PHASE_DEPTH`` levels up) or carries ``gen_ai.latency.*`` whatever its kind (vLLM's
   ``llm_request``, SGLang's request root). A SERVER span without either is an inference call
   when something says so: ``gen_ai.request.model`` or a model ``gen_ai.operation.name`` on it,
   an inference route (``INFERENCE_ROUTES``), or a GenAI client operation above it; such a span
   that holds another inference span (a gateway, the HTTP framework around an engine) is not one
   itself. A plain HTTP service (retrieval, a reranker, usage recording) is none.
2. **The call as the app made it.** An inference span's *transport* is its nearest CLIENT
   ancestor, reached without crossing a server of another service; above it, the spans of the
   same call (CLIENT spans and GenAI client operations: openai-v2's ``chat``, OpenInference's
   LLM span, traceloop's ``openai.chat``), at most ``CLIENT_CHAIN`` in all, form its *client
   chain*, and the outermost GenAI operation among them (else the transport) is the request's
   *client*. Every inference span under one client is an *attempt* of that request: the HTTP
   requests under one GenAI call are its retries, and vLLM's ``n > 1`` samples (which overlap)
   count as one try. A request's id is its client's span id, else its inference span's, after
   the trace id.
3. **The server side of an attempt** is its *window*: the model service's outermost SERVER span
   around the inference span (the HTTP framework's span around vLLM's ``llm_request``; the span
   itself when there is none), cut at the end of the response when the ASGI instrumentation
   recorded when its last body message was sent: work after the response is not the request's.
4. **Clock skew.** Attempts are on the server's clock, the client span on the client's. When the
   windows' hull fits inside the client span as recorded, nothing moves (skew 0); nor when the
   server started after the client and its phases and response ended before the client's end (the
   span's end past it is teardown, clipped). When the hull is shorter than the client span but
   does not fit: a misfit no larger than the room the network legs leave is unequal legs (moved
   the least that fits, skew 0), a larger one is skew (the hull is centred, as Jaeger's adjuster
   does). When the hull is longer, the client span is *headers-only* only on evidence: the
   server's phases or response ran past the client's end even with the server started at the
   client's start, and the client does not say it read the whole response (latscope's client
   records its last byte; a GenAI operation ends with the call). Then the server started half-way
   through the client span and the request runs to the server's end plus the same return leg.
   Otherwise the excess is work after the response (the server is moved only when it started
   before the client). ``clock_skew_ns`` is how far the server's clock runs ahead.
5. **Sweep.** The timeline is the client span (extended when headers-only; else the window).
   Every instant goes to the highest-priority phase covering it (``PHASE_PRIORITY``), else to a
   KV-cache transfer stage (``other``, also counted as ``kv_transfer_ns``), else to ``other``
   when a window covers it, else to ``network`` (client time outside every window: wire,
   proxies, retry back-off). Phases are clipped to their window, windows to the timeline.
   Without a client span ``network`` is None. Of each try, the attempt that ended last is swept,
   except under prefill/decode disaggregation, where the prefill worker's and the decode
   worker's attempts are both parts of the one request.
6. **vLLM / SGLang.** An engine span with no phase spans but ``gen_ai.latency.*`` attributes gets
   synthetic phases anchored at its first token: prefill ``[ttft - prefill, ttft]``, queue just
   before it, decode ``[ttft, ttft + decode]`` (decode = e2e - ttft where the split is missing).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from latscope.attribution import rules
from latscope.attribution.finding import (
    CLIENT_CHAIN,
    MAX_ANCESTRY,
    MAX_PHASE_DEPTH,
    Request,
    TraceIndex,
    _disaggregated,
    _samples,
    disaggregated_role,
    find_requests,
)
from latscope.attribution.model import RequestAttribution, SpanRecord, parse_int
from latscope.attribution.timeline import (
    KV_RANK,
    NETWORK_RANK,
    OTHER_RANK,
    PHASE_PRIORITY,
    RANK,
    Timeline,
    attempt_phases,
    named_pieces,
    rank_name,
    ranked_pieces,
    ranked_segments,
    sweep,
    synthetic_phases,
    timeline,
)
from latscope.semconv import (
    BUCKETS,
    KV_TRANSFER,
    STREAM_PARAMETER,
    GenAIAttributes,
    GenAIEvents,
    HttpAttributes,
    LatscopeAttributes,
    OpenInferenceAttributes,
    Phase,
    VllmAttributes,
)
from latscope.tokens import (
    DEFAULT_STALL_NS,
    ITL_MAX_NS,
    ITL_P50_NS,
    ITL_P99_NS,
    STALLS,
    TPOT_NS,
    token_figures,
)

#: What the reference engine gives, with the names of the request finding
#: (``latscope.attribution.finding``) and the sweep (``latscope.attribution.timeline``) that its
#: callers import from here.
__all__ = [
    "CLIENT_CHAIN",
    "DEFAULT_STALL_NS",
    "GPU_KEYS",
    "GPU_PHASES",
    "KV_RANK",
    "LATENCY_KEYS",
    "MAX_ANCESTRY",
    "MAX_PHASE_DEPTH",
    "MAX_SECONDS",
    "MAX_TOKENS",
    "NETWORK_RANK",
    "OTHER_RANK",
    "PHASE_PRIORITY",
    "RANK",
    "Request",
    "Timeline",
    "TraceIndex",
    "attempt_phases",
    "attribute_request",
    "attribute_requests",
    "find_requests",
    "first_chunk_event",
    "named_pieces",
    "rank_name",
    "ranked_pieces",
    "ranked_segments",
    "seconds_to_ns",
    "streamed",
    "sweep",
    "synthetic_phases",
    "timed_decode",
    "timeline",
    "token_figures",
]


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


def _kv_transfer(request: Request, ranked: Sequence[tuple[int, int, int]]) -> int | None:
    """The request's time in a KV-cache transfer stage no phase covers; None when none of its
    swept attempts records a transfer."""
    recorded = any(
        name == KV_TRANSFER
        for a in request.critical
        for name in (
            *(n for n, _ in request.phases[a.span_id]),
            *(n for n, _, _ in synthetic_phases(a, stages=bool(request.phases[a.span_id]))),
            *(n for n, _, _ in request.parts.get(a.span_id, ())),
        )
    )
    if not recorded:
        return None
    return sum(b - a for r, a, b in ranked if r == KV_RANK)


def _merged_attributes(request: Request) -> dict[str, str]:
    """Client-side attributes (outermost first, so the nearest wins), then the last attempt's
    window's (the HTTP framework's ``http.route``), then the last attempt's own, which win over
    both. Empty values count as absent (the spans table cannot tell them apart)."""
    merged: dict[str, str] = {}
    last = request.attempts[-1]
    for span in (*reversed(request.client_chain), request.window(last), last):
        merged.update((k, v) for k, v in span.attributes.items() if v != "")
    return merged


def _tokens(attrs: dict[str, str], *keys: str) -> int | None:
    """The first of ``keys`` that holds a number, truncated, if within [0, MAX_TOKENS]."""
    for key in keys:
        value = parse_int(attrs.get(key))
        if value is not None:
            return value if 0 <= value <= MAX_TOKENS else None
    return None


#: Token counts by every spelling in use, preferred first: the GenAI conventions' current and
#: older names, then OpenInference's.
INPUT_TOKEN_KEYS = (
    GenAIAttributes.USAGE_INPUT_TOKENS,
    GenAIAttributes.USAGE_PROMPT_TOKENS,
    OpenInferenceAttributes.TOKEN_COUNT_PROMPT,
)
OUTPUT_TOKEN_KEYS = (
    GenAIAttributes.USAGE_OUTPUT_TOKENS,
    GenAIAttributes.USAGE_COMPLETION_TOKENS,
    OpenInferenceAttributes.TOKEN_COUNT_COMPLETION,
)


def _input_tokens(request: Request, attrs: dict[str, str]) -> int | None:
    """The prompt's tokens: of a try in parts, its prefill part's (its prefill role, else the
    part that started first), which read the prompt; else the merged attributes' (a decode
    worker's own count is of the prompt it was handed)."""
    last = request.tries[-1]
    if _disaggregated(last, request):
        roles = [a for a in last if disaggregated_role(a) is not None]
        prefill = (
            [a for a in roles if disaggregated_role(a) == "prefill"][:1] if roles else last[:1]
        )
        for part in prefill:
            own = _tokens(part.attributes, *INPUT_TOKEN_KEYS)
            if own is not None:
                return own
    return _tokens(attrs, *INPUT_TOKEN_KEYS)


def _output_tokens(request: Request) -> int | None:
    """The last try's output tokens: summed over its samples (vLLM ``n > 1``; the decode
    worker's when disaggregated), else what the client side says."""
    samples = _samples(request)
    if (
        len(samples) > 1
        and any(a.span_id in request.in_system for a in samples)
        and not any(disaggregated_role(a) is not None for a in samples)
    ):
        # A serving system's parts: the last one answered (the decode side's tokens; the
        # prefill side's first token went to it).
        samples = [max(samples, key=lambda a: (a.end_ns, a.start_ns, a.span_id))]
    counts = [n for a in samples if (n := _tokens(a.attributes, *OUTPUT_TOKEN_KEYS)) is not None]
    if counts:
        return min(sum(counts), MAX_TOKENS)
    client_side: dict[str, str] = {}
    for span in reversed(request.client_chain):
        client_side.update((k, v) for k, v in span.attributes.items() if v != "")
    return _tokens(client_side, *OUTPUT_TOKEN_KEYS)


_STREAM_PARAMETER = re.compile(STREAM_PARAMETER)


def streamed(request: Request) -> bool | None:
    """Whether the client asked for a streamed response, where its chain says (nearest first):
    ``gen_ai.request.stream``, traceloop's ``gen_ai.is_streaming``, OpenInference's invocation
    parameters; None where nothing says."""
    for span in request.client_chain:
        for key in (GenAIAttributes.REQUEST_STREAM, GenAIAttributes.IS_STREAMING):
            value = span.attributes.get(key, "").lower()
            if value in ("true", "false"):
                return value == "true"
        params = span.attributes.get(OpenInferenceAttributes.INVOCATION_PARAMETERS, "")
        if params:
            return _STREAM_PARAMETER.search(params) is not None
    return None


def attribute_request(
    trace_id: str,
    request: Request,
    *,
    stall_threshold_ns: int = DEFAULT_STALL_NS,
    pieces: tuple[Timeline, list[tuple[int, int, int]]] | None = None,
) -> RequestAttribution:
    """One request's buckets, streaming figures, tokens, skew and GPU figures; ``pieces``: its
    ``ranked_pieces``, when the caller has them already."""
    tl, ranked = pieces or ranked_pieces(request)
    has_client = request.client is not None
    buckets: dict[str, int | None] = dict.fromkeys(BUCKETS, 0)
    for r, a, b in ranked:
        name = rank_name(r, client=has_client)
        buckets[name] = (buckets[name] or 0) + (b - a)
    if not has_client:
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
        has_client=has_client,
        attempts=len(request.tries),
        status=request.window(last).status,
        clock_skew_ns=tl.skew,
        resource_attributes=dict(last.resource),
        provider=attrs.get(GenAIAttributes.PROVIDER_NAME)
        or attrs.get(GenAIAttributes.SYSTEM)
        or "",
        headers_only=tl.headers_only,
        kv_transfer_ns=_kv_transfer(request, ranked),
    )
    result.input_tokens = _input_tokens(request, attrs)
    result.output_tokens = _output_tokens(request)
    _streaming(result, request, stall_threshold_ns)
    if streamed(request) is False:
        # A call made without streaming has no first token the client saw: it stays out of
        # every TTFT figure and objective.
        result.ttft_client_ns = result.ttft_server_ns = None
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
    found = _timed_offsets(request)
    return None if found is None else (found[0], found[1])


def _timed_offsets(request: Request) -> tuple[SpanRecord, SpanRecord, list[int]] | None:
    """``timed_decode``'s (decode span, its attempt) and the decode span's token offsets."""
    candidates = [
        (p, a, offsets)
        for a in request.attempts
        for name, p in request.phases[a.span_id]
        if name == Phase.DECODE
        and (offsets := p.attr_int_list(LatscopeAttributes.TOKEN_OFFSETS_US))
    ]
    if not candidates:
        return None
    return max(candidates, key=lambda pa: (pa[0].start_ns, pa[0].span_id))


def _streaming(result: RequestAttribution, request: Request, stall_threshold_ns: int) -> None:
    """TTFT (client and server), TPOT, inter-token latency and stalls."""
    found = _timed_offsets(request)
    last = request.attempts[-1]
    if found is not None:
        decode, attempt, offsets = found
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
        # The earliest first token of the last try's samples (vLLM's n > 1 samples start
        # together; a disaggregated request's is the decode worker's), from the try's start.
        samples = _samples(request)
        # From the try's start: under a serving system, its span's (the request reached the
        # system there), else the first sample's.
        try_lo = min(
            (
                request.bounds(a)[0] if a.span_id in request.in_system else a.start_ns
                for a in samples
            ),
            default=0,
        )
        firsts = [
            a.start_ns - try_lo + t
            for a in samples
            if (t := _engine_first_token(request, a)) is not None
        ]
        if firsts:
            result.ttft_server_ns = min(firsts)
        engine = rules.active().engine_of(last)
        decode_ns = None if engine is None else engine.tpot_decode_ns(last)
        own = _tokens(last.attributes, *OUTPUT_TOKEN_KEYS[:2])
        if decode_ns is not None and own is not None and own > 1:
            result.tpot_ns = decode_ns / (own - 1)
    if request.client is not None:
        result.ttft_client_ns = _client_ttft(request, request.client)


def _engine_first_token(request: Request, span: SpanRecord) -> int | None:
    """The first token's time from an engine span's start, by its engine's ``first_token``:
    its figures, else the end of its earliest stage span of the bucket ``after_stage`` names."""
    engine = rules.active().engine_of(span)
    if engine is None:
        return None
    at = engine.first_token_ns(span)
    if at is None and engine.first_token_after:
        stages = [p for name, p in request.phases[span.span_id] if name == engine.first_token_after]
        if stages:
            at = min(stages, key=lambda p: (p.start_ns, p.span_id)).end_ns - span.start_ns
    return at


def first_chunk_event(span: SpanRecord) -> int | None:
    """The earliest first-chunk event of a GenAI client instrumentation on ``span``."""
    return min((t for n, t in span.events if n in GenAIEvents.FIRST_CHUNK), default=None)


def _client_ttft(request: Request, client: SpanRecord) -> int | None:
    """TTFT as the client felt it, from its chain (nearest first): latscope's first-token
    attribute, a first-chunk event (latscope's, OpenInference's, traceloop's), or the GenAI
    ``time_to_first_chunk`` (seconds from the span that carries it); from the client's start."""
    for span in request.client_chain:
        first = span.attr_int(LatscopeAttributes.FIRST_TOKEN_NS)
        if first is None:
            first = first_chunk_event(span)
        if first is not None:
            return first - client.start_ns
        chunk = span.attr_float(GenAIAttributes.RESPONSE_TIME_TO_FIRST_CHUNK)
        if chunk is not None:
            return span.start_ns + seconds_to_ns(chunk) - client.start_ns
    return None


def _gpu(result: RequestAttribution, request: Request) -> None:
    """GPU figures of the (last) prefill and decode phase spans."""
    # Only phase spans that hold a GPU key at all are read (most carry none).
    phases = [
        (name, p)
        for a in request.attempts
        for name, p in request.phases[a.span_id]
        if not GPU_KEYS.keys().isdisjoint(p.attributes)
    ]
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
