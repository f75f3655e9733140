"""Random agent / RAG runs with ground truth, for property tests of multi-call attribution.

``agent_run(seed)`` builds one trace: a root (``invoke_agent`` INTERNAL span, an HTTP SERVER
span, or both), and under it a sequence of steps with orchestration gaps between them: LLM calls
(any client shape of ``tests.upstream_traces`` over any server shape, sometimes through a gateway,
sometimes retried), tool calls (``execute_tool {name}`` INTERNAL spans, sometimes calling an
outside HTTP API or an LLM of their own) and parallel groups whose branches start together, as
``asyncio.gather`` runs them. Every host has its own clock offset; the truth is on the root's
(the agent's) clock.

The truth of a run: every inference call's ``Truth``, and the run's critical path, computed from
the structure built. The rule (Jaeger's critical path, made exact): from the root's end walk
back; at each point take the child that finished last before that point, count it down to its
start and continue from there; time where no child runs is the parent's own. So a parallel group
counts its longest branch only; an LLM call on the path counts its request's buckets (plus its
time outside the request, gateway hops and client-library wrappers, as ``network``); a tool on
the path counts as tool time except the LLM calls it makes, which count as LLM time; the rest is
the app's own time. Durations are drawn with ns resolution and parallel branches are redrawn
until they differ, so the walk never meets a tie.

Use ``agent_run(seed, ...)`` directly, or ``agent_runs()`` as a hypothesis strategy.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from hypothesis import strategies as st

from latscope.attribution.model import SpanRecord
from latscope.semconv import BUCKETS
from tests.upstream_traces import (
    BUILDERS,
    CLIENT,
    INTERNAL,
    MS,
    SCOPE_APP,
    SCOPE_HTTPX,
    SERVER,
    T0,
    Built,
    Host,
    LlmCall,
    TraceBuilder,
    Truth,
    _draw,
    finish,
    random_client,
    random_server,
    span_records,
)

TOOLS: Final = ("search", "retrieve", "calculator", "fetch_url", "sql_query", "summarize")
#: Tools whose work is an LLM call of their own (counted as LLM time on the critical path).
LLM_TOOLS: Final = ("summarize",)
AGENT_ROUTE: Final = "/v1/agent/run"


# -- the plan -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HttpPair:
    """A tool's request to an outside API: CLIENT span (agent host) over the API's SERVER span
    (tool host); a plain JSON response, so the client span covers the server's."""

    request_leg: int
    server: int
    response_leg: int
    route: str = "/search"

    def duration(self) -> int:
        return self.request_leg + self.server + self.response_leg


@dataclass(frozen=True)
class LlmStep:
    call: LlmCall
    #: which of the run's model hosts serves it
    host: int = 0

    def duration(self) -> int:
        return self.call.duration()


@dataclass(frozen=True)
class ToolStep:
    """``execute_tool {name}``: its own work before, between and after what it calls."""

    name: str
    pre: int
    inner: tuple[tuple[int, HttpPair | LlmStep], ...]
    post: int

    def duration(self) -> int:
        return self.pre + sum(g + x.duration() for g, x in self.inner) + self.post


@dataclass(frozen=True)
class Parallel:
    """Branches started together (``asyncio.gather``): siblings under the same parent span."""

    branches: tuple[LlmStep | ToolStep, ...]

    def __post_init__(self) -> None:
        durations = [b.duration() for b in self.branches]
        assert len(set(durations)) == len(durations), "parallel branches must not tie"

    def duration(self) -> int:
        return max(b.duration() for b in self.branches)


Element = LlmStep | ToolStep | Parallel


@dataclass(frozen=True)
class AgentPlan:
    """``root``: "agent" (invoke_agent INTERNAL), "http" (an HTTP SERVER span) or "http+agent"
    (invoke_agent under the HTTP SERVER span, ``wrap`` ns of the server's own time before and
    after it)."""

    root: str
    items: tuple[tuple[int, Element], ...]
    tail: int
    wrap: tuple[int, int] = (0, 0)

    def duration(self) -> int:
        body = sum(g + e.duration() for g, e in self.items) + self.tail
        return body + sum(self.wrap)


