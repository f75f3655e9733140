"""The ``agent`` scenario: agent runs, each a trace with several LLM calls, some in parallel, and
tool calls between; and their ground truth.

An agent run, as an app built on an agent framework lives it (one ``asyncio`` task per agent)::

    invoke_agent research-assistant        INTERNAL, the root: the run's end-to-end time
      (app: build the plan prompt)
      POST /v1/chat/completions            CLIENT (latscope.sdk.client_call): plan
      (app: parse the plan)
      execute_tool search                  INTERNAL, gen_ai.operation.name = execute_tool
      (app)
      POST ... | POST ... | POST ...       2-3 calls at once (asyncio.gather)
      (app)
      execute_tool calculator
      (app)
      POST /v1/chat/completions            final answer
      (app)

The LLM calls go through the load generator (``latscope.sdk.client_call``, truth brackets around
it); the root and tool spans come from an OpenTelemetry tracer of the app's own, exported over
OTLP/gRPC like any app's. Each span's start and end is read on the monotonic clock right before
and right after OpenTelemetry stamps it, so every extent is known as a bracket.

The run's truth (``run_truth``) is computed from those readings and the simulator's per-call
truth, by the critical-path rule latscope documents (docs/attribution.md), not by latscope: from
the root's end walk back; at each point take the step that finished last at or before it
(clipped to it), count the gap after it as the app's time, count the step, continue from its
start. An LLM call taken whole counts its true buckets; a tool call its duration. Of a parallel
group, the call that finished last is taken whole, and the calls that started before it only
from their start to its start. The group's calls open their spans one after the other before
any request goes out (as an app fanning out does), so that piece is the time it takes to open
the next span (microseconds); where in the cut-off call it falls depends on where its server
span sat, which no reading pins down, so the truth widens each LLM bucket's bracket by it rather
than guess.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import SpanKind

from latscope.demo.load import LoadGenerator, PendingCall, RequestResult
from latscope.demo.scenarios import AgentConfig
from latscope.semconv import BUCKETS

AGENT_NAME = "research-assistant"
#: Output-token jitter of the parallel branches (they stay far apart: see AgentConfig).
BRANCH_JITTER = 0.2
Bracket = tuple[int, int]


# -- the app's own tracing ---------------------------------------------------------------------


class GrpcSpanExporter(SpanExporter):
    """OTLP/gRPC ``TraceService/Export`` with OpenTelemetry's public encoder: what any app's
    exporter sends (the demo installs no exporter package of its own)."""

    def __init__(self, endpoint: str) -> None:
        target = endpoint.split("://", 1)[-1]
        self._channel = grpc.insecure_channel(target)
        self._stub = trace_service_pb2_grpc.TraceServiceStub(self._channel)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            self._stub.Export(encode_spans(spans), timeout=10)
        except grpc.RpcError:
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._channel.close()


def agent_tracing(endpoint: str, service: str) -> TracerProvider:
    """The agent app's tracer provider (its root and tool spans), exporting to ``endpoint``."""
    provider = TracerProvider(
        resource=Resource.create({"service.name": service}), shutdown_on_exit=False
    )
    provider.add_span_processor(BatchSpanProcessor(GrpcSpanExporter(endpoint)))
    return provider


# -- one run as the agent lived it ---------------------------------------------------------------


@dataclass
class Step:
    """A child of the root: an LLM call (``result``) or a tool call, with the brackets of its
    span's start and end on the agent's monotonic clock."""

    kind: str  # "llm" or "tool"
    start_ns: Bracket
    end_ns: Bracket
    name: str = ""
    result: RequestResult | None = None
    span_id: str = ""

    @property
    def mid_start(self) -> int:
        return (self.start_ns[0] + self.start_ns[1]) // 2

    @property
    def mid_end(self) -> int:
        return (self.end_ns[0] + self.end_ns[1]) // 2

    @property
    def duration_ns(self) -> Bracket:
        return (self.end_ns[0] - self.start_ns[1], self.end_ns[1] - self.start_ns[0])


@dataclass
class AgentRun:
    run_id: str
    trace_id: str = ""
    root_span_id: str = ""
    start_ns: Bracket = (0, 0)
    end_ns: Bracket = (0, 0)
    steps: list[Step] = field(default_factory=list)
    error: str | None = None

    @property
    def calls(self) -> list[RequestResult]:
        return [s.result for s in self.steps if s.result is not None]

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.calls) and all(c.ok for c in self.calls)

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "trace_id": self.trace_id,
            "root_span_id": self.root_span_id,
            "error": self.error,
            "calls": [c.latscope_id for c in self.calls],
            "tools": [s.name for s in self.steps if s.kind == "tool"],
        }


