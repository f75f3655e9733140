"""The ``/v1`` routes about one request or one trace, and the live feed."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from latscope.api import live as live_feed
from latscope.api import trace
from latscope.api.routes.params import (
    MANY,
    ONE,
    REQUEST,
    Model,
    RequestId,
    Service,
    SpanId,
    StallMs,
    TraceId,
    served,
)
from latscope.api.schemas import (
    Attribution,
    Explain,
    Live,
    RequestTokens,
    Run,
    StoredSpan,
    TraceExplain,
    TraceRequests,
    TraceSpans,
)
from latscope.config import Settings
from latscope.storage import Store


def add_trace_routes(router: APIRouter, store: Store, settings: Settings) -> None:
    """One request's attribution, explanation and tokens; a trace's spans, requests, run and
    explanation; the requests attributed lately."""
    stall = settings.stall_threshold_ms
    cap = settings.max_trace_spans

    @router.get(
        "/requests/{request_id}/attribution",
        tags=["requests"],
        response_model=Attribution,
        responses=REQUEST,
    )
    def request_attribution(request_id: RequestId) -> Response:
        """Where one request's end-to-end time went, bucket by bucket (milliseconds).

        A request is one inference call. Name it by its request id, or by its trace id when the
        trace holds one call (409 ``several_requests`` when it holds several: the answer lists
        their ids; ``/v1/traces/{trace_id}/requests`` gives them all with their buckets)."""
        return served(
            trace.request_attribution(store, request_id, stall_threshold_ms=stall, max_spans=cap)
        )

    @router.get(
        "/requests/{request_id}", tags=["requests"], response_model=Explain, responses=REQUEST
    )
    def request_explain(request_id: RequestId, stall_ms: StallMs = None) -> Response:
        """One request at once: its buckets, its trace's spans as a waterfall (on this
        request's clock, from its start) and its token timeline. Named as for
        ``/attribution``."""
        return served(
            trace.explain(store, request_id, stall_ms, stall_threshold_ms=stall, max_spans=cap)
        )

    @router.get(
        "/requests/{request_id}/tokens",
        tags=["requests"],
        response_model=RequestTokens,
        responses=REQUEST,
    )
    def request_tokens(request_id: RequestId, stall_ms: StallMs = None) -> Response:
        """When each token reached the client's clock, and the inter-token stalls. Named as
        for ``/attribution``."""
        return served(
            trace.token_timeline(
                store, request_id, stall_ms, stall_threshold_ms=stall, max_spans=cap
            )
        )

    @router.get(
        "/traces/{trace_id}/spans", tags=["traces"], response_model=TraceSpans, responses=ONE
    )
    def trace_spans(trace_id: TraceId) -> Response:
        """Every span of a trace, server spans moved onto the client's clock, depth-first: each
        span's children under it, siblings by start (as a waterfall lists them)."""
        return served(trace.trace_spans(store, trace_id, max_spans=cap))

    @router.get(
        "/traces/{trace_id}/spans/{span_id}",
        tags=["traces"],
        response_model=StoredSpan,
        responses=ONE,
    )
    def stored_span(trace_id: TraceId, span_id: SpanId) -> Response:
        """One span as stored, every attribute value whole (a prompt the trace's answers show
        cut), with its resource, events and links; read alone, so a span of a trace past
        ``--max-trace-spans`` too."""
        return served(trace.stored_span(store, trace_id, span_id))

    @router.get(
        "/traces/{trace_id}/requests",
        tags=["traces"],
        response_model=TraceRequests,
        responses=ONE,
    )
    def trace_requests(trace_id: TraceId) -> Response:
        """Every inference call of a trace (an agent run, a RAG pipeline, a gateway fan-out),
        by start, each with its buckets; an empty list when the trace holds none."""
        return served(
            trace.trace_requests(store, trace_id, stall_threshold_ms=stall, max_spans=cap)
        )

    @router.get("/traces/{trace_id}/run", tags=["traces"], response_model=Run, responses=ONE)
    def trace_run(trace_id: TraceId) -> Response:
        """The trace as one run: the root's end-to-end time and, along its critical path (the
        chain of work the root waited on), the time in LLM calls by bucket, in tool calls and in
        the app's own code; these add up to the root's duration. Parallel calls count once."""
        return served(trace.trace_run(store, trace_id, stall_threshold_ms=stall, max_spans=cap))

    @router.get("/traces/{trace_id}", tags=["traces"], response_model=TraceExplain, responses=ONE)
    def trace_explain(trace_id: TraceId) -> Response:
        """A trace at once: its run (as ``/run``) and its spans as a waterfall from the root's
        start, each call's client span marked with its request id."""
        return served(trace.trace_explain(store, trace_id, stall_threshold_ms=stall, max_spans=cap))

    @router.get("/live", tags=["requests"], response_model=Live, responses=MANY)
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
        return served(
            live_feed.since(
                after=after,
                epoch=epoch,
                service=service or "",
                model=model or "",
                min_e2e_ms=min_e2e_ms,
                limit=limit,
            )
        )