# -- the truth ------------------------------------------------------------------------------------


@dataclass
class CriticalPath:
    """The run's end-to-end time along its critical path: LLM time per bucket, tool time, and the
    app's own time (ns, on the agent's clock)."""

    e2e_ns: int
    llm_ns: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0))
    tool_ns: int = 0
    app_ns: int = 0
    #: request ids of the LLM calls on the path, in time order
    calls: list[str] = field(default_factory=list)
    #: span ids (hex) of the execute_tool spans on the path, in time order
    tools: list[str] = field(default_factory=list)

    @property
    def llm_total_ns(self) -> int:
        return sum(self.llm_ns.values())

    def check(self) -> None:
        assert all(v >= 0 for v in self.llm_ns.values()), self.llm_ns
        assert self.tool_ns >= 0 and self.app_ns >= 0
        assert self.llm_total_ns + self.tool_ns + self.app_ns == self.e2e_ns, self

    def _add_call(self, truth: Truth, overhead: int) -> None:
        for bucket, ns in truth.buckets.items():
            assert ns is not None, "a call on an agent's path has a client span"
            self.llm_ns[bucket] += ns
        self.llm_ns["network"] += overhead
        self.calls.append(truth.request_id)


@dataclass(frozen=True)
class Node:
    """A span under the root as the run lived it (true extent on the agent's clock): what the
    independent critical-path walk in the tests reads. ``kind``: "llm", "tool", "http"."""

    span_id: str
    parent: str
    start: int
    end: int
    kind: str
    truth: Truth | None = None
    overhead: int = 0


@dataclass
class AgentRun:
    """One built run: the spans (``built``), every call's truth, the critical path, and the
    nodes under the root (true extents, for checking the path by the rule itself)."""

    built: Built
    plan: AgentPlan
    trace_id: str
    root_span_id: str
    #: the span the steps hang under: the invoke_agent span, else the root
    body_span_id: str
    start_ns: int
    end_ns: int
    critical_path: CriticalPath
    nodes: list[Node]

    @property
    def requests(self) -> list[Truth]:
        return self.built.truths

    def check(self) -> None:
        for truth in self.requests:
            truth.check()
        ids = [t.request_id for t in self.requests]
        assert len(set(ids)) == len(ids), "request ids repeat"
        self.critical_path.check()
        assert self.critical_path.e2e_ns == self.end_ns - self.start_ns


# -- drawing a plan -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Knobs:
    """What a run may contain."""

    max_items: int = 5
    parallel: bool = True
    gateways: bool = True
    retries: bool = True
    skew: bool = True
    headers_only: bool = True
    model_hosts: int = 3


def _llm_step(rng: random.Random, k: Knobs) -> LlmStep:
    clients = ["sdk", "openai_v2", "openinference"]
    if k.headers_only:
        clients.append("httpx")
    if k.gateways:
        clients.append("gateway")
    client = rng.choice(clients)
    server = rng.choice(("sdk", "vllm_v1", "vllm_v0", "vllm_n", "sglang"))
    knobs: dict[str, Any] = {"with_httpx": True} if client == "openinference" else {}
    failed: tuple[Any, ...] = ()
    if k.retries and client == "sdk" and server == "sdk" and rng.random() < 0.4:
        failed = tuple(
            replace(random_server(rng, "sdk"), failed=True)  # type: ignore[type-var]
            for _ in range(rng.randint(1, 2))
        )
    call = LlmCall(random_client(rng, client, **knobs), random_server(rng, server), failed)
    return LlmStep(call, rng.randrange(k.model_hosts))


