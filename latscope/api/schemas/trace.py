"""One request and one trace: its attribution, spans, tokens, explanation (with its standing,
``answers.models.standing``), an agent run, and the live feed."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field
from typing_extensions import TypedDict

from latscope.attribution.answers.models.base import (
    ATTRIBUTION_EXAMPLE,
    TRACE_ID_EXAMPLE,
    Answer,
    Buckets,
    Itl,
    _example,
    row,
)
from latscope.attribution.answers.models.standing import STANDING_EXAMPLE, Standing
from latscope.attribution.queries import ATTRIBUTE_CHARS


class Attribution(Answer):
    """Where one request's end-to-end time went."""

    model_config = _example(ATTRIBUTION_EXAMPLE)

    trace_id: str
    request_id: str = Field(
        description="the call's id: the trace id and its client's span id (the GenAI "
        "operation around the call, else its nearest CLIENT span; else its server span's), as "
        "/v1/requests/{id} takes it"
    )
    service: str
    model: str
    e2e_ms: float
    buckets_ms: Buckets
    ttft_ms: float | None
    ttft_server_ms: float | None
    tpot_ms: float | None
    itl_ms: Itl
    stalls: int
    input_tokens: int | None
    output_tokens: int | None
    clock_skew_ms: float = Field(description="how far the server clock runs ahead of the client's")
    attempts: int
    client_headers_only: bool = Field(
        description="the client span ended at the response headers (upstream HTTP "
        "instrumentation of a stream): the call was extended to the server's end plus the "
        "estimated return leg",
    )
    kv_transfer_ms: float | None = Field(
        default=None,
        description="time in a KV-cache transfer between a prefill and a decode worker "
        "(disaggregated serving) that no phase covers: part of buckets_ms.other, named on its "
        "own; null when no transfer was recorded",
    )
    gpu: dict[str, dict[str, float]] = Field(description="per phase: NVML figures")


@row
class SpanEvent(TypedDict):
    name: str
    at_ms: float


@row
class Span(TypedDict):
    span_id: str
    parent_span_id: str
    name: str
    kind: str
    service: str
    phase: str | None
    request_id: Annotated[
        str | None, Field(description="the call this span is the client (or lone server) span of")
    ]
    start_ms: Annotated[
        float,
        Field(
            description="offset from the request's start (a trace's: its root's), on the "
            "caller's clock"
        ),
    ]
    duration_ms: float
    depth: int
    status: str
    attributes: Annotated[
        dict[str, str],
        Field(
            description=f"a value of more than {ATTRIBUTE_CHARS:,} characters (a prompt, a "
            f"completion) as its first {ATTRIBUTE_CHARS:,} and '...[N characters]', N its "
            "length, but those the attribution rules read; "
            "/v1/traces/{trace_id}/spans/{span_id} gives the span with every value whole"
        ),
    ]
    events: list[SpanEvent]


SPAN_EXAMPLE: dict[str, Any] = {
    "span_id": "00f067aa0ba902b7",
    "parent_span_id": "53995c3f42cd8ad8",
    "name": "prefill",
    "kind": "Internal",
    "service": "llm-server",
    "phase": "prefill",
    "start_ms": 180.0,
    "duration_ms": 200.0,
    "depth": 2,
    "status": "Unset",
    "request_id": None,
    "attributes": {"latscope.phase": "prefill"},
    "events": [],
}


class TraceSpans(Answer):
    """Every span of a trace, server spans moved onto the client's clock, depth-first: each span's
    children under it, siblings by start (as a waterfall lists them)."""

    model_config = _example(
        {
            "trace_id": TRACE_ID_EXAMPLE,
            "start_unix_ms": 1763000000000.0,
            "clock_skew_ms": 0.0,
            "spans": [SPAN_EXAMPLE],
        }
    )

    trace_id: str
    start_unix_ms: float
    clock_skew_ms: float
    spans: list[Span]


@row
class StoredEvent(TypedDict):
    name: str
    at_unix_ns: int
    attributes: dict[str, str]


@row
class StoredLink(TypedDict):
    trace_id: str
    span_id: str
    attributes: dict[str, str]


