"""Response models of the REST API: they document the JSON (with examples) in the OpenAPI spec.

Times are milliseconds as floats. Routes return plain dicts; these models validate and
describe them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

TRACE_ID_EXAMPLE = "4bf92f3577b34da6a3ce929d0e0e4736"
REQUEST_ID_EXAMPLE = TRACE_ID_EXAMPLE + "-00f067aa0ba902b7"


def _example(value: dict[str, Any]) -> ConfigDict:
    return ConfigDict(json_schema_extra={"examples": [value]})


def _means(**given: float) -> dict[str, float]:
    """Per-bucket figures for an example: ``given``, the other buckets a few ms."""
    small = {"network": 2.0, "queue": 3.0, "preprocess": 1.0, "prefill": 20.0, "decode": 5.0,
             "postprocess": 1.0, "other": 1.0}  # fmt: skip
    return small | given


class Answer(BaseModel):
    """The base of every answer and of every part of one.

    Closed: a key the model does not name is an error where the answer is built, not a silent
    extra (a renamed key fails there, and again in gRPC's strict ``ParseDict``). Every field is
    in every answer, null where ``| None`` says it can be; the OpenAPI document lists them all
    as ``required`` (a default only fills a key the domain leaves out, the JSON always has it).
    """

    model_config = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True)

    def json_dict(self) -> dict[str, Any]:
        """The answer as the REST API serves it (the CLI renders this, in both modes)."""
        return self.model_dump(mode="json")


class Buckets(Answer):
    """The seven buckets in ms, summing to ``e2e_ms``; ``network`` is null without a client span."""

    network: float | None
    queue: float | None
    preprocess: float | None
    prefill: float | None
    decode: float | None
    postprocess: float | None
    other: float | None


class Itl(Answer):
    p50: float | None
    p99: float | None
    max: float | None


ATTRIBUTION_EXAMPLE = {
    "trace_id": TRACE_ID_EXAMPLE,
    "request_id": REQUEST_ID_EXAMPLE,
    "service": "llm-server",
    "model": "llama-3-8b",
    "e2e_ms": 1000.0,
    "buckets_ms": {
        "network": 80.0,
        "queue": 100.0,
        "preprocess": 30.0,
        "prefill": 200.0,
        "decode": 520.0,
        "postprocess": 50.0,
        "other": 20.0,
    },
    "ttft_ms": 385.0,
    "ttft_server_ms": 345.0,
    "tpot_ms": 20.5,
    "itl_ms": {"p50": 19.8, "p99": 61.0, "max": 75.2},
    "stalls": 1,
    "input_tokens": 812,
    "output_tokens": 26,
    "clock_skew_ms": 0.0,
    "attempts": 1,
    "client_headers_only": False,
    "kv_transfer_ms": None,
    "gpu": {"prefill": {"utilization_mean": 93.0, "energy_mj": 41000.0}},
}


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


class SpanEvent(Answer):
    name: str
    at_ms: float


class Span(Answer):
    span_id: str
    parent_span_id: str
    name: str
    kind: str
    service: str
    phase: str | None
    request_id: str | None = Field(
        description="the call this span is the client (or lone server) span of"
    )
    start_ms: float = Field(
        description="offset from the request's start (a trace's: its root's), on the caller's clock"
    )
    duration_ms: float
    depth: int
    status: str
    attributes: dict[str, str]
    events: list[SpanEvent]


SPAN_EXAMPLE = {
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


class FigurePercentiles(Buckets):
    """A percentile rank (0-100) per bucket and figure; null where the request or its peers
    lack it."""

    e2e: float | None
    ttft: float | None
    tpot: float | None


STANDING_EXAMPLE = {
    "since": "2026-01-02T14:00:00Z",
    "until": "2026-01-02T15:00:00Z",
    "peers": 812,
    "percentiles": {"e2e": 97.4, "network": 40.2, "queue": 99.1, "preprocess": 55.0,
                    "prefill": 61.3, "decode": 48.0, "postprocess": 50.5, "other": 52.0,
                    "ttft": 98.8, "tpot": 47.1},
}  # fmt: skip


class Standing(Answer):
    """Where a request stands among its peers (the requests of its service and model that
    started in the hour before it): the share of them that were faster, per figure."""

    model_config = _example(STANDING_EXAMPLE)

    since: str
    until: str
    peers: int = Field(description="requests of the same service and model in the window")
    percentiles: FigurePercentiles = Field(
        description="the peers below the request's value plus half of those equal, in percent "
        "of the peers that have the figure: 99 means slower than 99 % of them"
    )


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


class PathBuckets(Answer):
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


class RunCall(Answer):
    request_id: str
    start_ms: float = Field(description="from the root's start")
    e2e_ms: float
    on_critical_path_ms: float = Field(description="how much of the call the root waited for")
    on_critical_path_buckets_ms: PathBuckets
    attribution: Attribution


class RunTool(Answer):
    span_id: str
    name: str
    tool: str = Field(description="gen_ai.tool.name")
    start_ms: float
    duration_ms: float
    on_critical_path_ms: float


class PathStep(Answer):
    """One piece of the critical path, in time order."""

    span_id: str
    name: str
    category: str = Field(description="llm, tool or app")
    bucket: str | None = Field(description="for llm steps: the bucket of the call's timeline")
    request_id: str | None
    start_ms: float
    end_ms: float


RUN_EXAMPLE = {
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


class Health(Answer):
    model_config = _example({"status": "ok"})

    status: str


# -- aggregates ----------------------------------------------------------------------------------


class Window(Answer):
    since: str
    until: str
    since_ns: int
    until_ns: int


WINDOW_EXAMPLE = {
    "since": "2026-01-02T14:00:00Z",
    "until": "2026-01-02T15:00:00Z",
    "since_ns": 1767362400000000000,
    "until_ns": 1767366000000000000,
}


class Percentiles(Answer):
    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None
    mean: float | None


class BucketStats(Answer):
    p50: float | None
    p95: float | None
    p99: float | None
    mean: float | None
    share: float | None = Field(description="the bucket's fraction of all time")


class StreamPercentiles(Answer):
    p50: float | None
    p95: float | None
    p99: float | None


class StreamStats(StreamPercentiles):
    mean: float | None


class Streaming(Answer):
    """Time to first token, time per output token and inter-token latency over the requests."""

    ttft_ms: StreamStats
    ttft_server_ms: StreamPercentiles
    tpot_ms: StreamStats
    itl_p50_ms: StreamPercentiles = Field(description="percentiles of the requests' ITL p50")
    itl_p99_ms: StreamPercentiles = Field(description="percentiles of the requests' ITL p99")
    itl_max_ms: float | None = Field(description="the longest gap between two tokens")
    stalls: int
    stalled_requests: int


_BUCKET_STATS_EXAMPLE = {
    "network": {"p50": 60.0, "p95": 95.0, "p99": 120.0, "mean": 64.0, "share": 0.06},
    "queue": {"p50": 80.0, "p95": 900.0, "p99": 2400.0, "mean": 210.0, "share": 0.2},
    "preprocess": {"p50": 25.0, "p95": 40.0, "p99": 55.0, "mean": 27.0, "share": 0.03},
    "prefill": {"p50": 180.0, "p95": 420.0, "p99": 610.0, "mean": 210.0, "share": 0.2},
    "decode": {"p50": 460.0, "p95": 900.0, "p99": 1300.0, "mean": 480.0, "share": 0.45},
    "postprocess": {"p50": 20.0, "p95": 35.0, "p99": 50.0, "mean": 22.0, "share": 0.02},
    "other": {"p50": 8.0, "p95": 20.0, "p99": 31.0, "mean": 10.0, "share": 0.01},
}
_E2E_EXAMPLE = {"p50": 940.0, "p90": 1800.0, "p95": 2300.0, "p99": 3900.0, "mean": 1063.0}
_STREAMING_EXAMPLE = {
    "ttft_ms": {"p50": 290.0, "p95": 700.0, "p99": 1100.0, "mean": 330.0},
    "ttft_server_ms": {"p50": 250.0, "p95": 660.0, "p99": 1050.0},
    "tpot_ms": {"p50": 21.0, "p95": 30.0, "p99": 44.0, "mean": 22.0},
    "itl_p50_ms": {"p50": 20.0, "p95": 24.0, "p99": 25.0},
    "itl_p99_ms": {"p50": 30.0, "p95": 41.0, "p99": 60.0},
    "itl_max_ms": 420.0,
    "stalls": 3,
    "stalled_requests": 2,
}


class SummaryGroup(Answer):
    key: str
    count: int
    with_client: int = Field(description="requests with a client span (network known)")
    e2e_ms: Percentiles
    buckets_ms: dict[str, BucketStats]
    streaming: Streaming


class Summary(Answer):
    """Percentiles of e2e and of each bucket over the window, and each bucket's share."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "count": 1200,
                    "with_client": 1100,
                    "e2e_ms": _E2E_EXAMPLE,
                    "buckets_ms": _BUCKET_STATS_EXAMPLE,
                    "streaming": _STREAMING_EXAMPLE,
                    "group_by": "model",
                    "groups": [
                        {
                            "key": "llama-3-8b",
                            "count": 700,
                            "with_client": 650,
                            "e2e_ms": _E2E_EXAMPLE,
                            "buckets_ms": _BUCKET_STATS_EXAMPLE,
                            "streaming": _STREAMING_EXAMPLE,
                        }
                    ],
                    "window": WINDOW_EXAMPLE,
                }
            ]
        },
    )

    count: int
    with_client: int = Field(description="requests with a client span (network known)")
    e2e_ms: Percentiles
    buckets_ms: dict[str, BucketStats]
    streaming: Streaming
    group_by: str | None
    groups: list[SummaryGroup]
    window: Window


