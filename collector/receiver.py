"""OTLP/gRPC ``TraceService/Export``: validate, map, store, acknowledge.

An Export is acknowledged only after its spans are stored; a span that cannot be stored as
sent (bad ids, end before start) is rejected alone and reported through OTLP partial success.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

import grpc
from latscope.collector.mapping import columns_to_table, resource_spans_to_columns
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from latscope.storage import SPANS_TABLE, Store, StoreError, StoreUnavailable

log = logging.getLogger(__name__)

_ZERO_TRACE = bytes(16)
_ZERO_SPAN = bytes(8)


def span_problem(span: Span) -> str | None:
    """Why a span cannot be stored as sent, or None when it can."""
    if len(span.trace_id) != 16 or span.trace_id == _ZERO_TRACE:
        return "trace_id must be 16 bytes, not all zero"
    if len(span.span_id) != 8 or span.span_id == _ZERO_SPAN:
        return "span_id must be 8 bytes, not all zero"
    if span.parent_span_id and len(span.parent_span_id) != 8:
        return "parent_span_id must be empty or 8 bytes"
    if span.end_time_unix_nano < span.start_time_unix_nano:
        return "end_time_unix_nano is before start_time_unix_nano"
    return None


@dataclass
class _Rejections:
    count: int = 0
    first: str = ""

    def __call__(self, span: Span) -> bool:
        problem = span_problem(span)
        if problem is None:
            return True
        self.count += 1
        if not self.first:
            self.first = f"span {span.span_id.hex() or '<empty>'}: {problem}"
        return False


class TraceReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """Stores every valid span of an Export before answering it."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        rejections = _Rejections()
        table = columns_to_table(resource_spans_to_columns(request.resource_spans, rejections))
        if table.num_rows:
            try:
                self.store.insert_arrow(SPANS_TABLE, table, dedup_token=uuid.uuid4().hex)
            except StoreUnavailable as exc:
                context.abort(grpc.StatusCode.UNAVAILABLE, f"store unavailable: {exc}")
            except StoreError as exc:
                log.exception("span insert failed")
                context.abort(grpc.StatusCode.INTERNAL, f"store rejected the batch: {exc}")
        response = trace_service_pb2.ExportTraceServiceResponse()
        if rejections.count:
            response.partial_success.rejected_spans = rejections.count
            response.partial_success.error_message = (
                f"{rejections.count} span(s) rejected; first: {rejections.first}"
            )
        return response


__all__ = ["TraceReceiver", "span_problem"]