class StoredSpan(Answer):
    """One span as stored: every attribute value whole (a prompt, a completion), its resource,
    events and links; times on the span's own clock."""

    model_config = _example(
        {
            "trace_id": TRACE_ID_EXAMPLE,
            "span_id": "00f067aa0ba902b7",
            "parent_span_id": "53995c3f42cd8ad8",
            "name": "chat llama-3",
            "kind": "Client",
            "service": "chat-app",
            "start_unix_ns": 1763000000000000000,
            "duration_ms": 812.5,
            "status": "Ok",
            "status_message": "",
            "attributes": {"gen_ai.request.model": "llama-3", "gen_ai.prompt": "Summarize ..."},
            "resource": {"service.name": "chat-app", "k8s.pod.name": "chat-7d9f-x2"},
            "events": [
                {"name": "gen_ai.first_token", "at_unix_ns": 1763000000180000000, "attributes": {}}
            ],
            "links": [],
        }
    )

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: str
    service: str
    start_unix_ns: int = Field(description="the span's start as stored, on its own clock")
    duration_ms: float
    status: str
    status_message: str
    attributes: dict[str, str] = Field(description="every value whole, as stored")
    resource: dict[str, str]
    events: list[StoredEvent]
    links: list[StoredLink]


class Stall(Answer):
    index: int = Field(description="the token that came late (0 is the first token)")
    at_ms: float
    gap_ms: float


class TokenTimeline(Answer):
    count: int
    times_ms: list[float] = Field(description="each token's arrival, from the request's start")
    first_token_ms: float | None
    stall_threshold_ms: float | None
    stalls: list[Stall]


TOKENS_EXAMPLE = {
    "count": 4,
    "times_ms": [345.0, 365.0, 385.0, 460.0],
    "first_token_ms": 345.0,
    "stall_threshold_ms": 80.0,
    "stalls": [],
}


class RequestTokens(TokenTimeline):
    model_config = _example(
        {"trace_id": TRACE_ID_EXAMPLE, "request_id": TRACE_ID_EXAMPLE + "-00f067aa0ba902b7",
         **TOKENS_EXAMPLE}
    )  # fmt: skip

    trace_id: str
    request_id: str


class Explain(Answer):
    """One request: its buckets, where it stands among its peers, its waterfall and its token
    timeline."""

    model_config = _example(
        {"attribution": ATTRIBUTION_EXAMPLE, "standing": STANDING_EXAMPLE,
         "spans": [SPAN_EXAMPLE], "tokens": TOKENS_EXAMPLE}
    )  # fmt: skip

    attribution: Attribution
    standing: Standing
    spans: list[Span]
    tokens: TokenTimeline


# -- a trace with several calls (an agent run) ---------------------------------------------------


class TraceRequests(Answer):
    """Every inference call of a trace, by start, each with its seven buckets."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"trace_id": TRACE_ID_EXAMPLE,
                                         "requests": [ATTRIBUTION_EXAMPLE]}]},
    )  # fmt: skip

    trace_id: str
    requests: list[Attribution] = Field(
        description="one per inference call, by start; fetch one with /v1/requests/{request_id}"
    )


@row
class PathBuckets(TypedDict):
    """LLM time on the critical path, in the seven buckets (ms)."""

    network: float
    queue: float
    preprocess: float
    prefill: float
    decode: float
    postprocess: float
    other: float


class RunBudget(Answer):
    """The run's end-to-end time along its critical path: ``llm + tool + app = e2e_ms``."""

    llm: float = Field(description="in LLM calls (the sum of llm_buckets)")
    llm_buckets: PathBuckets
    tool: float = Field(description="in tool calls (execute_tool spans), outside LLM calls")
    app: float = Field(description="the app's own time: orchestration, other services")


class RunRoot(Answer):
    span_id: str
    name: str
    service: str
    kind: str


@row
class RunCall(TypedDict):
    request_id: str
    start_ms: Annotated[float, Field(description="from the root's start")]
    e2e_ms: float
    on_critical_path_ms: Annotated[
        float, Field(description="how much of the call the root waited for")
    ]
    on_critical_path_buckets_ms: PathBuckets
    attribution: Attribution


