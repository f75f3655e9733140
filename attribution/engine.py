"""Per-request attribution: one trace's spans -> seven buckets that sum to the whole.

Rules (DESIGN.md, "Attribution rules"):

* With a client span C and server span S: ``network = C.duration - S.duration``. Each duration is
  measured on one host's clock, so this needs no clock sync.
* Inside S every instant goes to exactly one bucket: the active phase, else ``other``. Where
  phases overlap, the first in ``PHASE_PRIORITY`` wins: the work nearest the GPU is what the
  request was waiting on.
* Without a client span ``network`` is None (unknown) and e2e is S's duration.
* Clock skew: when S does not fit inside C as recorded, the server is assumed to sit in the middle
  of C (symmetric network, as Jaeger's clock-skew adjuster assumes); the offset is reported.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence

from latscope.attribution.model import RequestAttribution, SpanRecord

from latscope.semconv import (
    BUCKETS,
    GenAIAttributes,
    HttpAttributes,
    LatscopeAttributes,
    Phase,
    SpanKind,
)

#: Overlapping phases: the first listed wins the overlapping time.
PHASE_PRIORITY: tuple[str, ...] = (
    Phase.DECODE,
    Phase.PREFILL,
    Phase.PREPROCESS,
    Phase.POSTPROCESS,
    Phase.QUEUE,
)

_GPU_KEYS = {
    LatscopeAttributes.GPU_UTIL_MEAN: "utilization_mean",
    LatscopeAttributes.GPU_UTIL_MAX: "utilization_max",
    LatscopeAttributes.GPU_MEMORY_USED_MAX: "memory_used_max",
    LatscopeAttributes.GPU_POWER_MEAN: "power_mean",
    LatscopeAttributes.GPU_SM_CLOCK: "sm_clock",
    LatscopeAttributes.GPU_ENERGY_MJ: "energy_mj",
}


def sweep(window: tuple[int, int], phases: Sequence[tuple[str, int, int]]) -> dict[str, int]:
    """Split ``window`` among ``(phase, start, end)`` intervals by priority; the rest is other."""
    lo, hi = window
    out = dict.fromkeys(BUCKETS[1:], 0)
    if hi <= lo:
        return out
    rank = {p: i for i, p in enumerate(PHASE_PRIORITY)}
    cuts = {lo, hi}
    clipped = []
    for name, start, end in phases:
        s, e = max(start, lo), min(end, hi)
        if e > s and name in rank:
            clipped.append((rank[name], s, e))
            cuts.update((s, e))
    points = sorted(cuts)
    for a, b in itertools.pairwise(points):
        active = [r for r, s, e in clipped if s <= a and e >= b]
        bucket = PHASE_PRIORITY[min(active)] if active else "other"
        out[bucket] += b - a
    return out


def _children(spans: Sequence[SpanRecord]) -> dict[str, list[SpanRecord]]:
    kids: dict[str, list[SpanRecord]] = {}
    for s in spans:
        kids.setdefault(s.parent_span_id, []).append(s)
    return kids


def _descendants(root: SpanRecord, kids: dict[str, list[SpanRecord]]) -> list[SpanRecord]:
    out, stack = [], list(kids.get(root.span_id, ()))
    while stack:
        span = stack.pop()
        out.append(span)
        stack.extend(kids.get(span.span_id, ()))
    return out


def _pick_client_and_server(
    spans: Sequence[SpanRecord],
) -> tuple[SpanRecord | None, SpanRecord | None]:
    ids = {s.span_id for s in spans}
    servers = [s for s in spans if s.kind == SpanKind.SERVER]
    by_id = {s.span_id: s for s in spans}
    for server in sorted(servers, key=lambda s: s.start_ns):
        parent = by_id.get(server.parent_span_id)
        if parent is not None and parent.kind == SpanKind.CLIENT:
            return parent, server
    server = next(
        (s for s in sorted(servers, key=lambda s: s.start_ns) if s.parent_span_id not in ids),
        servers[0] if servers else None,
    )
    return (None, server) if server else (None, None)


def _token_times(decode: SpanRecord | None) -> list[int]:
    if decode is None:
        return []
    return [
        decode.start_ns + off * 1000
        for off in decode.attr_int_list(LatscopeAttributes.TOKEN_OFFSETS_US)
    ]


def _quantile(values: Sequence[float], q: float) -> float:
    if len(values) == 1:
        return float(values[0])
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def attribute_trace(trace_id: str, spans: Sequence[SpanRecord]) -> RequestAttribution | None:
    """Attribute one request, or None when the trace has no server span."""
    client, server = _pick_client_and_server(spans)
    if server is None:
        return None
    kids = _children(spans)
    phase_spans = [
        s for s in _descendants(server, kids) if s.attributes.get(LatscopeAttributes.PHASE)
    ]
    intervals = [
        (s.attributes[LatscopeAttributes.PHASE], s.start_ns, s.end_ns) for s in phase_spans
    ]
    buckets: dict[str, int | None] = dict(sweep((server.start_ns, server.end_ns), intervals))

    skew = 0
    if client is not None:
        e2e = client.duration_ns
        buckets["network"] = max(0, client.duration_ns - server.duration_ns)
        if server.start_ns < client.start_ns or server.end_ns > client.end_ns:
            skew = ((server.start_ns - client.start_ns) - (client.end_ns - server.end_ns)) // 2
        start = client.start_ns
        # A server that outlasts its client (its own work after the response went out, or a
        # clock that runs fast) cannot make buckets exceed what the client saw.
        server_total = sum(v for k, v in buckets.items() if k != "network" and v)
        if server_total > e2e:
            buckets["other"] = max(0, (buckets["other"] or 0) - (server_total - e2e))
    else:
        e2e = server.duration_ns
        buckets["network"] = None
        start = server.start_ns

    by_phase = {s.attributes[LatscopeAttributes.PHASE]: s for s in phase_spans}
    decode = by_phase.get(Phase.DECODE)
    tokens = _token_times(decode)
    attrs = {**(client.attributes if client else {}), **server.attributes}
    result = RequestAttribution(
        trace_id=trace_id,
        start_ns=start,
        service=server.service,
        model=attrs.get(GenAIAttributes.REQUEST_MODEL, ""),
        operation=attrs.get(GenAIAttributes.OPERATION_NAME, ""),
        route=attrs.get(HttpAttributes.ROUTE, ""),
        e2e_ns=e2e,
        buckets_ns=buckets,
        has_client=client is not None,
        status=server.status,
        clock_skew_ns=skew,
    )
    for key in (GenAIAttributes.USAGE_INPUT_TOKENS, GenAIAttributes.USAGE_PROMPT_TOKENS):
        if result.input_tokens is None and attrs.get(key):
            result.input_tokens = int(float(attrs[key]))
    for key in (GenAIAttributes.USAGE_OUTPUT_TOKENS, GenAIAttributes.USAGE_COMPLETION_TOKENS):
        if result.output_tokens is None and attrs.get(key):
            result.output_tokens = int(float(attrs[key]))
    if tokens:
        result.ttft_server_ns = tokens[0] - server.start_ns
        if result.output_tokens is None:
            result.output_tokens = len(tokens)
        gaps = [b - a for a, b in itertools.pairwise(tokens)]
        if gaps:
            result.tpot_ns = (tokens[-1] - tokens[0]) / len(gaps)
            result.itl_ns = {
                "p50": _quantile(gaps, 0.5),
                "p99": _quantile(gaps, 0.99),
                "max": float(max(gaps)),
            }
    if client is not None:
        first = client.attr_int(LatscopeAttributes.FIRST_TOKEN_NS)
        if first is None:
            first = next(
                (t for n, t in client.events if n == LatscopeAttributes.FIRST_TOKEN_EVENT), None
            )
        if first is not None:
            result.ttft_client_ns = first - client.start_ns
    for phase in (Phase.PREFILL, Phase.DECODE):
        span = by_phase.get(phase)
        if span is None:
            continue
        figures = {
            name: value
            for key, name in _GPU_KEYS.items()
            if (value := span.attr_float(key)) is not None
        }
        if figures:
            result.gpu[phase] = figures
    return result
