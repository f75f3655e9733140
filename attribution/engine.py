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
4. **Clock skew.** Attempts are on the server's clock, the client span on the client's. When
   the windows' hull fits inside the client span as recorded, nothing moves (skew 0). When it
   is shorter than the client span but does not fit: a misfit no larger than the room the
   network legs leave is teardown or unequal legs (moved the least that fits, skew 0), a larger
   one is skew (the hull is centred, as Jaeger's adjuster does). When the hull is longer, the
   client span is *headers-only* only on evidence: the server's phases or response ran past
   the client's end even with the server started at the client's start, and the client does
   not say it read the whole response (latscope's client records its last byte; a GenAI
   operation ends with the call). Then the server started half-way through the client span and
   the request runs to the server's end plus the same return leg. Otherwise the excess is work
   after the response (the server is moved only when it started before the client).
   ``clock_skew_ns`` is how far the server's clock runs ahead.
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

import itertools
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from latscope.attribution import rules
from latscope.attribution.model import RequestAttribution, SpanRecord, parse_int
from latscope.semconv import (
    BUCKETS,
    INFERENCE_ROUTES,
    KV_TRANSFER,
    STREAM_PARAMETER,
    ClientAttributes,
    GenAIAttributes,
    GenAIEvents,
    GenAIOperation,
    HttpAttributes,
    LatscopeAttributes,
    OpenInferenceAttributes,
    Phase,
    SpanKind,
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

# The SQL attributor and the attributor take the token figures' names from here as well.
from latscope.tokens import FIRST_OFFSET_US as FIRST_OFFSET_US
from latscope.tokens import TOKENS as TOKENS

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

#: How far below its server span a phase span may sit.
MAX_PHASE_DEPTH = 8
#: How far up a span's ancestry the rules look (the client of an inference span, the tool call
#: around a server span, ...): deeper than any real call chain, a bound against cycles.
MAX_ANCESTRY = 32
#: The transport (a CLIENT span) and the spans of the same call directly above it, at most this
#: many in all, form the client chain (LangChain's LLM span over OpenInference's over an httpx
#: span; openai-v2's ``chat`` span over latscope's client span).
CLIENT_CHAIN = 3

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


# -- which spans make each request ---------------------------------------------------------------


def has_latency(span: SpanRecord) -> bool:
    """The span is an engine's request span by the rulebook in force (``attribution/rules``):
    vLLM's and SGLang's ``gen_ai.latency.*`` figures, TGI's handler, ... whatever its kind."""
    return rules.active().engine_of(span) is not None


def _server_like(span: SpanRecord) -> bool:
    return span.kind == SpanKind.SERVER or has_latency(span)


def is_model_call(span: SpanRecord) -> bool:
    """A client-side GenAI operation: a span (not a server's) whose ``gen_ai.operation.name`` is a
    call to a model (openai-v2's ``chat``, traceloop's ``openai.chat``, latscope's client span
    of an OpenAI-style endpoint), or an OpenInference LLM span (INTERNAL)."""
    if _server_like(span):
        return False
    attrs = span.attributes
    return (
        attrs.get(GenAIAttributes.OPERATION_NAME) in GenAIOperation.MODEL_CALLS
        or attrs.get(OpenInferenceAttributes.SPAN_KIND) == OpenInferenceAttributes.LLM
    )


def _call_link(span: SpanRecord) -> bool:
    """A span of a client chain: a CLIENT span or a client-side GenAI operation."""
    return (span.kind == SpanKind.CLIENT and not has_latency(span)) or is_model_call(span)


def inference_route(route: str | None) -> bool:
    """An ``http.route`` of a model-serving API (``INFERENCE_ROUTES``, matched at its end)."""
    return bool(route) and any(route.endswith(r) for r in INFERENCE_ROUTES)  # type: ignore[union-attr]


def _says_inference(span: SpanRecord) -> bool:
    """A SERVER span's own word that it serves a model call: the model it was asked for, a model
    operation, or an inference route."""
    attrs = span.attributes
    return bool(
        attrs.get(GenAIAttributes.REQUEST_MODEL)
        or attrs.get(GenAIAttributes.OPERATION_NAME) in GenAIOperation.MODEL_CALLS
        or inference_route(attrs.get(HttpAttributes.ROUTE))
    )


def _is_response_body(span: SpanRecord) -> bool:
    """An ASGI ``http send`` span of a response body message (either spelling of its type)."""
    body = HttpAttributes.ASGI_RESPONSE_BODY
    attrs = span.attributes
    return (
        attrs.get(HttpAttributes.ASGI_EVENT_TYPE) == body
        or attrs.get(HttpAttributes.ASGI_EVENT_TYPE_OLD) == body
    )


def disaggregated_role(span: SpanRecord) -> str | None:
    """ "prefill" or "decode" for an engine's request span under prefill/decode disaggregation,
    by its engine's ``roles`` (SGLang's root names)."""
    engine = rules.active().engine_of(span)
    return None if engine is None else engine.role(span)


@dataclass(frozen=True)
class Request:
    """The spans of one inference call: its client (if seen), its attempts oldest first (start,
    then span id), each attempt's phases as ``(bucket, span)``, its window (``windows``: the
    model service's outermost SERVER span around it, itself when none) and, where recorded, when
    that window's response ended (``response_ends``, on the server's clock)."""

    client: SpanRecord | None
    attempts: tuple[SpanRecord, ...]
    phases: dict[str, tuple[tuple[str, SpanRecord], ...]]
    #: The last attempt's transport and the spans of the call above it, up to the client,
    #: nearest first.
    client_chain: tuple[SpanRecord, ...] = ()
    windows: dict[str, SpanRecord] = field(default_factory=dict)
    response_ends: dict[str, int] = field(default_factory=dict)
    #: The attempts under a serving system's span (Dynamo's frontend, TensorRT-LLM's
    #: disaggregated proxy): that span is their window, and each is a part of its try.
    in_system: frozenset[str] = frozenset()
    #: Each attempt's phases ``(bucket, start, end)`` placed by its engine's parts
    #: (``[[engine.part]]``: Triton's compute spans).
    parts: dict[str, tuple[tuple[str, int, int], ...]] = field(default_factory=dict)

    @property
    def span_id(self) -> str:
        return self.client.span_id if self.client is not None else self.attempts[0].span_id

    @property
    def start_ns(self) -> int:
        return self.client.start_ns if self.client is not None else self.attempts[0].start_ns

    def window(self, attempt: SpanRecord) -> SpanRecord:
        return self.windows.get(attempt.span_id, attempt)

    def bounds(self, attempt: SpanRecord) -> tuple[int, int]:
        """The attempt's window on the server's clock, cut at the end of its response."""
        w = self.window(attempt)
        end = self.response_ends.get(w.span_id)
        return w.start_ns, (w.end_ns if end is None else min(w.end_ns, max(end, w.start_ns)))


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
    """(bucket, owning span id) when ``span`` is a phase of some inference span: a
    ``latscope.phase`` span under its nearest server-like ancestor, or an engine's stage span
    (by name, ``[engine.stages]``) within that engine's depth below its request span."""
    phase = span.attributes.get(LatscopeAttributes.PHASE)
    book = rules.active()
    stage = None if phase in Phase.ALL else book.stage_bucket(span.name)
    if phase not in Phase.ALL and stage is None:
        return None
    for depth, node in enumerate(index.ancestors(span, MAX_PHASE_DEPTH), 1):
        if _server_like(node):
            if stage is None:
                return phase, node.span_id  # type: ignore[return-value]
            engine = book.engine_of(node)
            if engine is None or engine.stage_bucket(span.name) is None:
                return None  # named like a stage of another engine, or outside any engine
            if depth > engine.stage_depth:
                return None
            return stage, node.span_id
    return None


def _response_owner(index: TraceIndex, span: SpanRecord) -> str | None:
    """The SERVER span a response-body ``http send`` span belongs to (its nearest server-like
    ancestor, at most ``MAX_PHASE_DEPTH`` up)."""
    if not _is_response_body(span):
        return None
    for node in index.ancestors(span, MAX_PHASE_DEPTH):
        if _server_like(node):
            return node.span_id
    return None


def _transport_of(index: TraceIndex, span: SpanRecord) -> SpanRecord | None:
    """The nearest CLIENT ancestor, reached without crossing a server of another service: a
    client above a RAG front end called that front end, not the model server behind it, but an
    HTTP framework's SERVER span around the inference span in the same service is crossed."""
    for node in index.ancestors(span):
        if node.kind == SpanKind.CLIENT:
            return node
        if _server_like(node) and node.service != span.service:
            return None
    return None


def client_chain(index: TraceIndex, transport: SpanRecord) -> tuple[SpanRecord, ...]:
    """The transport and the spans of the same call above it (CLIENT spans, client-side GenAI
    operations; at most ``CLIENT_CHAIN`` in all), nearest first, up to the outermost GenAI
    operation among them: that one is the request's client. Without one, the transport alone."""
    links = [transport]
    for node in index.ancestors(transport, CLIENT_CHAIN - 1):
        if not _call_link(node):
            break
        links.append(node)
    outer = max((i for i, s in enumerate(links) if is_model_call(s)), default=0)
    return tuple(links[: outer + 1])


def _window_of(index: TraceIndex, span: SpanRecord) -> SpanRecord:
    """The model service's outermost SERVER span around ``span`` (itself when none): its
    ancestors in its own service, up to a CLIENT span or another service."""
    outer = span
    for node in index.ancestors(span):
        if node.kind == SpanKind.CLIENT or node.service != span.service:
            break
        if node.kind == SpanKind.SERVER:
            outer = node
    return outer


def system_above(index: TraceIndex, span: SpanRecord) -> SpanRecord | None:
    """The nearest serving system's request span above ``span``, within that system's depth
    (``[engine.system]``): Dynamo's ``http-request``, TensorRT-LLM's disaggregated proxy."""
    book = rules.active()
    for depth, node in enumerate(index.ancestors(span, MAX_PHASE_DEPTH), 1):
        system = book.system_of(node)
        if system is not None:
            return node if depth <= system.system_depth else None
    return None


def engine_parts(
    index: TraceIndex, spans: Sequence[SpanRecord]
) -> tuple[set[str], dict[str, list[tuple[str, int, int]]]]:
    """The spans inside the request span of an engine with parts (its nearest such ancestor,
    within that engine's part depth; a SERVER span among them is the request's own, never an
    inference call), and each such request span's phases from its parts."""
    book = rules.active()
    owners = {s.span_id: e for s in spans if (e := book.engine_of(s)) and e.part_depth}
    inner: set[str] = set()
    phases: dict[str, list[tuple[str, int, int]]] = {}
    if not owners:
        return inner, phases
    for s in spans:
        for depth, node in enumerate(index.ancestors(s, MAX_PHASE_DEPTH), 1):
            engine = owners.get(node.span_id)
            if engine is None:
                continue
            if depth <= engine.part_depth:
                inner.add(s.span_id)
                parent = index.by_id.get(s.parent_span_id)
                part = engine.part_of(s, parent, node)
                if part is not None:
                    found = engine.part_phases(part, s, parent, node)
                    phases.setdefault(node.span_id, []).extend(found)
            break
    return inner, phases


def find_requests(spans: Sequence[SpanRecord]) -> list[Request]:
    """Every inference call of a trace, by start (client's, else the server's), then id."""
    index = TraceIndex(spans)
    owned: dict[str, list[tuple[str, SpanRecord]]] = {}
    response_ends: dict[str, int] = {}
    for s in spans:
        found = _phase_owner(index, s)
        if found is not None:
            owned.setdefault(found[1], []).append((found[0], s))
        owner = _response_owner(index, s)
        if owner is not None:
            response_ends[owner] = max(response_ends.get(owner, s.end_ns), s.end_ns)
    _first_stages(owned, index)
    chains: dict[str, tuple[SpanRecord, ...]] = {}

    systems = {s.span_id: system for s in spans if (system := system_above(index, s)) is not None}
    inner, parts = engine_parts(index, spans)

    def chain_of(span: SpanRecord) -> tuple[SpanRecord, ...]:
        if span.span_id not in chains:
            # Under a serving system the call is the system's: its client is above the system's
            # span, and the CLIENT spans inside (Dynamo's router) are its own hops.
            transport = _transport_of(index, systems.get(span.span_id, span))
            chains[span.span_id] = () if transport is None else client_chain(index, transport)
        return chains[span.span_id]

    engines = {
        s.span_id for s in spans if has_latency(s) or (s.span_id in owned and _server_like(s))
    }
    # A SERVER span without phases is an inference call on its own word or its caller's (a GenAI
    # operation above it); one that holds another inference span is a gateway or the framework
    # around an engine, not a call of its own.
    said = [
        s
        for s in spans
        if s.kind == SpanKind.SERVER
        and s.span_id not in engines
        and s.span_id not in inner
        and (_says_inference(s) or any(is_model_call(c) for c in chain_of(s)))
    ]
    candidates = [s for s in spans if s.span_id in engines] + said
    above = {a.span_id for s in candidates for a in index.ancestors(s)}
    inference = [s for s in candidates if s.span_id in engines or s.span_id not in above]
    groups: dict[str, list[SpanRecord]] = {}
    clients: dict[str, SpanRecord | None] = {}
    for s in inference:
        chain = chain_of(s)
        client = chain[-1] if chain else None
        key = client.span_id if client is not None else s.span_id
        groups.setdefault(key, []).append(s)
        clients[key] = client
    requests = []
    for key, attempts in groups.items():
        ordered = tuple(sorted(attempts, key=lambda a: (a.start_ns, a.span_id)))
        phases = {a.span_id: tuple(owned.get(a.span_id, ())) for a in ordered}
        windows = {a.span_id: _window_of(index, systems.get(a.span_id, a)) for a in ordered}
        ends = {
            w.span_id: response_ends[w.span_id]
            for w in windows.values()
            if w.span_id in response_ends
        }
        in_system = frozenset(a.span_id for a in ordered if a.span_id in systems)
        placed = {a.span_id: tuple(parts[a.span_id]) for a in ordered if a.span_id in parts}
        requests.append(
            Request(
                clients[key],
                ordered,
                phases,
                chain_of(ordered[-1]),
                windows,
                ends,
                in_system,
                placed,
            )
        )
    return sorted(requests, key=lambda r: (r.start_ns, r.span_id))


def _first_stages(owned: dict[str, list[tuple[str, SpanRecord]]], index: TraceIndex) -> None:
    """The earliest stage span (by start, then id) of a name its engine lists in
    ``[engine.stages.first]`` stands for that bucket (TGI: the first ``infer`` step is the
    prefill, the later ones decode)."""
    book = rules.active()
    for owner_id, parts in owned.items():
        engine = book.engine_of(index.by_id[owner_id])
        if engine is None:
            continue
        for name, bucket in engine.first_stages:
            mine = [
                p
                for _, p in parts
                if p.name == name and p.attributes.get(LatscopeAttributes.PHASE) not in Phase.ALL
            ]
            if mine:
                first = min(mine, key=lambda p: (p.start_ns, p.span_id))
                parts[:] = [(bucket if p is first else b, p) for b, p in parts]


def attempt_groups(
    attempts: Sequence[SpanRecord], request: Request | None = None
) -> list[list[SpanRecord]]:
    """Attempts (oldest first) in groups whose windows overlap in time: each group is one try,
    the parallel samples of vLLM's ``n > 1`` (and the two workers of a disaggregated request) in
    one group, a retry starts a new group."""
    groups: list[list[SpanRecord]] = []
    end = 0
    for a in attempts:
        lo, hi = request.bounds(a) if request is not None else (a.start_ns, a.end_ns)
        if groups and lo < end:
            groups[-1].append(a)
            end = max(end, hi)
        else:
            groups.append([a])
            end = hi
    return groups


def _disaggregated(group: Sequence[SpanRecord], request: Request | None = None) -> bool:
    """A try in parts: an engine's prefill and decode roles, or several engine spans under one
    serving system (Dynamo's prefill and decode workers, TensorRT-LLM's context and generation
    servers)."""
    if any(disaggregated_role(a) is not None for a in group):
        return True
    return (
        request is not None
        and len(group) > 1
        and any(a.span_id in request.in_system for a in group)
    )


def critical_attempts(
    attempts: Sequence[SpanRecord], request: Request | None = None
) -> list[SpanRecord]:
    """The attempts the response waited for: of each try, the one that ended last (then started
    last, then by span id). vLLM's ``n > 1`` samples run side by side and the response is
    complete when the last one is; the others' queue and decode are not on its critical path.
    A try served by a prefill worker and a decode worker (disaggregated) is one request in two
    parts: both are on its critical path."""
    out: list[SpanRecord] = []
    for group in attempt_groups(attempts, request):
        if _disaggregated(group, request):
            out.extend(group)
        else:
            out.append(max(group, key=lambda a: (a.end_ns, a.start_ns, a.span_id)))
    return out


def _samples(request: Request) -> list[SpanRecord]:
    """The last try's attempts that answered the client: all of them (vLLM's samples), or the
    decode worker's when disaggregated (the prefill worker's first token went to it)."""
    last = attempt_groups(request.attempts, request)[-1]
    if any(disaggregated_role(a) is not None for a in last):
        return [a for a in last if disaggregated_role(a) == "decode"]
    return last


# -- attributing one request ---------------------------------------------------------------------


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
    going: the end of its last phase, or of its last response-body message; None without."""
    ends = [e for a in request.attempts for _, _, e in attempt_phases(request, a)]
    ends += [
        request.bounds(a)[1]
        for a in request.attempts
        if request.window(a).span_id in request.response_ends
    ]
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
    if hull <= dur:
        misfit = max(lo - hull_lo, hull_hi - hi)
        if misfit <= dur - hull:
            # Within the room the network legs leave: a server span that ends a little after the
            # client's (teardown) or legs of unequal length, not a clock skew to report.
            return Timeline(lo, hi, lo - hull_lo if hull_lo < lo else hi - hull_hi, False)
        offset = lo + (dur - hull) // 2 - hull_lo
        return Timeline(lo, hi, offset, False, -offset)
    reach = _reach(request)
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
    for attempt in critical_attempts(request.attempts, request):
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


def _kv_transfer(request: Request, ranked: Sequence[tuple[int, int, int]]) -> int | None:
    """The request's time in a KV-cache transfer stage no phase covers; None when none of its
    swept attempts records a transfer."""
    recorded = any(
        name == KV_TRANSFER
        for a in critical_attempts(request.attempts, request)
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
        attempts=len(attempt_groups(request.attempts, request)),
        status=request.window(last).status,
        clock_skew_ns=tl.skew,
        resource_attributes=dict(last.resource),
        provider=attrs.get(GenAIAttributes.PROVIDER_NAME)
        or attrs.get(GenAIAttributes.SYSTEM)
        or "",
        headers_only=tl.headers_only,
        kv_transfer_ns=_kv_transfer(request, ranked),
    )
    result.input_tokens = _tokens(attrs, *INPUT_TOKEN_KEYS)
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