class TailBucket(Answer):
    tail_mean: float | None
    median_mean: float | None
    extra: float | None
    extra_share: float | None


class Tail(Answer):
    """Where requests above the percentile spend their extra time, against the median."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "percentile": 99,
                    "count": 1200,
                    "threshold_ms": 3900.0,
                    "tail_count": 12,
                    "tail_e2e_ms": 4500.0,
                    "median_e2e_ms": 940.0,
                    "extra_e2e_ms": 3560.0,
                    "buckets_ms": {
                        "queue": {
                            "tail_mean": 2600.0,
                            "median_mean": 80.0,
                            "extra": 2520.0,
                            "extra_share": 0.71,
                        }
                    },
                    "dominant": "queue",
                    "window": WINDOW_EXAMPLE,
                }
            ]
        },
    )

    percentile: float
    count: int
    threshold_ms: float | None
    tail_count: int
    tail_e2e_ms: float | None
    median_e2e_ms: float | None
    extra_e2e_ms: float | None
    buckets_ms: dict[str, TailBucket]
    dominant: str | None
    window: Window


class Delta(Answer):
    before: float | None
    after: float | None
    delta: float | None


class CompareWindow(Answer):
    since: str
    until: str
    since_ns: int
    until_ns: int
    count: int


class Compare(Answer):
    """Two windows bucket by bucket: before, after and the change; the biggest mover named."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "before": {**WINDOW_EXAMPLE, "count": 1100},
                    "after": {**WINDOW_EXAMPLE, "count": 1200},
                    "e2e_ms": {"p50": {"before": 900.0, "after": 1300.0, "delta": 400.0}},
                    "buckets_ms": {
                        "prefill": {"p50": {"before": 180.0, "after": 560.0, "delta": 380.0}}
                    },
                    "mover": "prefill",
                    "mover_delta_ms": 370.0,
                    "p99_mover": "prefill",
                }
            ]
        },
    )

    before: CompareWindow
    after: CompareWindow
    e2e_ms: dict[str, Delta]
    buckets_ms: dict[str, dict[str, Delta]]
    mover: str | None
    mover_delta_ms: float | None
    p99_mover: str | None