@row
class RunTool(TypedDict):
    span_id: str
    name: str
    tool: Annotated[str, Field(description="gen_ai.tool.name")]
    start_ms: float
    duration_ms: float
    on_critical_path_ms: float


@row
class PathStep(TypedDict):
    """One piece of the critical path, in time order."""

    span_id: str
    name: str
    category: Annotated[str, Field(description="llm, tool or app")]
    bucket: Annotated[
        str | None, Field(description="for llm steps: the bucket of the call's timeline")
    ]
    request_id: str | None
    start_ms: float
    end_ms: float


RUN_EXAMPLE: dict[str, Any] = {
    "trace_id": TRACE_ID_EXAMPLE,
    "root": {"span_id": "53995c3f42cd8ad8", "name": "invoke_agent research-assistant",
             "service": "agent", "kind": "Internal"},
    "e2e_ms": 1800.0,
    "critical_path_ms": {
        "llm": 1000.0,
        "llm_buckets": ATTRIBUTION_EXAMPLE["buckets_ms"],
        "tool": 650.0,
        "app": 150.0,
    },
    "calls": [{
        "request_id": ATTRIBUTION_EXAMPLE["request_id"],
        "start_ms": 20.0,
        "e2e_ms": 1000.0,
        "on_critical_path_ms": 1000.0,
        "on_critical_path_buckets_ms": ATTRIBUTION_EXAMPLE["buckets_ms"],
        "attribution": ATTRIBUTION_EXAMPLE,
    }],
    "tools": [{"span_id": "a3ce929d0e0e4736", "name": "execute_tool search", "tool": "search",
               "start_ms": 1100.0, "duration_ms": 650.0, "on_critical_path_ms": 650.0}],
    "path": [{"span_id": "00f067aa0ba902b7", "name": "chat llama-3-8b", "category": "llm",
              "bucket": "queue", "request_id": ATTRIBUTION_EXAMPLE["request_id"],
              "start_ms": 100.0, "end_ms": 200.0}],
    "cycles": [],
}  # fmt: skip


class Run(Answer):
    """A trace explained as one run: the root's end-to-end time, and along its critical path
    (the chain of work the root waited on) the time in LLM calls by bucket, in tools and in
    the app. Parallel calls count once: only what the root waited for is on the path."""

    model_config = _example(RUN_EXAMPLE)

    trace_id: str
    root: RunRoot
    e2e_ms: float = Field(description="the root span's duration")
    critical_path_ms: RunBudget
    calls: list[RunCall] = Field(description="every inference call, by start")
    tools: list[RunTool] = Field(description="every tool call, by start")
    path: list[PathStep]
    cycles: list[str] = Field(
        description="spans whose parent link closed a cycle (a span its own ancestor, as a "
        "client sent it): that link is left out and the rest of the trace explained"
    )


class TraceExplain(Answer):
    """A trace at once: its run and its waterfall, each call's spans on its caller's clock
    (``request_id`` marks each call's client span, else its server span)."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"trace_id": TRACE_ID_EXAMPLE, "run": RUN_EXAMPLE,
                                         "spans": [SPAN_EXAMPLE]}]},
    )  # fmt: skip

    trace_id: str
    run: Run
    spans: list[Span]


class LiveRequest(Attribution):
    model_config = _example({**ATTRIBUTION_EXAMPLE, "start_unix_nano": 1767365000000000000})

    start_unix_nano: int = Field(description="when the request started (client clock if known)")


class Live(Answer):
    """Requests attributed since the cursor of an earlier answer, oldest first."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "epoch": "9f1c2a7b40d35e61",
                    "cursor": 1207,
                    "missed": 0,
                    "requests": [{**ATTRIBUTION_EXAMPLE, "start_unix_nano": 1767365000000000000}],
                }
            ]
        },
    )

    epoch: str = Field(description="names the server process's numbering; pass it back")
    cursor: int = Field(description="pass back as after= to get what came since")
    missed: int = Field(
        description="requests after the given cursor no longer kept (the poller fell behind)"
    )
    requests: list[LiveRequest]
