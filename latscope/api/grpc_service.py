"""``latscope.v1.QueryService`` (proto/latscope/v1/query.proto): the REST answers for programs.

Served on the same gRPC server as the OTLP receiver. With a token configured, every call needs
metadata ``authorization: Bearer <token>`` (UNAUTHENTICATED otherwise). Errors map to status
codes: a malformed argument, or a request that is not a valid message, is INVALID_ARGUMENT (the
latter logged once a minute per cause: ``latscope.rpc``), an unknown trace NOT_FOUND, a store
that does not answer UNAVAILABLE.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
from google.protobuf import json_format

from latscope.api import trace
from latscope.api.burn import BurnRates, parse_objectives
from latscope.api.errors import QueryError
from latscope.api.live import (
    HUB,
    MAX_SUBSCRIBERS,
    LiveHub,
    TablePoller,
    WatchFilter,
    iter_subscription,
)
from latscope.api.schemas import Answer, Attribution, LiveRequest, Run, Summary, TraceRequests
from latscope.auth import UNAUTHORIZED, bearer_ok, metadata_authorization
from latscope.config import Settings
from latscope.parts import Parts
from latscope.rpc import register
from latscope.storage import Store, StoreError, StoreUnavailable
from latscope.v1 import query_pb2, query_pb2_grpc

log = logging.getLogger(__name__)

_STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    # trace_too_large: the trace is past --max-trace-spans
    422: grpc.StatusCode.FAILED_PRECONDITION,
    # busy, query_timeout: retry later
    503: grpc.StatusCode.UNAVAILABLE,
}

#: Threads for unary queries beside the Watch streams (each open stream holds one thread).
QUERY_THREADS = 8
_QUERY_METHODS = ("GetAttribution", "Summary", "Watch")


def _in_pool(method: Callable[..., Any], pool: futures.ThreadPoolExecutor) -> Callable[..., Any]:
    """``method`` marked to run in ``pool`` instead of the gRPC server's own threads.

    grpcio runs a handler in ``behavior.experimental_thread_pool`` when the handler carries
    one. The server's pool belongs to OTLP ingest: an idle Watch stream holds its thread for as
    long as it is open, and a client holding many streams must not stop Exports.
    """

    @functools.wraps(method)
    def run(*args: Any) -> Any:
        return method(*args)

    run.experimental_thread_pool = pool  # type: ignore[attr-defined]
    return run


def _without_nulls(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` without its null values: an unset optional field in the message."""
    return {k: v for k, v in data.items() if v is not None}


def _attribution_data(body: dict[str, Any]) -> dict[str, Any]:
    """An attribution's JSON in the message's JSON mapping (nulls stay unset)."""
    data = _without_nulls(body)
    data["gpu"] = {phase: {"figures": figs} for phase, figs in body["gpu"].items()}
    data["buckets_ms"] = _without_nulls(body["buckets_ms"])
    data["itl_ms"] = _without_nulls(body["itl_ms"])
    return data


# Every conversion parses strictly (no ignore_unknown_fields): a key of the answer that the
# message does not have is a mismatch between REST and gRPC, and fails here rather than
# vanishing from the gRPC answer.


def attribution_message(answer: Attribution) -> query_pb2.RequestAttribution:
    """An attribution (a ``LiveRequest`` for Watch) as a ``RequestAttribution``."""
    return json_format.ParseDict(
        _attribution_data(answer.json_dict()), query_pb2.RequestAttribution()
    )


def requests_message(answer: TraceRequests) -> query_pb2.ListRequestsResponse:
    """``/v1/traces/{trace_id}/requests``'s answer as a ``ListRequestsResponse``."""
    return query_pb2.ListRequestsResponse(
        trace_id=answer.trace_id, requests=[attribution_message(r) for r in answer.requests]
    )


def run_message(answer: Run) -> query_pb2.Run:
    """``/v1/traces/{trace_id}/run``'s answer as a ``Run`` (nulls stay unset)."""
    body = answer.json_dict()
    data = {
        **body,
        "calls": [{**c, "attribution": _attribution_data(c["attribution"])} for c in body["calls"]],
        "path": [_without_nulls(step) for step in body["path"]],
    }
    return json_format.ParseDict(data, query_pb2.Run())


#: What ``/v1/attribution/summary`` answers beside the ``SummaryResponse``'s fields: the
#: streaming figures, the client-span count, the grouping and the window in ns. Named here so
#: that a key added to the answer fails the conversion until the message or this list has it.
SUMMARY_REST_ONLY = ("with_client", "streaming", "group_by", "window")


def summary_message(answer: Summary) -> query_pb2.SummaryResponse:
    """The summary as a ``SummaryResponse`` (nulls stay unset)."""
    body = answer.json_dict()

    def section(d: dict[str, Any]) -> dict[str, Any]:
        data = {k: v for k, v in d.items() if k not in SUMMARY_REST_ONLY}
        data["e2e_ms"] = _without_nulls(d["e2e_ms"])
        data["buckets_ms"] = {b: _without_nulls(v) for b, v in d["buckets_ms"].items()}
        return data

    data = section(body)
    data["groups"] = [section(g) for g in body["groups"]]
    data["since"], data["until"] = body["window"]["since"], body["window"]["until"]
    return json_format.ParseDict(data, query_pb2.SummaryResponse())


def run_dict(message: query_pb2.Run) -> dict[str, Any]:
    """A ``Run`` back in the REST JSON shape."""
    data = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    for call, msg in zip(data["calls"], message.calls, strict=True):
        call["attribution"] = attribution_dict(msg.attribution)
        del call["attribution"]["start_unix_nano"]  # Watch's field; a run's calls have start_ms
    for step in data["path"]:  # optional fields: unset is null in the REST shape
        step.setdefault("bucket", None)
        step.setdefault("request_id", None)
    return data