class VerdictWhere(Answer):
    """The dimension value most over-represented among the requests with the most time in the
    verdict's bucket."""

    dimension: str
    value: str
    selection: str = Field(description="the requests it was found among")
    in_share: float
    out_share: float
    extra_ms: float | None
    since_ns: int | None = Field(description="when those requests began")


class Verdict(Answer):
    id: str
    cause: str
    bucket: str
    fixes: list[str]
    score: float | None
    evidence: dict[str, Any] = Field(description="the numbers behind the verdict, by name")
    where: VerdictWhere | None = Field(
        description="the dimension value that concentrates the problem, and since when"
    )


class Diagnosis(Answer):
    """The dominant bucket, the usual cause and first fix, with the numbers behind each."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "count": 1200,
                    "dominant": "decode",
                    "tail_dominant": "queue",
                    "verdicts": [
                        {
                            "id": "queue_tail",
                            "bucket": "queue",
                            "cause": "load exceeds capacity: the slowest requests wait for a "
                            "worker or batch slot",
                            "fixes": ["cap the queue depth and shed or reject early"],
                            "score": 0.71,
                            "evidence": {"queue_extra_ms": 2520.0, "queue_extra_share": 0.71},
                            "where": {
                                "dimension": "resource.k8s.pod.name",
                                "value": "llm-7",
                                "selection": "queue at or above p95 (900.0 ms)",
                                "in_share": 0.81,
                                "out_share": 0.1,
                                "extra_ms": 2300.0,
                                "since_ns": 1767363900000000000,
                            },
                        }
                    ],
                    "window": WINDOW_EXAMPLE,
                }
            ]
        },
    )

    count: int
    dominant: str | None
    tail_dominant: str | None
    shares: dict[str, float] | None = Field(
        default=None,
        description="each bucket's fraction of all time in the window; null without requests",
    )
    verdicts: list[Verdict]
    window: Window


class ObjectiveStatus(Answer):
    name: str
    metric: str
    threshold_ms: float
    target: float
    window_days: float
    total: int
    bad: int
    compliance: float | None
    met: bool | None
    error_budget: float
    budget_left: float | None
    burn_rates: dict[str, float | None]
    alerts: dict[str, bool]
    budget_by_bucket: dict[str, BudgetSplit] | None = Field(
        None,
        description="per window (the objective's, then each burn rate's): where the budget went",
    )


class Slo(Answer):
    """Per objective: compliance, error budget left, burn rates and the fast/slow-burn alerts."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "at": "2026-01-02T15:00:00Z",
                    "now_ns": 1767366000000000000,
                    "objectives": [
                        {
                            "name": "ttft p99 < 500 ms",
                            "metric": "ttft",
                            "threshold_ms": 500,
                            "target": 0.99,
                            "window_days": 30,
                            "total": 120000,
                            "bad": 600,
                            "compliance": 0.995,
                            "met": True,
                            "error_budget": 0.01,
                            "budget_left": 0.5,
                            "burn_rates": {"5m": 0.4, "30m": 0.6, "1h": 0.5, "6h": 0.5, "3d": 0.5},
                            "alerts": {"fast_burn": False, "slow_burn": False, "ticket": False},
                        }
                    ],
                }
            ]
        },
    )

    at: str
    now_ns: int
    objectives: list[ObjectiveStatus]


