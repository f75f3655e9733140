"""Per-request attribution: one trace's spans -> seven buckets that sum to the whole.

This is the reference implementation, written for clarity: the REST endpoint for one request
uses it, and the vectorised batch engine (``batch.py``) is tested against it. The rules are
documented in docs/attribution.md; in short:

1. **Which spans.** The *inference server spans* are SERVER spans that own a phase span (the
   nearest SERVER ancestor of a ``latscope.phase`` span, at most ``MAX_PHASE_DEPTH`` levels up)
   or carry vLLM / SGLang ``gen_ai.latency.*`` attributes; when a trace has none, every SERVER span
   is a candidate. The earliest candidate (by start, then span id) is the request. When its
   parent is a CLIENT span, that is the client span and every candidate under the same client is
   an *attempt* (retries); otherwise the request is that one server span.
2. **Clock skew.** Attempts are on the server's clock, the client span on the client's. When the
   attempts' hull fits inside the client span as recorded, nothing moves (skew 0). Otherwise the
   hull is placed in the middle of the client span (symmetric network, as Jaeger's adjuster does)
   or, when it is longer than the client span, at its start (the excess is work after the
   response). ``clock_skew_ns`` is how far the server's clock runs ahead.
3. **Sweep.** The timeline is the client span (else the server span). Every instant goes to the
   highest-priority phase covering it (``PHASE_PRIORITY``), else to ``other`` when an attempt
   covers it, else to ``network`` (client time outside every attempt: wire, proxies, retry
   back-off). Phases are clipped to their attempt, attempts to the client span: server work after
   the client's last byte is not counted. Without a client span ``network`` is None.
4. **vLLM / SGLang.** An attempt with no phase spans but ``gen_ai.latency.*`` attributes gets
   synthetic phases: queue ``[0, q]``, prefill ``[q, q + prefill]`` (prefill = ttft - q when
   missing), decode ``[ttft, ttft + decode]`` from the span's start.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from latscope.attribution.model import RequestAttribution, SpanRecord
from latscope.semconv import (
    BUCKETS,
    GenAIAttributes,
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

#: How far below its server span a phase span may sit (the batch engine climbs this many levels).
MAX_PHASE_DEPTH = 8

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

VLLM_KEYS = (
    VllmAttributes.TIME_IN_QUEUE,
    VllmAttributes.TIME_TO_FIRST_TOKEN,
    VllmAttributes.TIME_IN_MODEL_PREFILL,
    VllmAttributes.TIME_IN_MODEL_DECODE,
    VllmAttributes.E2E,
)


def seconds_to_ns(value: float) -> int:
    """vLLM's float seconds -> integer ns, rounded half up (the batch engine rounds the same)."""
    return math.floor(value * 1e9 + 0.5)


def sweep(window: tuple[int, int], phases: Sequence[tuple[str, int, int]]) -> dict[str, int]:
    """Split ``window`` among ``(phase, start, end)`` intervals by priority; the rest is other.

    >>> sweep((0, 100), [("queue", 0, 50), ("prefill", 40, 70)])
    {'queue': 40, 'preprocess': 0, 'prefill': 30, 'decode': 0, 'postprocess': 0, 'other': 30}
    """
    rank = {p: i for i, p in enumerate(PHASE_PRIORITY)}
    ranked = [(rank[n], s, e) for n, s, e in phases if n in rank]
    ranked.append((OTHER_RANK, *window))
    totals = _ranked_sweep(window, ranked)
    out = dict.fromkeys(BUCKETS[1:], 0)
    for r, ns in totals.items():
        out[_rank_name(r, client=False)] += ns
    return out


def _rank_name(rank: int, *, client: bool) -> str:
    if rank < OTHER_RANK:
        return PHASE_PRIORITY[rank]
    return "network" if rank == NETWORK_RANK and client else "other"


def _ranked_sweep(
    window: tuple[int, int], intervals: Sequence[tuple[int, int, int]]
) -> dict[int, int]:
    """Elementary-segment sweep: each piece of ``window`` -> lowest rank covering it."""
    lo, hi = window
    if hi <= lo:
        return {}
    clipped = [(r, max(s, lo), min(e, hi)) for r, s, e in intervals]
    clipped = [c for c in clipped if c[2] > c[1]]
    cuts = sorted({lo, hi, *(c[1] for c in clipped), *(c[2] for c in clipped)})
    out: dict[int, int] = {}
    for a, b in itertools.pairwise(cuts):
        ranks = [r for r, s, e in clipped if s <= a and e >= b]
        r = min(ranks) if ranks else NETWORK_RANK
        out[r] = out.get(r, 0) + (b - a)
    return out


def linear_quantile(values: Sequence[float], q: float) -> float:
    """Quantile with linear interpolation between order statistics (numpy's and polars' default)."""
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    i = math.floor(pos)
    if i + 1 >= len(ordered):
        return float(ordered[-1])
    return float(ordered[i] + (ordered[i + 1] - ordered[i]) * (pos - i))