def _tool_step(rng: random.Random, k: Knobs) -> ToolStep:
    name = rng.choice(TOOLS)
    inner: list[tuple[int, HttpPair | LlmStep]] = []
    if name in LLM_TOOLS:
        inner.append((_draw(rng, 0, 3), _llm_step(rng, k)))
    elif rng.random() < 0.7:
        pair = HttpPair(
            _draw(rng, 0.2, 10), _draw(rng, 2, 200), _draw(rng, 0.2, 10), route=f"/{name}"
        )
        inner.append((_draw(rng, 0, 3), pair))
    return ToolStep(name, _draw(rng, 0.1, 50), tuple(inner), _draw(rng, 0.1, 20))


def _branch(rng: random.Random, k: Knobs) -> LlmStep | ToolStep:
    return _llm_step(rng, k) if rng.random() < 0.6 else _tool_step(rng, k)


def _parallel(rng: random.Random, k: Knobs) -> Parallel:
    while True:
        branches = tuple(_branch(rng, k) for _ in range(rng.randint(2, 4)))
        durations = [b.duration() for b in branches]
        if len(set(durations)) == len(durations):
            return Parallel(branches)


def _gap(rng: random.Random) -> int:
    # Back-to-back children (no gap at all) are where critical-path walks go wrong; keep some.
    return 0 if rng.random() < 0.2 else _draw(rng, 0.05, 30)


def draw_plan(rng: random.Random, k: Knobs = Knobs()) -> AgentPlan:
    """A random run plan; it holds at least one LLM call."""
    items: list[tuple[int, Element]] = [(_gap(rng), _llm_step(rng, k))]
    for _ in range(rng.randint(0, k.max_items - 1)):
        roll = rng.random()
        element: Element
        if k.parallel and roll < 0.25:
            element = _parallel(rng, k)
        elif roll < 0.55:
            element = _tool_step(rng, k)
        else:
            element = _llm_step(rng, k)
        items.append((_gap(rng), element))
    rng.shuffle(items)
    root = rng.choice(("agent", "http", "http+agent"))
    wrap = (_draw(rng, 0.1, 5), _draw(rng, 0.1, 5)) if root == "http+agent" else (0, 0)
    return AgentPlan(root, tuple(items), _gap(rng), wrap)


# -- writing it -----------------------------------------------------------------------------------