class GpuFigure(Answer):
    mean: float | None
    max: float | None
    total: float | None
    n: int


class Gpu(Answer):
    """GPU figures per phase: utilization (%), memory (bytes), power (W), energy (mJ)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "phases": {
                        "prefill": {
                            "utilization_mean": {
                                "mean": 91.0,
                                "max": 99.0,
                                "total": 9100.0,
                                "n": 100,
                            }
                        }
                    },
                    "window": WINDOW_EXAMPLE,
                }
            ]
        },
    )

    phases: dict[str, dict[str, GpuFigure]]
    window: Window


class ModelCount(Answer):
    model: str
    count: int


class ServiceSeen(Answer):
    service: str
    count: int
    last_ns: int
    models: list[ModelCount]


class Services(Answer):
    """Services seen in the window, with their models and request counts."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "window": WINDOW_EXAMPLE,
                    "services": [
                        {
                            "service": "llm-server",
                            "count": 1200,
                            "last_ns": 1767365990000000000,
                            "models": [{"model": "llama-3-8b", "count": 1200}],
                        }
                    ],
                }
            ]
        },
    )

    window: Window
    services: list[ServiceSeen]


class SlowRequest(Answer):
    trace_id: str
    request_id: str = Field(description="the call's id (``latscope explain`` takes it)")
    start_ns: int
    service: str
    model: str
    e2e_ms: float | None
    buckets_ms: Buckets
    ttft_ms: float | None
    tpot_ms: float | None
    route: str
    status: str
    input_tokens: int | None
    output_tokens: int | None
    stalls: int
    attempts: int