def _has_vllm(span: SpanRecord) -> bool:
    return any(span.attr_float(k) is not None for k in VLLM_KEYS)


def _nearest_server(
    span: SpanRecord, by_id: dict[str, SpanRecord], depth: int = MAX_PHASE_DEPTH
) -> str | None:
    parent = span.parent_span_id
    for _ in range(depth):
        node = by_id.get(parent)
        if node is None:
            return None
        if node.kind == SpanKind.SERVER:
            return node.span_id
        parent = node.parent_span_id
    return None


def _vllm_phases(server: SpanRecord) -> list[tuple[str, int, int]]:
    q = server.attr_float(VllmAttributes.TIME_IN_QUEUE)
    ttft = server.attr_float(VllmAttributes.TIME_TO_FIRST_TOKEN)
    prefill = server.attr_float(VllmAttributes.TIME_IN_MODEL_PREFILL)
    decode = server.attr_float(VllmAttributes.TIME_IN_MODEL_DECODE)
    q_ns = seconds_to_ns(q) if q is not None else 0
    if prefill is not None:
        prefill_ns = seconds_to_ns(prefill)
    elif ttft is not None:
        prefill_ns = max(0, seconds_to_ns(ttft) - q_ns)
    else:
        prefill_ns = 0
    ttft_ns = seconds_to_ns(ttft) if ttft is not None else q_ns + prefill_ns
    decode_ns = seconds_to_ns(decode) if decode is not None else 0
    s = server.start_ns
    return [
        (Phase.QUEUE, s, s + q_ns),
        (Phase.PREFILL, s + q_ns, s + q_ns + prefill_ns),
        (Phase.DECODE, s + ttft_ns, s + ttft_ns + decode_ns),
    ]


def select_request(
    spans: Sequence[SpanRecord],
) -> tuple[SpanRecord | None, list[SpanRecord], dict[str, list[SpanRecord]]]:
    """(client span or None, attempts oldest first, attempt span id -> its phase spans)."""
    by_id = {s.span_id: s for s in spans}
    servers = [s for s in spans if s.kind == SpanKind.SERVER]
    if not servers:
        return None, [], {}
    owned: dict[str, list[SpanRecord]] = {}
    for s in spans:
        if s.attributes.get(LatscopeAttributes.PHASE) in Phase.ALL:
            owner = _nearest_server(s, by_id)
            if owner is not None:
                owned.setdefault(owner, []).append(s)
    inference = [s for s in servers if s.span_id in owned or _has_vllm(s)]
    candidates = sorted(inference or servers, key=lambda s: (s.start_ns, s.span_id))
    first = candidates[0]
    parent = by_id.get(first.parent_span_id)
    if parent is not None and parent.kind == SpanKind.CLIENT:
        attempts = [s for s in candidates if s.parent_span_id == parent.span_id]
        return parent, attempts, owned
    return None, [first], owned


def attribute_trace(
    trace_id: str, spans: Sequence[SpanRecord], *, stall_threshold_ns: int = DEFAULT_STALL_NS
) -> RequestAttribution | None:
    """Attribute one request, or None when the trace has no server span.

    ``spans`` must not repeat a span id (``load_trace`` drops repeats).
    """
    client, attempts, owned = select_request(spans)
    if not attempts:
        return None

    # Clock skew: move the attempts (server clock) into the client's frame when they don't fit.
    hull_lo = min(a.start_ns for a in attempts)
    hull_hi = max(a.end_ns for a in attempts)
    offset = 0
    if client is not None and (hull_lo < client.start_ns or hull_hi > client.end_ns):
        if hull_hi - hull_lo > client.duration_ns:
            offset = client.start_ns - hull_lo
        else:
            offset = client.start_ns + (client.duration_ns - (hull_hi - hull_lo)) // 2 - hull_lo
    if client is not None:
        lo, hi = client.start_ns, client.end_ns
    else:
        lo, hi = attempts[0].start_ns, attempts[0].end_ns

    rank = {p: i for i, p in enumerate(PHASE_PRIORITY)}
    intervals: list[tuple[int, int, int]] = []
    phases_used: list[SpanRecord] = []
    for attempt in attempts:
        a_lo, a_hi = max(attempt.start_ns + offset, lo), min(attempt.end_ns + offset, hi)
        intervals.append((OTHER_RANK, a_lo, a_hi))
        mine = owned.get(attempt.span_id, [])
        phases_used += mine
        raw = [(p.attributes[LatscopeAttributes.PHASE], p.start_ns, p.end_ns) for p in mine]
        if not mine and _has_vllm(attempt):
            raw = _vllm_phases(attempt)
        for name, s, e in raw:
            intervals.append((rank[name], max(s + offset, a_lo), min(e + offset, a_hi)))
    totals = _ranked_sweep((lo, hi), intervals)
    buckets: dict[str, int | None] = dict.fromkeys(BUCKETS, 0)
    for r, ns in totals.items():
        name = _rank_name(r, client=client is not None)
        buckets[name] = (buckets[name] or 0) + ns
    if client is None:
        buckets["network"] = None

    last = attempts[-1]
    # Empty values count as absent (the spans table cannot tell them apart).
    attrs = {
        **{k: v for k, v in (client.attributes if client else {}).items() if v != ""},
        **{k: v for k, v in last.attributes.items() if v != ""},
    }
    result = RequestAttribution(
        trace_id=trace_id,
        start_ns=lo,
        service=last.service,
        model=attrs.get(GenAIAttributes.REQUEST_MODEL)
        or attrs.get(GenAIAttributes.RESPONSE_MODEL)
        or "",
        operation=attrs.get(GenAIAttributes.OPERATION_NAME, ""),
        route=attrs.get(HttpAttributes.ROUTE, ""),
        e2e_ns=hi - lo,
        buckets_ns=buckets,
        has_client=client is not None,
        attempts=len(attempts),
        status=last.status,
        clock_skew_ns=-offset,
        resource_attributes=dict(last.resource),
    )
    result.input_tokens = _first_int(
        attrs, GenAIAttributes.USAGE_INPUT_TOKENS, GenAIAttributes.USAGE_PROMPT_TOKENS
    )
    result.output_tokens = _first_int(
        attrs, GenAIAttributes.USAGE_OUTPUT_TOKENS, GenAIAttributes.USAGE_COMPLETION_TOKENS
    )
    owner = {p.span_id: a.span_id for a in attempts for p in owned.get(a.span_id, [])}
    _streaming(result, client, attempts, phases_used, owner, stall_threshold_ns)
    _gpu(result, phases_used)
    return result