class _Writer:
    def __init__(self, rng: random.Random, k: Knobs) -> None:
        self.rng = rng
        self.tb = TraceBuilder(rng)
        self.agent = Host("agent", 0)

        jitter: list[int] = []

        def offset() -> int:
            """A host's clock offset from the agent's: 0, or a multiple of 100 ms up to 5 s either
            way plus a part of a millisecond the run's hosts share, so any two hosts' clocks are
            the same or at least 99 ms apart. A server clock a few ms ahead of its client's makes
            a server span that ends past its client's by less than its tail after the response
            while its work fits inside, which the spans cannot tell from a span closing after
            the response went out, and latscope reads as the latter (docs/attribution.md, "Clock
            skew and headers-only clients")."""
            if not k.skew:
                return 0
            hundreds = round(rng.randint(-5_000, 5_000), -2)
            jitter.append(rng.randint(0, MS))
            return hundreds * MS + jitter[0] if hundreds else 0

        self.models = [Host(f"llm-{i}", offset()) for i in range(k.model_hosts)]
        self.gateway = Host("llm-gateway", offset())
        self.tools = Host("tool-api", offset())
        self.truths: list[Truth] = []
        self.nodes: list[Node] = []

    def llm(self, step: LlmStep, parent: bytes, start: int, path: CriticalPath | None) -> int:
        made = step.call.emit(
            self.tb, self.agent, self.models[step.host], parent, start, gateway=self.gateway
        )
        assert made.end - made.start == step.duration()
        assert made.truth.e2e_ns + made.overhead_ns == step.duration()
        self.truths.append(made.truth)
        assert made.outer_span is not None
        self.nodes.append(
            Node(
                made.outer_span.hex(),
                parent.hex(),
                made.start,
                made.end,
                "llm",
                made.truth,
                made.overhead_ns,
            )
        )
        if path is not None:
            path._add_call(made.truth, made.overhead_ns)
        return made.end

    def http(self, pair: HttpPair, parent: bytes, start: int) -> int:
        end = start + pair.duration()
        url = f"http://tool-api.internal:9000{pair.route}"
        cid = self.tb.add(
            self.agent,
            SCOPE_HTTPX,
            "GET",
            CLIENT,
            start,
            end,
            parent=parent,
            attributes={"http.method": "GET", "http.url": url, "http.status_code": 200},
        )
        s0 = start + pair.request_leg
        self.tb.add(
            self.tools,
            ("opentelemetry.instrumentation.asgi", ""),
            f"GET {pair.route}",
            SERVER,
            s0,
            s0 + pair.server,
            parent=cid,
            attributes={
                "http.request.method": "GET",
                "http.route": pair.route,
                "url.path": pair.route,
                "http.response.status_code": 200,
            },
        )
        self.nodes.append(Node(cid.hex(), parent.hex(), start, end, "http"))
        return end

    def tool(self, step: ToolStep, parent: bytes, start: int, path: CriticalPath | None) -> int:
        end = start + step.duration()
        call_id = f"call_{self.rng.getrandbits(64):016x}"
        sid = self.tb.add(
            self.agent,
            SCOPE_APP,
            f"execute_tool {step.name}",
            INTERNAL,
            start,
            end,
            parent=parent,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": step.name,
                "gen_ai.tool.call.id": call_id,
                "gen_ai.tool.type": "function",
            },
        )
        self.nodes.append(Node(sid.hex(), parent.hex(), start, end, "tool"))
        if path is not None:
            path.tools.append(sid.hex())
            path.tool_ns += step.pre + step.post
        t = start + step.pre
        for gap, inner in step.inner:
            t += gap
            if path is not None:
                path.tool_ns += gap
            if isinstance(inner, HttpPair):
                t = self.http(inner, sid, t)
                if path is not None:
                    path.tool_ns += inner.duration()
            else:
                t = self.llm(inner, sid, t, path)
        assert t + step.post == end
        return end

    def element(self, e: Element, parent: bytes, start: int, path: CriticalPath) -> int:
        if isinstance(e, LlmStep):
            return self.llm(e, parent, start, path)
        if isinstance(e, ToolStep):
            return self.tool(e, parent, start, path)
        longest = max(e.branches, key=lambda b: b.duration())
        for branch in e.branches:
            on_path = path if branch is longest else None
            if isinstance(branch, LlmStep):
                self.llm(branch, parent, start, on_path)
            else:
                self.tool(branch, parent, start, on_path)
        return start + e.duration()


def write_run(
    plan: AgentPlan, rng: random.Random, k: Knobs = Knobs(), start_ns: int = T0
) -> AgentRun:
    """Write ``plan`` as spans (ids and host offsets from ``rng``) and compute its truth."""
    w = _Writer(rng, k)
    end_ns = start_ns + plan.duration()
    path = CriticalPath(plan.duration())
    agent_attrs = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "research-assistant",
        "gen_ai.agent.id": f"asst_{rng.getrandbits(48):012x}",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "llama-3-8b",
    }
    if plan.root == "agent":
        root = body = w.tb.add(
            w.agent,
            SCOPE_APP,
            "invoke_agent research-assistant",
            INTERNAL,
            start_ns,
            end_ns,
            attributes=agent_attrs,
        )
    else:
        root = body = w.tb.add(
            w.agent,
            ("opentelemetry.instrumentation.asgi", ""),
            f"POST {AGENT_ROUTE}",
            SERVER,
            start_ns,
            end_ns,
            attributes={
                "http.request.method": "POST",
                "http.route": AGENT_ROUTE,
                "url.path": AGENT_ROUTE,
                "http.response.status_code": 200,
            },
        )
        if plan.root == "http+agent":
            before, after = plan.wrap
            body = w.tb.add(
                w.agent,
                SCOPE_APP,
                "invoke_agent research-assistant",
                INTERNAL,
                start_ns + before,
                end_ns - after,
                parent=root,
                attributes=agent_attrs,
            )
            path.app_ns += before + after
    t = start_ns + plan.wrap[0]
    for gap, element in plan.items:
        t += gap
        path.app_ns += gap
        t = w.element(element, body, t, path)
    path.app_ns += plan.tail
    assert t + plan.tail + plan.wrap[1] == end_ns
    built = finish(w.tb, w.truths)
    run = AgentRun(
        built, plan, w.tb.trace_hex, root.hex(), body.hex(), start_ns, end_ns, path, w.nodes
    )
    run.check()
    return run