class Slowest(Answer):
    """The slowest requests of the window, slowest first, each with its buckets."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "window": WINDOW_EXAMPLE,
                    "requests": [
                        {
                            "trace_id": TRACE_ID_EXAMPLE,
                            "request_id": TRACE_ID_EXAMPLE + "-00f067aa0ba902b7",
                            "start_ns": 1767365000000000000,
                            "service": "llm-server",
                            "model": "llama-3-8b",
                            "route": "/v1/chat/completions",
                            "status": "Ok",
                            "e2e_ms": 4500.0,
                            "buckets_ms": ATTRIBUTION_EXAMPLE["buckets_ms"],
                            "ttft_ms": 2900.0,
                            "tpot_ms": 21.0,
                            "input_tokens": 812,
                            "output_tokens": 70,
                            "stalls": 0,
                            "attempts": 1,
                        }
                    ],
                }
            ]
        },
    )

    window: Window
    requests: list[SlowRequest]


# -- over time, the heatmap, what is different, cold starts ---------------------------------------


class StepPercentiles(Answer):
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    mean: float | None = None


class StepBucket(Answer):
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    mean: float | None = None
    share: float | None = Field(None, description="the bucket's fraction of the step's e2e time")


class StepPoint(Answer):
    start_ns: int
    end_ns: int
    count: int
    e2e_ms: StepPercentiles
    buckets_ms: dict[str, StepBucket]
    ttft_ms: StepPercentiles
    tpot_ms: StepPercentiles


class Series(Answer):
    key: str = Field(description='the group ("" for the whole window)')
    count: int
    points: list[StepPoint]


class ReadSource(Answer):
    rollup_hours: int = Field(description="hours read from the hourly rollup")
    raw_ranges: int = Field(description="time ranges read from the attribution table")
    raw_final_ranges: int = Field(description="of those, ranges read with FINAL")


_POINT_EXAMPLE = {
    "start_ns": 1767362400000000000,
    "end_ns": 1767362430000000000,
    "count": 40,
    "e2e_ms": {"p50": 940.0, "p90": 1800.0, "p95": 2300.0, "p99": 3900.0, "mean": 1063.0},
    "buckets_ms": {
        b: {k: v[k] for k in ("p50", "p95", "p99", "mean", "share")}
        for b, v in _BUCKET_STATS_EXAMPLE.items()
    },
    "ttft_ms": {"p50": 290.0, "p95": 700.0, "p99": 1100.0, "mean": 330.0},
    "tpot_ms": {"p50": 21.0, "p95": 30.0, "p99": 44.0, "mean": 22.0},
}


class Timeseries(Answer):
    """Every figure of the summary per time step, for the window and per group."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "window": WINDOW_EXAMPLE,
                    "step_s": 30,
                    "group_by": None,
                    "series": [{"key": "", "count": 40, "points": [_POINT_EXAMPLE]}],
                    "source": {"rollup_hours": 0, "raw_ranges": 1, "raw_final_ranges": 1},
                }
            ]
        },
    )

    window: Window
    step_s: int
    group_by: str | None
    series: list[Series]
    source: ReadSource


class HeatBin(Answer):
    row: int
    lo_ms: float
    hi_ms: float