def _hex_span(span: trace.Span) -> str:
    return f"{span.get_span_context().span_id:016x}"


class AgentGenerator(LoadGenerator):
    """``concurrency`` agents, each running agent runs back to back until the deadline; every
    LLM call goes through ``LoadGenerator.call`` (so ``results`` holds them all)."""

    def __init__(self, *args: Any, tracer: trace.Tracer, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tracer = tracer
        self.runs: list[AgentRun] = []

    @property
    def config(self) -> AgentConfig:
        assert self.scenario.agent is not None
        return self.scenario.agent

    async def _closed_loop(
        self, client: httpx.AsyncClient, rng: random.Random, deadline: float
    ) -> None:
        async def agent(n: int) -> None:
            agent_rng = random.Random(rng.random() + n)
            while time.monotonic() < deadline:
                await self.run_agent(client, agent_rng)

        agents = [asyncio.create_task(agent(n)) for n in range(self.load.concurrency)]
        await self._drain(agents, deadline)

    async def _app(self, rng: random.Random) -> None:
        """The app's own work between two steps (parsing, prompt building)."""
        await asyncio.sleep(rng.uniform(*self.config.gap_ms) / 1000)

    async def _tool(self, run: AgentRun, rng: random.Random, index: int) -> None:
        name, low, high = self.config.tools[index % len(self.config.tools)]
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.type": "function",
            "gen_ai.tool.call.id": f"call_{uuid.uuid4().hex[:16]}",
        }
        t0 = time.monotonic_ns()
        span = self.tracer.start_span(f"execute_tool {name}", kind=SpanKind.INTERNAL,
                                      attributes=attributes)  # fmt: skip
        t0_after = time.monotonic_ns()
        try:
            await asyncio.sleep(rng.uniform(low, high) / 1000)
        finally:
            t1 = time.monotonic_ns()
            span.end()
            t1_after = time.monotonic_ns()
        step = Step("tool", (t0, t0_after), (t1, t1_after), name, span_id=_hex_span(span))
        run.steps.append(step)

    async def _send(self, run: AgentRun, client: httpx.AsyncClient, pending: PendingCall) -> None:
        result = await self.send(client, pending)
        run.steps.append(Step("llm", result.start_ns, result.end_ns, result=result))

    async def _llm(
        self, run: AgentRun, client: httpx.AsyncClient, rng: random.Random, tokens: int
    ) -> None:
        await self._send(run, client, self.open(rng, max_tokens=max(1, tokens), stream=True))

    async def run_agent(self, client: httpx.AsyncClient, rng: random.Random) -> AgentRun:
        """One agent run (see the module docstring); kept in ``runs``."""
        config = self.config
        run = AgentRun(uuid.uuid4().hex)
        self.runs.append(run)
        t0 = time.monotonic_ns()
        root = self.tracer.start_span(
            f"invoke_agent {AGENT_NAME}",
            kind=SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": AGENT_NAME,
                "gen_ai.request.model": self.scenario.model,
            },
        )
        run.start_ns = (t0, time.monotonic_ns())
        context = root.get_span_context()
        run.trace_id, run.root_span_id = f"{context.trace_id:032x}", _hex_span(root)
        try:
            # Children pick the root up from the context (asyncio.gather copies it per task).
            with trace.use_span(root, end_on_exit=False):
                await self._app(rng)
                await self._llm(run, client, rng, config.plan_tokens)
                await self._app(rng)
                await self._tool(run, rng, 0)
                await self._app(rng)
                branches = rng.randint(*config.parallel)
                tokens = [
                    round(config.parallel_tokens[i % len(config.parallel_tokens)]
                          * rng.uniform(1 - BRANCH_JITTER, 1 + BRANCH_JITTER))
                    for i in range(branches)
                ]  # fmt: skip
                rng.shuffle(tokens)  # the longest branch is not always the first opened
                # A fan-out: every call's span opens (microseconds apart), then the requests go
                # out together, one task each.
                group = [self.open(rng, max_tokens=max(1, n), stream=True) for n in tokens]
                await asyncio.gather(*(self._send(run, client, p) for p in group))
                await self._app(rng)
                await self._tool(run, rng, 1)
                await self._app(rng)
                await self._llm(run, client, rng, config.final_tokens)
                await self._app(rng)
        except Exception as exc:  # a failed step fails the run, not the load
            run.error = f"{type(exc).__name__}: {exc}"
        finally:
            t1 = time.monotonic_ns()
            root.end()
            run.end_ns = (t1, time.monotonic_ns())
        return run


