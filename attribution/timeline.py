"""A request's timeline and its sweep: each attempt's phases (its phase spans, its engine's
figures and parts), clipped to its window; the timeline on the client's clock (clock skew,
headers-only clients); and the priority sweep that cuts it into buckets
(``latscope.attribution.engine``'s rules 4 and 5, docs/attribution.md "The sweep and the overlap
priority", "Clock skew and headers-only clients")."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from latscope.attribution import rules
from latscope.attribution.finding import Request, is_model_call
from latscope.attribution.model import SpanRecord
from latscope.semconv import BUCKETS, KV_TRANSFER, ClientAttributes, Phase

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
#: Rank of a KV-cache transfer stage (counted in ``other``, and on its own), of attempt windows
#: ("other") and of uncovered client time ("network"), after the phases.
KV_RANK = len(PHASE_PRIORITY)
OTHER_RANK = KV_RANK + 1
NETWORK_RANK = OTHER_RANK + 1
RANK: dict[str, int] = {**{p: i for i, p in enumerate(PHASE_PRIORITY)}, KV_TRANSFER: KV_RANK}


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
    """The bucket a sweep rank counts in (a KV-cache transfer stage is ``other``)."""
    if rank < KV_RANK:
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


def synthetic_phases(server: SpanRecord, *, stages: bool = False) -> list[tuple[str, int, int]]:
    """An engine span's phases from its own figures, by its engine's ``[[engine.phase]]`` rules
    (vLLM's and SGLang's anchored at the first token: every figure there ends or starts at it);
    with ``stages`` (its stage spans own parts of it) only those kept beside them."""
    engine = rules.active().engine_of(server)
    return [] if engine is None else engine.phase_list(server, stages=stages)


def attempt_phases(request: Request, attempt: SpanRecord) -> list[tuple[str, int, int]]:
    """The attempt's phases ``(bucket, start, end)`` on the server's clock, clipped to its window
    (empty ones left out): its phase spans, else the synthetic phases of its latency figures."""
    lo, hi = request.bounds(attempt)
    mine = request.phases[attempt.span_id]
    raw = [(name, p.start_ns, p.end_ns) for name, p in mine]
    raw += synthetic_phases(attempt, stages=bool(mine))
    raw += request.parts.get(attempt.span_id, ())
    return [(n, max(s, lo), min(e, hi)) for n, s, e in raw if min(e, hi) > max(s, lo)]


def _says_whole_response(request: Request) -> bool:
    """The client span covers the whole response: latscope's client records when it read the
    last byte, and a GenAI operation ends when the call has its answer (openai-v2, OpenInference
    and traceloop end a stream's span at its last chunk)."""
    return request.client is not None and (
        is_model_call(request.client)
        or any(s.attr_int(ClientAttributes.LAST_BYTE_NS) is not None for s in request.client_chain)
    )


def _reach(request: Request) -> int | None:
    """The latest instant (server clock) the server's own record says the response was still
    going: the end of its last phase, or of its response's content (``finding._response_span``:
    not a stream's closing message); None without."""
    ends = [e for a in request.attempts for _, _, e in attempt_phases(request, a)]
    ends += [e for a in request.attempts if (e := request.content_end(a)) is not None]
    return max(ends, default=None)


@dataclass(frozen=True)
class Timeline:
    """A request on the client's clock: its window, the offset that moves the server's clock
    onto the client's, whether the client span ended at the response headers, and the clock skew
    reported (how far the server's clock runs ahead; 0 where the spans fit within what the
    network legs allow)."""

    lo: int
    hi: int
    offset: int
    headers_only: bool
    skew: int = 0


def timeline(request: Request) -> Timeline:
    client = request.client
    bounds = [request.bounds(a) for a in request.attempts]
    hull_lo = min(lo for lo, _ in bounds)
    hull_hi = max(hi for _, hi in bounds)
    if client is None:
        return Timeline(hull_lo, hull_hi, 0, False)
    lo, dur, hi = client.start_ns, client.duration_ns, client.end_ns
    hull = hull_hi - hull_lo
    if hull_lo >= lo and hull_hi <= hi:
        return Timeline(lo, hi, 0, False)
    reach = _reach(request)
    if hull_lo >= lo and reach is not None and reach <= hi:
        # The server's record of its work (its start, its phases, its response) fits as
        # recorded: what runs past the client's end is its span closing after the response
        # (teardown), clipped, not a clock skew.
        return Timeline(lo, hi, 0, False)
    if hull <= dur:
        misfit = max(lo - hull_lo, hull_hi - hi)
        if misfit <= dur - hull:
            # Within the room the network legs leave: legs of unequal length, not a clock skew
            # to report.
            return Timeline(lo, hi, lo - hull_lo if hull_lo < lo else hi - hull_hi, False)
        offset = lo + (dur - hull) // 2 - hull_lo
        return Timeline(lo, hi, offset, False, -offset)
    if not _says_whole_response(request) and reach is not None and reach - hull_lo > dur:
        # Headers-only: the server sent the headers as it started, half-way through the client
        # span; the response then came back over the same leg.
        offset = lo + dur // 2 - hull_lo
        return Timeline(lo, hull_hi + offset + (dur - dur // 2), offset, True, -offset)
    # The excess is work after the response: moved only if the server started first.
    offset = max(0, lo - hull_lo)
    return Timeline(lo, hi, offset, False, -offset)


def ranked_pieces(request: Request) -> tuple[Timeline, list[tuple[int, int, int]]]:
    """The request's timeline cut into ``(rank, start, end)`` pieces on the client's clock."""
    tl = timeline(request)
    intervals: list[tuple[int, int, int]] = []
    for attempt in request.critical:
        lo, hi = request.bounds(attempt)
        a_lo = max(lo + tl.offset, tl.lo)
        a_hi = min(hi + tl.offset, tl.hi)
        intervals.append((OTHER_RANK, a_lo, a_hi))
        for name, s, e in attempt_phases(request, attempt):
            intervals.append((RANK[name], max(s + tl.offset, a_lo), min(e + tl.offset, a_hi)))
    return tl, ranked_segments((tl.lo, tl.hi), intervals)


def named_pieces(
    request: Request, ranked: Sequence[tuple[int, int, int]]
) -> list[tuple[str, int, int]]:
    """``ranked_pieces``' pieces as ``(bucket, start, end)`` (``other`` for server time and
    ``network`` for the rest when the request has no client span)."""
    has_client = request.client is not None
    return [(rank_name(r, client=has_client), a, b) for r, a, b in ranked]