class Heatmap(Answer):
    """Requests per time step (columns) and log-scaled latency bin (rows)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "window": WINDOW_EXAMPLE,
                    "metric": "e2e",
                    "step_s": 30,
                    "bins_per_decade": 10,
                    "times_ns": [1767362400000000000, 1767362430000000000],
                    "bins": [
                        {"row": 89, "lo_ms": 794.3, "hi_ms": 1000.0},
                        {"row": 90, "lo_ms": 1000.0, "hi_ms": 1258.9},
                    ],
                    "counts": [[12, 3], [10, 7]],
                    "zero_counts": [0, 0],
                    "count": 32,
                    "max_count": 12,
                    "source": {"rollup_hours": 0, "raw_ranges": 1, "raw_final_ranges": 1},
                }
            ]
        },
    )

    window: Window
    metric: str
    step_s: int
    bins_per_decade: int
    times_ns: list[int]
    bins: list[HeatBin]
    counts: list[list[int]] = Field(description="counts[step][bin]")
    zero_counts: list[int] = Field(description="per step, requests whose value is 0")
    count: int
    max_count: int
    source: ReadSource


class BucketMeans(Answer):
    network: float | None
    queue: float | None
    preprocess: float | None
    prefill: float | None
    decode: float | None
    postprocess: float | None
    other: float | None


class WhySide(Answer):
    count: int
    e2e_mean_ms: float | None
    buckets_ms: BucketMeans


class WhySelection(WhySide):
    kind: str
    metric: str
    description: str
    threshold_ms: float | None


class WhyBaseline(WhySide):
    description: str


class WhyValue(Answer):
    value: str
    in_count: int
    out_count: int
    in_share: float = Field(description="the value's share of the selection")
    out_share: float = Field(description="its share of the baseline")
    difference: float = Field(description="in_share - out_share")
    in_e2e_mean_ms: float | None
    out_e2e_mean_ms: float | None
    extra_ms: float | None = Field(
        description="mean e2e of the selection's requests with this value minus the baseline's"
    )
    buckets_ms: BucketMeans = Field(description="extra_ms split by bucket (they add up)")
    dominant: str | None
    extra_share: float | None = Field(
        description="the share of the selection's extra time these requests carry"
    )


class WhyDimension(Answer):
    dimension: str
    score: float = Field(description="the largest difference of one value (BubbleUp's order)")
    values_seen: int
    values: list[WhyValue]


class WhyTop(Answer):
    dimension: str
    value: str
    score: float
    in_share: float
    out_share: float
    extra_ms: float | None
    dominant: str | None
    since_ns: int | None = Field(description="when the selected requests with it began")


class WhyExample(Answer):
    trace_id: str
    start_ns: int
    service: str
    model: str
    e2e_ms: float | None


_WHY_VALUE_EXAMPLE = {
    "value": "llm-7",
    "in_count": 11,
    "out_count": 140,
    "in_share": 0.92,
    "out_share": 0.12,
    "difference": 0.8,
    "in_e2e_mean_ms": 4410.0,
    "out_e2e_mean_ms": 1020.0,
    "extra_ms": 3410.0,
    "buckets_ms": {"network": 2.0, "queue": 3380.0, "preprocess": 1.0, "prefill": 20.0,
                   "decode": 5.0, "postprocess": 1.0, "other": 1.0},
    "dominant": "queue",
    "extra_share": 0.93,
}  # fmt: skip


class Why(Answer):
    """What is different about the selected requests: dimensions ranked, extra time by bucket."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "window": WINDOW_EXAMPLE,
                    "selection": {
                        "kind": "percentile",
                        "metric": "e2e",
                        "description": "e2e at or above p99 (3900.0 ms)",
                        "threshold_ms": 3900.0,
                        "count": 12,
                        "e2e_mean_ms": 4500.0,
                        "buckets_ms": _means(queue=3400.0, decode=1000.0),
                    },
                    "baseline": {
                        "description": "the window's other requests (below 3900.0 ms)",
                        "count": 1188,
                        "e2e_mean_ms": 1030.0,
                        "buckets_ms": _means(queue=80.0, decode=900.0),
                    },
                    "extra_e2e_ms": 3470.0,
                    "extra_buckets_ms": _means(queue=3320.0, prefill=120.0, decode=14.0),
                    "dominant": "queue",
                    "dimensions": [
                        {
                            "dimension": "resource.k8s.pod.name",
                            "score": 0.8,
                            "values_seen": 8,
                            "values": [_WHY_VALUE_EXAMPLE],
                        }
                    ],
                    "top": {
                        "dimension": "resource.k8s.pod.name",
                        "value": "llm-7",
                        "score": 0.8,
                        "in_share": 0.92,
                        "out_share": 0.12,
                        "extra_ms": 3410.0,
                        "dominant": "queue",
                        "since_ns": 1767363900000000000,
                    },
                    "examples": [
                        {
                            "trace_id": TRACE_ID_EXAMPLE,
                            "start_ns": 1767365000000000000,
                            "service": "llm-server",
                            "model": "llama-3-8b",
                            "e2e_ms": 5210.0,
                        }
                    ],
                }
            ]
        },
    )

    window: Window
    selection: WhySelection
    baseline: WhyBaseline
    extra_e2e_ms: float | None = Field(description="selection's mean e2e minus the baseline's")
    extra_buckets_ms: BucketMeans = Field(description="extra_e2e_ms by bucket (they add up)")
    dominant: str | None
    dimensions: list[WhyDimension]
    top: WhyTop | None
    examples: list[WhyExample] = Field(description="the slowest selected requests")


class WarmupRuleModel(Answer):
    warmup_requests: int
    warmup_s: float
    lookback_s: float
    replica_keys: list[str]


class Replica(Answer):
    service: str
    replica: str
    first_seen_ns: int
    appeared: bool = Field(description="first seen after the lookback began (a new replica)")
    warm_from_ns: int | None = Field(description="its first request after the warm-up")
    requests: int = Field(description="its requests in the window")
    warmup_requests: int
    warmup_e2e_mean_ms: float | None
    warm_e2e_mean_ms: float | None


class ScaleUp(Answer):
    at_ns: int
    replicas: list[str]
    count: int
    warm_by_ns: int = Field(description="when the last of them finished warming up")
    warmup_s: float = Field(description="from the first appearing to the last warm")