# -- the truth of a run ----------------------------------------------------------------------------


@dataclass
class RunTruth:
    """A run's true critical path as ``(low, high)`` brackets in ns: ``e2e`` (the root), the
    seven LLM buckets, ``tool`` and ``app``; the parts add up to the root's time."""

    trace_id: str
    e2e: Bracket
    llm: dict[str, Bracket]
    tool: Bracket
    app: Bracket
    #: latscope request ids of the calls the root waited for whole, in time order.
    calls_on_path: list[str]
    #: span ids of the tool calls on the path.
    tools_on_path: list[str]
    #: Calls on the path only from their start to a later sibling's start (parallel groups),
    #: and the largest such piece (ns).
    partial_calls: int = 0
    partial_max_ns: int = 0

    def parts(self) -> dict[str, Bracket]:
        """Every graded figure: e2e, the LLM buckets, tool, app."""
        return {"e2e": self.e2e, **{f"llm.{b}": v for b, v in self.llm.items()},
                "tool": self.tool, "app": self.app}  # fmt: skip


def _add(a: Bracket, b: Bracket) -> Bracket:
    return (a[0] + b[0], a[1] + b[1])


def run_truth(run: AgentRun, call_buckets: Mapping[str, Mapping[str, Bracket]]) -> RunTruth:
    """The run's critical path from the agent's readings and each call's true buckets
    (``call_buckets``: latscope request id -> the seven buckets as brackets, from
    ``truth.truth_buckets``)."""
    e2e = (run.end_ns[0] - run.start_ns[1], run.end_ns[1] - run.start_ns[0])
    llm: dict[str, Bracket] = dict.fromkeys(BUCKETS, (0, 0))
    llm_total: Bracket = (0, 0)
    tool: Bracket = (0, 0)
    calls: list[str] = []
    tools: list[str] = []
    partial, partial_max = 0, 0
    lo = (run.start_ns[0] + run.start_ns[1]) // 2
    # The walk's point, by the middle of its bracket (to choose) and its bracket (to count).
    t = (run.end_ns[0] + run.end_ns[1]) // 2
    t_ns = run.end_ns
    while t > lo:
        started = [s for s in run.steps if s.mid_start < t]
        if not started:
            break
        step = max(started, key=lambda s: (min(s.mid_end, t), -s.mid_start))
        end = min(step.mid_end, t)
        start = max(step.mid_start, lo)
        if end <= start:
            break
        if end == step.mid_end:  # taken whole
            if step.result is not None:
                rid = step.result.latscope_id or ""
                for bucket, bracket in call_buckets[rid].items():
                    llm[bucket] = _add(llm[bucket], bracket)
                llm_total = _add(llm_total, step.result.e2e_ns)
                calls.append(rid)
            else:
                tool = _add(tool, step.duration_ns)
                tools.append(step.span_id)
        else:  # the start of a step a later sibling's start cut off
            piece = (max(0, t_ns[0] - step.start_ns[1]), t_ns[1] - step.start_ns[0])
            partial, partial_max = partial + 1, max(partial_max, end - start)
            if step.result is not None:
                # Which buckets of the call the piece covers depends on where its server span
                # sat inside it, which only latscope's placement estimates: the truth says the
                # piece is somewhere in the call (mostly network: the request leg comes first).
                for bucket in BUCKETS:
                    llm[bucket] = _add(llm[bucket], (0, piece[1]))
                llm_total = _add(llm_total, piece)
            else:
                tool = _add(tool, piece)
        t, t_ns = start, step.start_ns
    spent_lo, spent_hi = llm_total[0] + tool[0], llm_total[1] + tool[1]
    return RunTruth(
        trace_id=run.trace_id,
        e2e=e2e,
        llm=llm,
        tool=tool,
        app=(e2e[0] - spent_hi, e2e[1] - spent_lo),
        calls_on_path=calls[::-1],
        tools_on_path=tools[::-1],
        partial_calls=partial,
        partial_max_ns=partial_max,
    )
