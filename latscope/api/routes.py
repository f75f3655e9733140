"""The ``/v1`` routes. Each route validates its parameters, then calls the function that
answers the question (``latscope.api.trace`` for one request, ``latscope.api.queries`` for many)
and serves the answer's model; those functions are shared with the gRPC service and the CLI's
direct mode."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from fastapi.responses import Response

from latscope.api import conversations as talks
from latscope.api import live as live_feed
from latscope.api import queries as aggregates
from latscope.api import trace
from latscope.api.errors import InvalidParameter, error_responses
from latscope.api.schemas import (
    REQUEST_ID_EXAMPLE,
    TRACE_ID_EXAMPLE,
    Answer,
    Attribution,
    ColdStart,
    Compare,
    Conversation,
    Conversations,
    Diagnosis,
    Explain,
    Gpu,
    Heatmap,
    Live,
    RequestTokens,
    Run,
    Services,
    Slo,
    Slowest,
    Summary,
    Tail,
    Timeseries,
    TraceExplain,
    TraceRequests,
    TraceSpans,
    Why,
)
from latscope.api.timerange import TIME_PATTERN
from latscope.config import Settings
from latscope.storage import Store

# The patterns are published in the OpenAPI document (json_schema_extra) and checked by the
# server itself, which answers a mismatch with its own 400 and error code.
# The trace and request id patterns live in latscope.api.trace, next to their parser.
OBJECTIVE_PATTERN = r"^\s*(e2e|ttft|tpot):[0-9]+(\.[0-9]+)?:0?\.[0-9]+(:[0-9]+(\.[0-9]+)?)?\s*$"

TraceId = Annotated[
    str,
    Path(
        description="32 hexadecimal characters (W3C trace id)",
        examples=[TRACE_ID_EXAMPLE],
        max_length=64,
        json_schema_extra={"pattern": trace.TRACE_ID_PATTERN},
    ),
]
# The patterns are documented, and checked by the answering function with a 400 that says what
# to write (a framework 422 would say only that the pattern failed).
RequestId = Annotated[
    str,
    Path(
        description="a request id: the trace id (32 hexadecimal characters), '-', and the "
        "call's client span id (16 hexadecimal characters; its server span's when no client "
        "span was seen), as every answer's request_id gives it; or a bare trace id when the "
        "trace holds one call (409 several_requests when it holds several)",
        examples=[REQUEST_ID_EXAMPLE, TRACE_ID_EXAMPLE],
        max_length=64,
        json_schema_extra={"pattern": trace.REQUEST_ID_PATTERN},
    ),
]
StallMs = Annotated[
    float | None,
    Query(
        description="a gap between tokens longer than this (ms) is a stall; "
        "default: the server's --stall-threshold-ms",
        gt=0,
        le=3_600_000,
        examples=[100.0],
    ),
]

_TIME_HELP = "RFC 3339 (2026-01-02T15:04:05Z) or a span before now (15m, 2h, 7d)"


def _time(description: str, example: str) -> Any:
    return Query(
        description=f"{description}: {_TIME_HELP}",
        max_length=64,
        examples=[example],
        json_schema_extra={"pattern": TIME_PATTERN},
    )


Since = Annotated[str | None, _time("start of the window (default: 1 hour before until)", "2h")]
Until = Annotated[str | None, _time("end of the window (default: now)", "5m")]
Service = Annotated[
    str | None,
    Query(description="only this service (service.name)", max_length=256, examples=["llm-server"]),
]
Model = Annotated[
    str | None,
    Query(description="only this model (gen_ai.request.model)", max_length=256,
          examples=["llama-3-8b"]),
]  # fmt: skip
Exact = Annotated[
    bool,
    Query(
        description="exact percentiles (interpolated order statistics); by default they come "
        "from compact histograms, within 0.5 %, much faster over millions of requests",
        examples=[False],
    ),
]
Percentile = Annotated[
    float,
    Query(description="the tail starts at this percentile of e2e", gt=0, lt=100, examples=[99]),
]

Step = Annotated[
    str | None,
    Query(
        description="time step: 30s, 5m, 1h, 1d (default: from the window, about 120 points; "
        "whole hours from a day on, read from the hourly rollup)",
        max_length=16,
        pattern=r"^\s*\d{1,7}\s*[smhd]\s*$",
        examples=["5m"],
    ),
]
Metric = Annotated[
    str,
    Query(
        description="e2e, a bucket (network, queue, preprocess, prefill, decode, postprocess, "
        "other), ttft or tpot",
        pattern="^(e2e|network|queue|preprocess|prefill|decode|postprocess|other|ttft|tpot)$",
        examples=["e2e"],
    ),
]
_KEYS_PATTERN = r"^[A-Za-z0-9_.\-/]{1,128}$"


def _served(answer: Answer) -> Response:
    """The answer's JSON. The answering function built and checked the model; ``response_model``
    documents it (returning the model itself would have FastAPI validate it a second time).
    Written by pydantic's serializer straight to bytes: a wide trace's answer is tens of
    thousands of rows, and a dict of them dumped again by ``json`` costs as much once more."""
    return Response(answer.model_dump_json(), media_type="application/json")


_ONE = error_responses(400, 401, 404, 422, 503)
_REQUEST = error_responses(400, 401, 404, 409, 422, 503)
_MANY = error_responses(400, 401, 422, 503)
#: Parquet's media type (registered with IANA in 2024).
PARQUET = "application/vnd.apache.parquet"


def v1_router(store: Store, settings: Settings) -> APIRouter:
    """Every ``/v1`` route over ``store`` (the caller adds the token check)."""
    router = APIRouter(prefix="/v1")
    stall = settings.stall_threshold_ms
    cap = settings.max_trace_spans

    @router.get(
        "/requests/{request_id}/attribution",
        tags=["requests"],
        response_model=Attribution,
        responses=_REQUEST,
    )
    def request_attribution(request_id: RequestId) -> Response:
        """Where one request's end-to-end time went, bucket by bucket (milliseconds).

        A request is one inference call. Name it by its request id, or by its trace id when the
        trace holds one call (409 ``several_requests`` when it holds several: the answer lists
        their ids; ``/v1/traces/{trace_id}/requests`` gives them all with their buckets)."""
        return _served(
            trace.request_attribution(store, request_id, stall_threshold_ms=stall, max_spans=cap)
        )

    @router.get(
        "/requests/{request_id}", tags=["requests"], response_model=Explain, responses=_REQUEST
    )
    def request_explain(request_id: RequestId, stall_ms: StallMs = None) -> Response:
        """One request at once: its buckets, its trace's spans as a waterfall (on this
        request's clock, from its start) and its token timeline. Named as for
        ``/attribution``."""
        return _served(
            trace.explain(store, request_id, stall_ms, stall_threshold_ms=stall, max_spans=cap)
        )

    @router.get(
        "/requests/{request_id}/tokens",
        tags=["requests"],
        response_model=RequestTokens,
        responses=_REQUEST,
    )
    def request_tokens(request_id: RequestId, stall_ms: StallMs = None) -> Response:
        """When each token reached the client's clock, and the inter-token stalls. Named as
        for ``/attribution``."""
        return _served(
            trace.token_timeline(
                store, request_id, stall_ms, stall_threshold_ms=stall, max_spans=cap
            )
        )

    @router.get(
        "/traces/{trace_id}/spans", tags=["traces"], response_model=TraceSpans, responses=_ONE
    )
    def trace_spans(trace_id: TraceId) -> Response:
        """Every span of a trace, server spans moved onto the client's clock, depth-first: each
        span's children under it, siblings by start (as a waterfall lists them)."""
        return _served(trace.trace_spans(store, trace_id, max_spans=cap))

    @router.get(
        "/traces/{trace_id}/requests",
        tags=["traces"],
        response_model=TraceRequests,
        responses=_ONE,
    )
    def trace_requests(trace_id: TraceId) -> Response:
        """Every inference call of a trace (an agent run, a RAG pipeline, a gateway fan-out),
        by start, each with its buckets; an empty list when the trace holds none."""
        return _served(
            trace.trace_requests(store, trace_id, stall_threshold_ms=stall, max_spans=cap)
        )

    @router.get("/traces/{trace_id}/run", tags=["traces"], response_model=Run, responses=_ONE)
    def trace_run(trace_id: TraceId) -> Response:
        """The trace as one run: the root's end-to-end time and, along its critical path (the
        chain of work the root waited on), the time in LLM calls by bucket, in tool calls and in
        the app's own code; these add up to the root's duration. Parallel calls count once."""
        return _served(trace.trace_run(store, trace_id, stall_threshold_ms=stall, max_spans=cap))

    @router.get("/traces/{trace_id}", tags=["traces"], response_model=TraceExplain, responses=_ONE)
    def trace_explain(trace_id: TraceId) -> Response:
        """A trace at once: its run (as ``/run``) and its spans as a waterfall from the root's
        start, each call's client span marked with its request id."""
        return _served(
            trace.trace_explain(store, trace_id, stall_threshold_ms=stall, max_spans=cap)
        )

    @router.get("/live", tags=["requests"], response_model=Live, responses=_MANY)
    def live(
        after: Annotated[
            int | None,
            Query(
                description="the cursor of the previous answer: requests attributed since; "
                "without it, none, and the cursor to start from",
                ge=0,
                examples=[1200],
            ),
        ] = None,
        epoch: Annotated[
            str | None,
            Query(
                description="the epoch of the previous answer; another epoch (the server "
                "restarted) starts over from the oldest request kept",
                max_length=64,
            ),
        ] = None,
        service: Service = None,
        model: Model = None,
        min_e2e_ms: Annotated[
            float, Query(description="only requests at least this slow (ms)", ge=0, le=1e9)
        ] = 0.0,
        limit: Annotated[
            int, Query(description="at most this many, oldest first", ge=1, le=live_feed.MAX_LIVE)
        ] = 500,
    ) -> Response:
        """Requests as they are attributed, for polling (what ``latscope top --url`` shows):
        pass back ``cursor`` and ``epoch`` as ``after`` and ``epoch``. The gRPC Watch stream
        on the OTLP/gRPC port gives the same rows pushed."""
        return _served(
            live_feed.since(
                after=after,
                epoch=epoch,
                service=service or "",
                model=model or "",
                min_e2e_ms=min_e2e_ms,
                limit=limit,
            )
        )

    @router.get(
        "/attribution/summary", tags=["aggregates"], response_model=Summary, responses=_MANY
    )
    def summary(
        since: Since = None,
        until: Until = None,
        service: Service = None,
        model: Model = None,
        group_by: Annotated[
            str | None,
            Query(
                description="also per group: service, model, route, operation, status or "
                "resource.<attribute> (e.g. resource.k8s.pod.name)",
                max_length=160,
                examples=["model"],
            ),
        ] = None,
        limit_groups: Annotated[
            int, Query(description="at most this many groups, largest first", ge=1, le=500)
        ] = 100,
        exact: Exact = False,
    ) -> Response:
        """Count, percentiles of e2e and of each bucket, and each bucket's share of the time."""
        return _served(
            aggregates.summary(
                store,
                since=since,
                until=until,
                service=service,
                model=model,
                group_by=group_by,
                limit_groups=limit_groups,
                exact=exact,
            )
        )

    @router.get("/attribution/tail", tags=["aggregates"], response_model=Tail, responses=_MANY)
    def tail(
        since: Since = None,
        until: Until = None,
        service: Service = None,
        model: Model = None,
        percentile: Percentile = 99,
        exact: Exact = False,
    ) -> Response:
        """Which bucket the slowest requests spend their extra time in, against the median."""
        return _served(
            aggregates.tail(
                store,
                since=since,
                until=until,
                service=service,
                model=model,
                percentile=percentile,
                exact=exact,
            )
        )

    @router.get(
        "/attribution/compare", tags=["aggregates"], response_model=Compare, responses=_MANY
    )
    def compare(
        after_since: Annotated[
            str | None, _time("start of the window under study (default 1h)", "1h")
        ] = None,
        after_until: Annotated[
            str | None, _time("end of the window under study (default now)", "5m")
        ] = None,
        before_since: Annotated[
            str | None,
            _time("start of the baseline (default: the same length just before)", "25h"),
        ] = None,
        before_until: Annotated[str | None, _time("end of the baseline", "24h")] = None,
        service: Service = None,
        model: Model = None,
        exact: Exact = False,
    ) -> Response:
        """Two windows (e.g. before and after a deploy) bucket by bucket; the biggest mover."""
        return _served(
            aggregates.compare(
                store,
                before_since=before_since,
                before_until=before_until,
                after_since=after_since,
                after_until=after_until,
                service=service,
                model=model,
                exact=exact,
            )
        )

    @router.get(
        "/attribution/diagnose", tags=["aggregates"], response_model=Diagnosis, responses=_MANY
    )
    def diagnose(
        since: Since = None,
        until: Until = None,
        service: Service = None,
        model: Model = None,
        percentile: Percentile = 99,
    ) -> Response:
        """The dominant bucket, the usual cause and first fixes, with the numbers behind each."""
        return _served(
            aggregates.diagnose(
                store,
                since=since,
                until=until,
                service=service,
                model=model,
                percentile=percentile,
                warmup_requests=settings.warmup_requests,
                warmup_s=settings.warmup_s,
            )
        )

    @router.get("/slo", tags=["aggregates"], response_model=Slo, responses=_MANY)
    def slo(
        objective: Annotated[
            list[str] | None,
            Query(
                description="METRIC:THRESHOLD_MS:TARGET[:WINDOW_DAYS], metric e2e, ttft or "
                "tpot; repeat for several (default: "
                + ", ".join(aggregates.DEFAULT_OBJECTIVES)
                + ")",
                max_length=20,
                examples=[["ttft:500:0.99:30"]],
                json_schema_extra={"items": {"type": "string", "pattern": OBJECTIVE_PATTERN}},
            ),
        ] = None,
        at: Annotated[
            str | None, _time("evaluate as of (default now)", "2026-01-02T15:00:00Z")
        ] = None,
        service: Service = None,
        model: Model = None,
    ) -> Response:
        """Error budget left and burn rates (5m, 30m, 1h, 6h, 3d) per objective, with the
        fast-burn (14.4x), slow-burn (6x) and ticket (1x) alerts of the SRE workbook."""
        return _served(
            aggregates.slo(store, objective=objective, at=at, service=service, model=model)
        )

    @router.get(
        "/attribution/timeseries", tags=["aggregates"], response_model=Timeseries, responses=_MANY
    )
    def timeseries(
        since: Since = None,
        until: Until = None,
        service: Service = None,
        model: Model = None,
        step: Step = None,
        group_by: Annotated[
            str | None,
            Query(
                description="also a series per group: service, model, route, operation, status "
                "or resource.<attribute>",
                max_length=160,
                examples=["model"],
            ),
        ] = None,
        limit_groups: Annotated[
            int, Query(description="at most this many groups, largest first", ge=1, le=50)
        ] = 10,
    ) -> Response:
        """Since when: percentiles, means and shares of every bucket, TTFT and TPOT per step."""
        return _served(
            aggregates.timeseries(
                store,
                since=since,
                until=until,
                service=service,
                model=model,
                step=step,
                group_by=group_by,
                limit_groups=limit_groups,
            )
        )

    @router.get(
        "/attribution/heatmap", tags=["aggregates"], response_model=Heatmap, responses=_MANY
    )
    def heatmap(
        since: Since = None,
        until: Until = None,
        service: Service = None,
        model: Model = None,
        step: Step = None,
        metric: Metric = "e2e",
        bins_per_decade: Annotated[
            int,
            Query(description="latency bins per factor of ten: 5, 10, 20 or 46", examples=[10]),
        ] = 10,
    ) -> Response:
        """Requests per time step and log-scaled latency bin of e2e (or a bucket, TTFT, TPOT)."""
        return _served(
            aggregates.heatmap(
                store,
                since=since,
                until=until,
                service=service,
                model=model,
                step=step,
                metric=metric,
                bins_per_decade=bins_per_decade,
            )
        )

    @router.get("/attribution/why", tags=["aggregates"], response_model=Why, responses=_MANY)
    def why(
        since: Since = None,
        until: Until = None,
        service: Service = None,
        model: Model = None,
        selection: Annotated[
            str,
            Query(
                description="which requests: percentile (metric at or above the percentile), "
                "region (a heatmap rectangle: sel_since..sel_until, min_ms..max_ms), slo (an "
                "objective's bad requests) or before (the window against the one before it)",
                pattern="^(percentile|region|slo|before)$",
                examples=["percentile"],
            ),
        ] = "percentile",
        metric: Metric = "e2e",
        percentile: Percentile = 99,
        objective: Annotated[
            str | None,
            Query(
                description="for selection=slo: METRIC:THRESHOLD_MS (e.g. ttft:500)",
                max_length=64,
                examples=["ttft:500"],
            ),
        ] = None,
        sel_since: Annotated[
            str | None, _time("for selection=region: start of the region", "30m")
        ] = None,
        sel_until: Annotated[
            str | None, _time("for selection=region: end of the region", "10m")
        ] = None,
        min_ms: Annotated[
            float | None,
            Query(description="for selection=region: metric at least this (ms)", ge=0, le=1e9),
        ] = None,
        max_ms: Annotated[
            float | None,
            Query(description="for selection=region: metric below this (ms)", gt=0, le=1e9),
        ] = None,
        resource: Annotated[
            list[str] | None,
            Query(
                description="more resource attributes to rank (repeat), beside "
                "service.instance.id, k8s.pod.name, k8s.node.name, host.name, "
                "cloud.availability_zone, cloud.region, service.version",
                max_length=16,
                examples=[["k8s.deployment.name"]],
            ),
        ] = None,
        attribute: Annotated[
            list[str] | None,
            Query(
                description="span attributes to rank (repeat), e.g. a tenant id: the value on "
                "any span of the request's trace",
                max_length=16,
                examples=[["tenant.id"]],
            ),
        ] = None,
        limit_values: Annotated[
            int, Query(description="values listed per dimension", ge=1, le=50)
        ] = 5,
        examples: Annotated[
            int, Query(description="slowest selected requests listed", ge=0, le=100)
        ] = 5,
    ) -> Response:
        """What is different about these requests: every dimension ranked by how differently
        its values are spread inside the selection and outside, and each top value's extra
        time split into the seven buckets (they add up)."""
        for key in [*(resource or []), *(attribute or [])]:
            if not re.match(_KEYS_PATTERN, key):
                raise InvalidParameter(
                    "invalid_parameter",
                    f"attribute key {key!r}: letters, digits and . _ - / only, at most 128",
                )
        return _served(
            aggregates.why(
                store,
                since=since,
                until=until,
                service=service,
                model=model,
                selection=selection,
                metric=metric,
                percentile=percentile,
                objective=objective,
                sel_since=sel_since,
                sel_until=sel_until,
                min_ms=min_ms,
                max_ms=max_ms,
                resource=resource,
                attribute=attribute,
                limit_values=limit_values,
                examples=examples,
            )
        )

    @router.get(
        "/attribution/coldstart", tags=["aggregates"], response_model=ColdStart, responses=_MANY
    )
    def coldstart(
        since: Since = None,
        until: Until = None,
        service: Service = None,
        model: Model = None,
        warmup_requests: Annotated[
            int | None,
            Query(
                description="a new replica warms up for its first N requests (default: the "
                "server's --warmup-requests; 0: off)",
                ge=0,
                le=10_000,
            ),
        ] = None,
        warmup_s: Annotated[
            float | None,
            Query(
                description="...and its first S seconds (default: --warmup-s; 0: off)",
                ge=0,
                le=86_400,
            ),
        ] = None,
        lookback_s: Annotated[
            float,
            Query(description="look for replicas this long before the window", gt=300, le=604_800),
        ] = 3600,
    ) -> Response:
        """Cold starts and scale-up lag: replicas that appeared, their warm-up requests, and
        warm-up against warm latency bucket by bucket."""
        return _served(
            aggregates.coldstart(
                store,
                since=since,
                until=until,
                service=service,
                model=model,
                warmup_requests=settings.warmup_requests
                if warmup_requests is None
                else warmup_requests,
                warmup_s=settings.warmup_s if warmup_s is None else warmup_s,
                lookback_s=lookback_s,
            )
        )

    @router.get("/gpu", tags=["aggregates"], response_model=Gpu, responses=_MANY)
    def gpu(
        since: Since = None, until: Until = None, service: Service = None, model: Model = None
    ) -> Response:
        """GPU figures per phase over the window (from the NVML samples on phase spans)."""
        return _served(
            aggregates.gpu(store, since=since, until=until, service=service, model=model)
        )

    @router.get("/services", tags=["aggregates"], response_model=Services, responses=_MANY)
    def services(since: Since = None, until: Until = None) -> Response:
        """The services and models seen in the window, with request counts."""
        return _served(aggregates.services(store, since=since, until=until))

    @router.get(
        "/export/requests",
        tags=["aggregates"],
        response_class=Response,
        responses={
            **_MANY,
            200: {
                "description": "a Parquet file, one row per attributed request (the "
                "attribution table's columns); `X-Latscope-Rows` says how many, "
                "`X-Latscope-Truncated: true` that the limit cut the window short",
                "content": {PARQUET: {"schema": {"type": "string", "format": "binary"}}},
            },
        },
    )
    def export_requests(
        since: Since = None,
        until: Until = None,
        service: Service = None,
        model: Model = None,
        limit: Annotated[
            int,
            Query(
                description="most requests, oldest first",
                ge=1,
                le=aggregates.MAX_EXPORT,
            ),
        ] = aggregates.MAX_EXPORT,
    ) -> Response:
        """The window's attributed requests as Parquet, for offline analysis (polars, pandas,
        DuckDB); ``latscope export --parquet FILE`` writes the same file."""
        body, rows = aggregates.export_requests(
            store, since=since, until=until, service=service, model=model, limit=limit
        )
        headers = {"X-Latscope-Rows": str(rows)}
        if rows >= limit:
            headers["X-Latscope-Truncated"] = "true"
        return Response(body, media_type=PARQUET, headers=headers)

    @router.get("/requests", tags=["aggregates"], response_model=Slowest, responses=_MANY)
    def slowest(
        since: Since = None,
        until: Until = None,
        service: Service = None,
        model: Model = None,
        limit: Annotated[int, Query(description="how many, slowest first", ge=1, le=1000)] = 20,
    ) -> Response:
        """The slowest requests of the window, slowest first, each with its buckets."""
        return _served(
            aggregates.slowest(
                store, since=since, until=until, service=service, model=model, limit=limit
            )
        )

    @router.get(
        "/conversations", tags=["conversations"], response_model=Conversations, responses=_MANY
    )
    def conversations(
        since: Since = None,
        until: Until = None,
        service: Service = None,
        limit: Annotated[
            int,
            Query(description="most conversations, latest first", ge=1,
                  le=talks.MAX_CONVERSATIONS),
        ] = 50,
    ) -> Response:  # fmt: skip
        """The conversations with spans in the window, the latest first: an agent's session
        across traces, named by gen_ai.conversation.id, OpenInference's session.id or
        traceloop's session id."""
        return _served(
            talks.conversations(store, since=since, until=until, service=service, limit=limit)
        )

    @router.get(
        "/conversations/{conversation_id:path}",
        tags=["conversations"],
        response_model=Conversation,
        responses=_ONE,
    )
    def conversation(
        conversation_id: Annotated[
            str,
            Path(
                description="the value of gen_ai.conversation.id (or session.id, or "
                "traceloop.association.properties.session_id) on the conversation's spans",
                max_length=talks.MAX_ID_CHARS,
                examples=["conv-5f1d7a"],
            ),
        ],
        limit_turns: Annotated[
            int,
            Query(description="the latest turns explained", ge=1, le=talks.MAX_TURNS),
        ] = talks.DEFAULT_TURNS,
    ) -> Response:
        """A conversation across traces: its turns (traces) in order, each turn's critical path
        (LLM buckets, tools, app), and the turns' time added up by bucket, tool and app."""
        return _served(
            talks.conversation(
                store, conversation_id, limit_turns=limit_turns, stall_threshold_ms=stall
            )
        )

    return router
