"""Which spans make each request of a trace: its inference spans (by the rulebook's engines and
what SERVER spans say of themselves), their clients and client chains, their windows, the phase
spans each owns, and how its attempts group into tries (``latscope.attribution.engine``'s rules
1 to 3, docs/attribution.md "Which spans make a request")."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from latscope.attribution import rules
from latscope.attribution.model import SpanRecord
from latscope.semconv import (
    INFERENCE_ROUTES,
    GenAIAttributes,
    GenAIOperation,
    HttpAttributes,
    LatscopeAttributes,
    OpenInferenceAttributes,
    Phase,
    SpanKind,
)

#: How far below its server span a phase span may sit.
MAX_PHASE_DEPTH = 8
#: How far up a span's ancestry the rules look (the client of an inference span, the tool call
#: around a server span, ...): deeper than any real call chain, a bound against cycles.
MAX_ANCESTRY = 32
#: The transport (a CLIENT span) and the spans of the same call directly above it, at most this
#: many in all, form the client chain (LangChain's LLM span over OpenInference's over an httpx
#: span; openai-v2's ``chat`` span over latscope's client span).
CLIENT_CHAIN = 3


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
    that window's response content and its last message ended (``response_ends``, on the
    server's clock; ``_response_span``)."""

    client: SpanRecord | None
    attempts: tuple[SpanRecord, ...]
    phases: dict[str, tuple[tuple[str, SpanRecord], ...]]
    #: The last attempt's transport and the spans of the call above it, up to the client,
    #: nearest first.
    client_chain: tuple[SpanRecord, ...] = ()
    windows: dict[str, SpanRecord] = field(default_factory=dict)
    response_ends: dict[str, tuple[int, int]] = field(default_factory=dict)
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

    @cached_property
    def tries(self) -> list[list[SpanRecord]]:
        """Its attempts grouped into tries (``attempt_groups``), worked out once."""
        return attempt_groups(self.attempts, self)

    @cached_property
    def critical(self) -> list[SpanRecord]:
        """The attempts its response waited for (``critical_attempts``), worked out once."""
        return critical_attempts(self.tries, self)

    def window(self, attempt: SpanRecord) -> SpanRecord:
        return self.windows.get(attempt.span_id, attempt)

    def _response_end(self, w: SpanRecord, which: int) -> int | None:
        """When window ``w``'s response content (``which`` 0) or last message (1) ended, within
        the window on the server's clock (None: no response message recorded)."""
        ends = self.response_ends.get(w.span_id)
        return None if ends is None else min(w.end_ns, max(ends[which], w.start_ns))

    def bounds(self, attempt: SpanRecord) -> tuple[int, int]:
        """The attempt's window on the server's clock, cut at the end of its response."""
        w = self.window(attempt)
        end = self._response_end(w, 1)
        return w.start_ns, (w.end_ns if end is None else end)

    def content_end(self, attempt: SpanRecord) -> int | None:
        """When the attempt's response content ended, within its window on the server's clock
        (None: no response message recorded)."""
        return self._response_end(self.window(attempt), 0)


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


def _response_span(sent: Sequence[int]) -> tuple[int, int]:
    """When a response's content ended and when its last message did, from when its body
    messages were handed to the server (their ``http send`` spans' starts: a span's end is
    when the server's write returned, late on a busy host or with a slow reader). A streamed
    response (several messages) ends with one that only closes it (Starlette's
    ``StreamingResponse`` sends an empty body after the last event), which a client that stops
    at the stream's last event does not wait for (the openai SDK closes a stream at
    ``[DONE]``)."""
    ordered = sorted(sent)
    return ordered[-2] if len(ordered) > 1 else ordered[-1], ordered[-1]


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


def find_requests(spans: Sequence[SpanRecord], index: TraceIndex | None = None) -> list[Request]:
    """Every inference call of a trace, by start (client's, else the server's), then id;
    ``index``: the spans' ``TraceIndex``, when the caller has it already."""
    index = index or TraceIndex(spans)
    owned: dict[str, list[tuple[str, SpanRecord]]] = {}
    sends: dict[str, list[int]] = {}
    for s in spans:
        found = _phase_owner(index, s)
        if found is not None:
            owned.setdefault(found[1], []).append((found[0], s))
        owner = _response_owner(index, s)
        if owner is not None:
            sends.setdefault(owner, []).append(s.start_ns)
    response_ends = {owner: _response_span(sent) for owner, sent in sends.items()}
    _first_stages(owned, index)
    chains: dict[str, tuple[SpanRecord, ...]] = {}

    book = rules.active()
    systems = (
        {s.span_id: system for s in spans if (system := system_above(index, s)) is not None}
        if any(book.system_of(s) is not None for s in spans)
        else {}
    )
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


def critical_attempts(tries: list[list[SpanRecord]], request: Request) -> list[SpanRecord]:
    """The attempts the response waited for: of each try (``attempt_groups``), the one that
    ended last (then started last, then by span id). vLLM's ``n > 1`` samples run side by side
    and the response is complete when the last one is; the others' queue and decode are not on
    its critical path. A try served by a prefill worker and a decode worker (disaggregated) is
    one request in two parts: both are on its critical path."""
    out: list[SpanRecord] = []
    for group in tries:
        if _disaggregated(group, request):
            out.extend(group)
        else:
            out.append(max(group, key=lambda a: (a.end_ns, a.start_ns, a.span_id)))
    return out


def _samples(request: Request) -> list[SpanRecord]:
    """The last try's attempts that answered the client: all of them (vLLM's samples), or the
    decode worker's when disaggregated (the prefill worker's first token went to it)."""
    last = request.tries[-1]
    if any(disaggregated_role(a) is not None for a in last):
        return [a for a in last if disaggregated_role(a) == "decode"]
    return last