def agent_run(seed: int, *, start_ns: int = T0, **knobs: Any) -> AgentRun:
    """A random run from ``seed``; ``knobs`` are ``Knobs`` fields (e.g. ``parallel=False``)."""
    rng = random.Random(seed)
    k = Knobs(**knobs)
    return write_run(draw_plan(rng, k), rng, k, start_ns)


def mixed_traces(shape_seeds: Iterable[int], runs: int) -> dict[str, list[SpanRecord]]:
    """One batch of real traffic's shapes: every upstream shape (``BUILDERS``) at each of
    ``shape_seeds``, and the agent runs of seeds 0 to ``runs`` - 1 with parallel calls, gateways,
    retries and skew; the spans of each trace, by trace id."""
    traces: dict[str, list[SpanRecord]] = {}
    for _, build in BUILDERS:
        for seed in shape_seeds:
            traces.update(span_records(build(seed).resource_spans))
    for seed in range(runs):
        run = agent_run(seed, parallel=True, gateways=True, retries=True, skew=True)
        traces.update(span_records(run.built.resource_spans))
    return traces


def agent_runs(**knobs: Any) -> st.SearchStrategy[AgentRun]:
    """Hypothesis strategy of random runs (shrinks by seed)."""
    return st.integers(0, 2**32 - 1).map(lambda seed: agent_run(seed, **knobs))


def path_by_walk(run: AgentRun) -> CriticalPath:
    """The critical path by the rule itself, over the nodes' true extents (no plan): from the
    parent's end walk back, take the child that finished last before the point, descend into
    tools, count LLM calls by their truth. The tests hold it equal to ``run.critical_path``."""
    children: dict[str, list[Node]] = {}
    for node in run.nodes:
        children.setdefault(node.parent, []).append(node)
    path = CriticalPath(run.end_ns - run.start_ns)

    def walk(parent: str, start: int, end: int, own: str) -> None:
        point = end
        kids = children.get(parent, [])
        taken: list[Node] = []
        while True:
            before = [n for n in kids if n.end <= point and n.start >= start]
            if not before:
                break
            last = max(before, key=lambda n: n.end)
            ties = [n for n in before if n.end == last.end]
            assert len(ties) == 1, "the walk met a tie"
            _count(own, point - last.end)
            taken.append(last)
            point = last.start
        _count(own, point - start)
        for node in reversed(taken):
            if node.kind == "llm":
                assert node.truth is not None
                path._add_call(node.truth, node.overhead)
            elif node.kind == "http":
                path.tool_ns += node.end - node.start
            else:
                path.tools.append(node.span_id)
                walk(node.span_id, node.start, node.end, "tool")

    def _count(own: str, ns: int) -> None:
        if own == "tool":
            path.tool_ns += ns
        else:
            path.app_ns += ns

    # The root's own time (and an http+agent wrapper's) is the app's.
    walk(run.body_span_id, run.start_ns + run.plan.wrap[0], run.end_ns - run.plan.wrap[1], "app")
    path.app_ns += sum(run.plan.wrap)
    return path


def summary(run: AgentRun) -> Mapping[str, Any]:
    """A short description of a run, for failure messages."""
    return {
        "trace_id": run.trace_id,
        "root": run.plan.root,
        "requests": [t.shape for t in run.requests],
        "e2e_ms": run.critical_path.e2e_ns / MS,
    }