def attribution_dict(message: query_pb2.RequestAttribution) -> dict[str, Any]:
    """A ``RequestAttribution`` message back in the REST JSON shape (for clients such as top):
    the inverse of ``attribution_message``, through the same model."""
    data = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    data["gpu"] = {phase: figures["figures"] for phase, figures in data["gpu"].items()}
    return LiveRequest.model_validate(_with_nulls(data, LiveRequest)).json_dict()


def _with_nulls(data: dict[str, Any], model: type[Answer]) -> dict[str, Any]:
    """``data`` with null for each field of ``model`` (and of its parts) it lacks: an unset
    optional field of the message."""
    out = {name: None for name in model.model_fields} | data
    for name, field in model.model_fields.items():
        part = field.annotation
        if isinstance(part, type) and issubclass(part, Answer) and isinstance(out[name], dict):
            out[name] = _with_nulls(out[name], part)
    return out


class QueryServicer(query_pb2_grpc.QueryServiceServicer):
    """The query service; its calls run in ``pool``, never on the ingest threads."""

    name = "query-service"

    def __init__(self, store: Store, settings: Settings, *, hub: LiveHub = HUB) -> None:
        self.store = store
        self.settings = settings
        self.hub = hub
        # Every Watch stream the hub allows holds a thread; unary queries get their own few.
        self.pool = futures.ThreadPoolExecutor(
            max_workers=MAX_SUBSCRIBERS + QUERY_THREADS, thread_name_prefix="grpc-query"
        )
        for name in _QUERY_METHODS:
            setattr(self, name, _in_pool(getattr(self, name), self.pool))

    def start(self) -> None:
        return None

    def stop(self, deadline: float) -> None:
        # The gRPC server has stopped by now, which ends the streams; do not wait past deadline.
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _authorize(self, context: grpc.ServicerContext) -> None:
        if not bearer_ok(
            metadata_authorization(context.invocation_metadata()), self.settings.token
        ):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHORIZED)

    def _answer(self, context: grpc.ServicerContext, fn: Any, *args: Any) -> Any:
        self._authorize(context)
        try:
            return fn(*args)
        except QueryError as exc:
            context.abort(_STATUS.get(exc.status, grpc.StatusCode.INVALID_ARGUMENT), str(exc))
        except StoreUnavailable as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"the store did not answer: {exc}")
        except StoreError as exc:
            log.exception("query failed")
            context.abort(grpc.StatusCode.INTERNAL, f"the store failed the query: {exc}")

    def GetAttribution(
        self, request: query_pb2.GetAttributionRequest, context: grpc.ServicerContext
    ) -> query_pb2.RequestAttribution:
        body = self._answer(
            context,
            lambda: trace.request_attribution(
                self.store,
                request.request_id or request.trace_id,
                stall_threshold_ms=self.settings.stall_threshold_ms,
                max_spans=self.settings.max_trace_spans,
            ),
        )
        return attribution_message(body)

    def ListRequests(
        self, request: query_pb2.ListRequestsRequest, context: grpc.ServicerContext
    ) -> query_pb2.ListRequestsResponse:
        body = self._answer(
            context,
            lambda: trace.trace_requests(
                self.store,
                request.trace_id,
                stall_threshold_ms=self.settings.stall_threshold_ms,
                max_spans=self.settings.max_trace_spans,
            ),
        )
        return requests_message(body)

    def GetRun(
        self, request: query_pb2.GetRunRequest, context: grpc.ServicerContext
    ) -> query_pb2.Run:
        body = self._answer(
            context,
            lambda: trace.trace_run(
                self.store,
                request.trace_id,
                stall_threshold_ms=self.settings.stall_threshold_ms,
                max_spans=self.settings.max_trace_spans,
            ),
        )
        return run_message(body)

    def Summary(
        self, request: query_pb2.SummaryRequest, context: grpc.ServicerContext
    ) -> query_pb2.SummaryResponse:
        from latscope.api import queries as aggregates

        body = self._answer(
            context,
            lambda: aggregates.summary(
                self.store,
                since=request.since or None,
                until=request.until or None,
                service=request.service or None,
                model=request.model or None,
                group_by=request.group_by or None,
                exact=request.exact,
            ),
        )
        return summary_message(body)

    def Watch(
        self, request: query_pb2.WatchRequest, context: grpc.ServicerContext
    ) -> Iterator[query_pb2.RequestAttribution]:
        self._authorize(context)
        if request.min_e2e_ms < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "min_e2e_ms must be >= 0")
        sub = self.hub.subscribe(WatchFilter(request.service, request.model, request.min_e2e_ms))
        if sub is None:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many Watch streams open")
        context.add_callback(sub.close)
        # The headers go now: a client that waits for them knows what is attributed from here
        # on reaches it.
        context.send_initial_metadata(())
        for body in iter_subscription(sub, alive=context.is_active):
            yield attribution_message(LiveRequest.model_validate(body))


def query_parts(settings: Settings, store: Store, *, poll_table: bool = True) -> Parts:
    """The query service for a latscope process, the SLO burn rates on ``/metrics``
    (``--slo-objectives``) and (``poll_table``) the poller that feeds Watch and the
    ``/metrics`` latency histograms from newly attributed rows."""
    servicer = QueryServicer(store, settings)
    parts = Parts(
        grpc_servicers=[lambda server: register(
            query_pb2_grpc.add_QueryServiceServicer_to_server, servicer, server
        )],
        components=[servicer],
    )  # fmt: skip
    if poll_table:
        parts.components.append(TablePoller(store))
    objectives = parse_objectives(settings.slo_objectives)
    if objectives:
        parts.components.append(BurnRates(store, objectives, poll_s=settings.slo_interval_s))
    return parts