class ColdStart(Answer):
    """Replicas that appeared, their warm-up requests, warm-up against warm by bucket."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "window": WINDOW_EXAMPLE,
                    "rule": {
                        "warmup_requests": 10,
                        "warmup_s": 60.0,
                        "lookback_s": 3600.0,
                        "replica_keys": ["service.instance.id", "k8s.pod.name", "host.name"],
                    },
                    "replicas": [
                        {
                            "service": "llm-server",
                            "replica": "llm-7",
                            "first_seen_ns": 1767363900000000000,
                            "appeared": True,
                            "warm_from_ns": 1767363960000000000,
                            "requests": 410,
                            "warmup_requests": 23,
                            "warmup_e2e_mean_ms": 2400.0,
                            "warm_e2e_mean_ms": 950.0,
                        }
                    ],
                    "replica_count": 4,
                    "appeared": 1,
                    "warmup": {
                        "count": 23,
                        "e2e_mean_ms": 2400.0,
                        "buckets_ms": _means(prefill=1600.0, decode=770.0),
                    },
                    "warm": {
                        "count": 1800,
                        "e2e_mean_ms": 950.0,
                        "buckets_ms": _means(prefill=210.0, decode=707.0),
                    },
                    "unidentified": 0,
                    "extra_e2e_ms": 1450.0,
                    "extra_buckets_ms": _means(prefill=1390.0, decode=60.0),
                    "dominant": "prefill",
                    "scale_ups": [
                        {
                            "at_ns": 1767363900000000000,
                            "replicas": ["llm-server/llm-7"],
                            "count": 1,
                            "warm_by_ns": 1767363960000000000,
                            "warmup_s": 60.0,
                        }
                    ],
                }
            ]
        },
    )

    window: Window
    rule: WarmupRuleModel
    replicas: list[Replica]
    replica_count: int
    appeared: int = Field(description="replicas that appeared in the window")
    warmup: WhySide
    warm: WhySide
    unidentified: int = Field(description="requests without a replica attribute")
    extra_e2e_ms: float | None
    extra_buckets_ms: BucketMeans
    dominant: str | None
    scale_ups: list[ScaleUp]


class BudgetSplit(Answer):
    bad: int = Field(description="requests that missed the objective")
    good: int
    extra_e2e_ms: float | None = Field(description="bad requests' mean e2e minus the good ones'")
    extra_buckets_ms: BucketMeans
    dominant: str | None


# ObjectiveStatus names BudgetSplit, defined with the newer answers above.
ObjectiveStatus.model_rebuild()
Slo.model_rebuild()


class SetAsideTrace(Answer):
    """A trace the attributor failed on alone: set aside, the others attributed without it."""

    trace_id: str
    error: str = Field(description="why ClickHouse refused the statement for it")
    attempts: int = Field(description="how many passes failed on it")
    retry_in_s: float = Field(description="seconds until it is tried again (0: at the next pass)")


class SetAsideTraces(Answer):
    """The traces the attributor of this process has set aside (``latscope_attribution_set_aside
    _traces``), each retried with a backoff that doubles up to an hour."""

    model_config = _example(
        {
            "traces": [
                {
                    "trace_id": TRACE_ID_EXAMPLE,
                    "error": "Code: 70. DB::Exception: Value in column Float64 cannot be safely "
                    "converted into type Int64 (CANNOT_CONVERT_TYPE)",
                    "attempts": 3,
                    "retry_in_s": 38.5,
                }
            ]
        }
    )

    traces: list[SetAsideTrace]


# -- conversations across traces ------------------------------------------------------------------

CONVERSATION_ID_EXAMPLE = "conv-5f1d7a"


class ConversationTurn(Answer):
    """One turn: a trace of the conversation, explained as a run."""

    trace_id: str
    start: str = Field(description="the root span's start, RFC 3339")
    offset_ms: float = Field(description="from the first turn's start")
    gap_ms: float | None = Field(
        description="since the previous turn ended (negative: they overlap); null for the first"
    )
    e2e_ms: float = Field(description="the root span's duration")
    root: RunRoot
    critical_path_ms: RunBudget
    calls: int = Field(description="inference calls in the turn")
    tools: int = Field(description="tool calls in the turn")
    path: list[PathStep] = Field(description="the turn's critical path, ms from its root's start")


class ConversationTool(Answer):
    tool: str = Field(description="gen_ai.tool.name (the span name when it has none)")
    calls: int
    on_critical_path_ms: float


CONVERSATION_EXAMPLE = {
    "conversation_id": CONVERSATION_ID_EXAMPLE,
    "turn_count": 2,
    "truncated": False,
    "start": "2026-01-02T15:00:00Z",
    "end": "2026-01-02T15:01:03.6Z",
    "duration_ms": 63600.0,
    "busy_ms": 3600.0,
    "critical_path_ms": {
        "llm": 2000.0,
        "llm_buckets": _means(prefill=400.0, decode=1560.0),
        "tool": 1300.0,
        "app": 300.0,
    },
    "tools": [{"tool": "search", "calls": 2, "on_critical_path_ms": 1300.0}],
    "turns": [{
        "trace_id": TRACE_ID_EXAMPLE,
        "start": "2026-01-02T15:00:00Z",
        "offset_ms": 0.0,
        "gap_ms": None,
        "e2e_ms": 1800.0,
        "root": RUN_EXAMPLE["root"],
        "critical_path_ms": RUN_EXAMPLE["critical_path_ms"],
        "calls": 1,
        "tools": 1,
        "path": RUN_EXAMPLE["path"],
    }],
}  # fmt: skip


class Conversation(Answer):
    """A conversation across traces (``gen_ai.conversation.id``, OpenInference's ``session.id``
    or traceloop's session id): its turns in order, each turn's critical path, and the time of
    the turns shown by bucket, tool and app (summed over their critical paths)."""

    model_config = _example(CONVERSATION_EXAMPLE)

    conversation_id: str
    turn_count: int = Field(description="traces of the conversation")
    truncated: bool = Field(description="only the latest turns are shown (limit_turns)")
    start: str = Field(description="the first shown turn's start, RFC 3339")
    end: str = Field(description="the last shown turn's end, RFC 3339")
    duration_ms: float = Field(description="from the first shown turn's start to the last's end")
    busy_ms: float = Field(description="the shown turns' e2e, added up")
    critical_path_ms: RunBudget = Field(
        description="the shown turns' critical paths added up: LLM buckets, tools, app"
    )
    tools: list[ConversationTool] = Field(description="per tool, most time on the path first")
    turns: list[ConversationTurn]


class ConversationSeen(Answer):
    conversation_id: str
    traces: int = Field(description="traces with spans of the conversation in the window")
    first: str
    last: str
    services: list[str]


class Conversations(Answer):
    """The conversations with spans in the window, the latest first."""

    model_config = _example(
        {
            "window": WINDOW_EXAMPLE,
            "conversations": [
                {
                    "conversation_id": CONVERSATION_ID_EXAMPLE,
                    "traces": 2,
                    "first": "2026-01-02T15:00:00Z",
                    "last": "2026-01-02T15:01:03.6Z",
                    "services": ["agent", "llm-server"],
                }
            ],
        }
    )

    window: Window
    conversations: list[ConversationSeen]


# -- the heatmap as a table (the MCP server's heatmap tool) ---------------------------------------


class HeatmapRow(Answer):
    start_ns: int = Field(description="the time step's start, ns since the epoch")
    counts: list[int] = Field(description="requests per column")
    total: int


class HeatmapTable(Answer):
    """A heatmap as a compact table: a row per time step with requests, a column per latency
    bin with requests (``0 ms`` first when some requests took none), counts in the cells."""

    model_config = _example(
        {
            "window": WINDOW_EXAMPLE,
            "metric": "e2e",
            "step_s": 300,
            "count": 32,
            "columns": ["794.3-1000 ms", "1000-1259 ms"],
            "rows": [{"start_ns": 1767362400000000000, "counts": [12, 10], "total": 22},
                     {"start_ns": 1767362700000000000, "counts": [3, 7], "total": 10}],
        }
    )  # fmt: skip

    window: Window
    metric: str
    step_s: int
    count: int
    columns: list[str]
    rows: list[HeatmapRow]

    def as_text(self) -> str:
        """The table in fixed-width text: the time (UTC) and a count per column."""
        from datetime import UTC, datetime

        head = ["time (UTC)", *self.columns, "total"]
        lines = [head]
        for row in self.rows:
            at = datetime.fromtimestamp(row.start_ns / 1e9, UTC).strftime("%m-%d %H:%M:%S")
            lines.append([at, *(str(c) for c in row.counts), str(row.total)])
        widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
        text = [
            f"{self.metric} heatmap, {self.count} requests, steps of {self.step_s} s "
            f"({self.window.since} → {self.window.until})"
        ]
        text += ["  ".join(cell.rjust(w) for cell, w in zip(line, widths, strict=True))
                 for line in lines]  # fmt: skip
        return "\n".join(text)