#: Token counts outside this range are not believed (the table stores UInt32).
MAX_TOKENS = 2**32 - 1


def _first_int(attrs: dict[str, str], *keys: str) -> int | None:
    for key in keys:
        raw = attrs.get(key)
        if raw:
            try:
                value = int(float(raw))
            except (ValueError, OverflowError):
                continue
            return value if 0 <= value <= MAX_TOKENS else None
    return None


def _last_by_start(spans: Sequence[SpanRecord]) -> SpanRecord | None:
    return max(spans, key=lambda s: (s.start_ns, s.span_id), default=None)


def _streaming(
    result: RequestAttribution,
    client: SpanRecord | None,
    attempts: Sequence[SpanRecord],
    phases: Sequence[SpanRecord],
    owner: dict[str, str],
    stall_threshold_ns: int,
) -> None:
    """TTFT (client and server), TPOT, inter-token latency and stalls."""
    decodes = [
        p
        for p in phases
        if p.attributes.get(LatscopeAttributes.PHASE) == Phase.DECODE
        and p.attr_int_list(LatscopeAttributes.TOKEN_OFFSETS_US)
    ]
    decode = _last_by_start(decodes)
    last = attempts[-1]
    if decode is not None:
        tokens = [
            decode.start_ns + off * 1000
            for off in decode.attr_int_list(LatscopeAttributes.TOKEN_OFFSETS_US)
        ]
        server = next(a for a in attempts if a.span_id == owner[decode.span_id])
        result.ttft_server_ns = tokens[0] - server.start_ns
        if result.output_tokens is None:
            result.output_tokens = decode.attr_int(LatscopeAttributes.TOKEN_COUNT) or len(tokens)
        gaps = [b - a for a, b in itertools.pairwise(tokens)]
        if gaps:
            result.tpot_ns = (tokens[-1] - tokens[0]) / len(gaps)
            result.itl_ns = {
                "p50": linear_quantile(gaps, 0.5),
                "p99": linear_quantile(gaps, 0.99),
                "max": float(max(gaps)),
            }
            result.stalls = sum(1 for g in gaps if g > stall_threshold_ns)
    else:
        ttft = last.attr_float(VllmAttributes.TIME_TO_FIRST_TOKEN)
        if ttft is not None:
            result.ttft_server_ns = seconds_to_ns(ttft)
            decode_s = last.attr_float(VllmAttributes.TIME_IN_MODEL_DECODE)
            if decode_s is not None and result.output_tokens and result.output_tokens > 1:
                result.tpot_ns = seconds_to_ns(decode_s) / (result.output_tokens - 1)
    if client is not None:
        first = client.attr_int(LatscopeAttributes.FIRST_TOKEN_NS)
        if first is None:
            first = min(
                (t for n, t in client.events if n == LatscopeAttributes.FIRST_TOKEN_EVENT),
                default=None,
            )
        if first is not None:
            result.ttft_client_ns = first - client.start_ns


def _gpu(result: RequestAttribution, phases: Sequence[SpanRecord]) -> None:
    """GPU figures of the (last) prefill and decode phase spans."""
    for phase in GPU_PHASES:
        spans = [
            p
            for p in phases
            if p.attributes.get(LatscopeAttributes.PHASE) == phase
            and any(p.attr_float(k) is not None for k in GPU_KEYS)
        ]
        span = _last_by_start(spans)
        if span is None:
            continue
        result.gpu[phase] = {
            name: value
            for key, name in GPU_KEYS.items()
            if (value := span.attr_float(key)) is not None
        }
