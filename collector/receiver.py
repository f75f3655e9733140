"""OTLP ``TraceService/Export`` and ``MetricsService/Export``: check, validate, queue, acknowledge.

An Export is acknowledged only once its valid items are durable (in ClickHouse or the spool).
An invalid span or data point is rejected alone and reported through OTLP partial success;
backpressure answers ``RESOURCE_EXHAUSTED`` with a RetryInfo, which OTLP clients retry.
The same ``Ingest`` serves OTLP/gRPC and OTLP/HTTP (``collector/http.py``).

Trace Exports arrive as bytes: gRPC hands the request over unparsed and the C decoder
(``mapping.decode_spans``) reads the protobuf wire format straight into Arrow columns, so no
span ever becomes a Python object. Bytes that are not an Export get ``INVALID_ARGUMENT``, as
gRPC's own parse would have refused them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass

import grpc
import pyarrow as pa
from google.protobuf.duration_pb2 import Duration
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from latscope.auth import UNAUTHORIZED, bearer_ok, metadata_authorization
from latscope.collector import telemetry
from latscope.collector.mapping import (
    MAX_DECODED_BYTES,
    NATIVE,
    DecodedSpans,
    ExportTooLarge,
    Limits,
    MalformedExport,
    MetricColumns,
    SpanColumns,
    decode_spans,
    table_bytes,
)
from latscope.collector.memory import ExportSizes, MemoryLimit
from latscope.collector.writer import BatchWriter, JournalWriter, Refused, Ticket
from latscope.rpc import parse_error, refuse_malformed

log = logging.getLogger(__name__)

#: how long a request waits for its rows to become durable before it gives up (client retries)
ACK_TIMEOUT_S = 120.0
#: Python objects per byte of a message parsed into protobuf classes or decoded from JSON, as
#: held while it is mapped (measured: about 6x for OTLP protobuf in upb, 10x for json.loads);
#: counted against the memory limit for as long as the parse lives.
PARSE_EXPANSION = 10


_Counts = SpanColumns | MetricColumns | DecodedSpans


@dataclass
class Outcome:
    """What an Export achieved: items rejected as invalid, and why (the first reason)."""

    rejected: int = 0
    message: str = ""


#: What a gRPC Export is counted as before it is read, until Exports of its signal have been
#: read (``ExportSizes``): more than a trace Export of the OpenTelemetry SDK's batches of 512
#: spans takes.
FIRST_EXPORT_BYTES = 1 << 20
#: At most this share of the memory limit is what an Export is counted as before it is read:
#: an Export bigger than the limit (refused once read) or a small limit must not leave every
#: Export after it refused unread.
UNREAD_SHARE = 8


class Ingest:
    """Validate Exports and hand their rows to the writers; shared by gRPC and HTTP."""

    def __init__(
        self,
        spans: JournalWriter,
        metrics: BatchWriter,
        limits: Limits,
        token: str = "",
        histograms: Mapping[str, BatchWriter] | None = None,
        *,
        memory: MemoryLimit | None = None,
        span_window: tuple[float, float] = (0.0, 0.0),
    ) -> None:
        self.spans = spans
        self.metrics = metrics
        #: table name -> writer, for the histogram kinds (``mapping.HISTOGRAM_TABLE``, ...)
        self.histograms = dict(histograms or {})
        self.limits = limits
        #: How long ago a span may have started and how far in the future it may end, in
        #: seconds on this process's clock (0: no bound); the rest is rejected at the door.
        self.span_window = span_window
        self.token = token
        self.memory = memory or MemoryLimit(1 << 62)
        #: What a gRPC Export is counted as before it is read (``receiving``), by signal.
        self.export_sizes = {
            signal: ExportSizes(FIRST_EXPORT_BYTES) for signal in ("traces", "metrics")
        }
        #: When the last Export arrived (monotonic s): shutdown waits for senders to go quiet.
        self.last_arrival = 0.0
        # One Export is mapped at a time. The C decoder runs without the GIL, so the other
        # handler threads receive meanwhile; decodes running at once cost about three times the
        # CPU per span (most of it system time, hundreds of context switches an Export), and
        # handler threads interleaving through the Python mapping about a third more.
        self._mapping = threading.Lock()

    def _limits(self) -> Limits:
        """The limits an Export arriving now is checked against (with the span time window)."""
        max_age_s, max_future_s = self.span_window
        if not (max_age_s or max_future_s):
            return self.limits
        return self.limits.window(time.time_ns(), max_age_s, max_future_s)

    def authorized(self, header: str | None) -> bool:
        """Whether an ``authorization`` value carries the bearer token (always, without one)."""
        return bearer_ok(header, self.token)

    @contextlib.contextmanager
    def holding(self, nbytes: int, signal: str = "traces") -> Iterator[None]:
        """Count ``nbytes`` against the memory limit while the block runs; raises ``Refused``
        (RESOURCE_EXHAUSTED / 429) at once when they do not fit."""
        if not self.memory.reserve(nbytes):
            raise self.memory_refusal(signal)
        try:
            yield
        finally:
            self.memory.release(nbytes)

    @contextlib.contextmanager
    def receiving(self, signal: str) -> Iterator[Callable[[int], None]]:
        """Count a gRPC Export of ``signal`` whose size is not known yet (its message not read)
        against the memory limit while the block runs: the largest recent Export's before it is
        read (at most 1 / ``UNREAD_SHARE`` of the limit), then its own once the block calls the
        function it is given with that size. Raises ``Refused`` at once when the first does not
        fit (the Export is then never read), and from that call when the Export read is bigger
        and does not fit."""
        sizes = self.export_sizes[signal]
        held = min(sizes.estimate(), self.memory.limit // UNREAD_SHARE)
        if not self.memory.reserve(held):
            raise self.memory_refusal(signal)

        def received(nbytes: int) -> None:
            nonlocal held
            sizes.add(nbytes)
            if nbytes > held and not self.memory.reserve(nbytes - held):
                raise self.memory_refusal(signal)
            self.memory.release(held - nbytes)  # nothing when more was reserved above
            held = nbytes

        try:
            yield received
        finally:
            self.memory.release(held)

    def fits(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more would fit the memory limit now (checked before reading)."""
        return nbytes <= self.memory.available

    def memory_refusal(self, signal: str) -> Refused:
        telemetry.MEMORY_REFUSED.labels(signal).inc()
        return Refused(
            f"the collector's memory limit is reached ({self.memory.held} of "
            f"{self.memory.limit} bytes held by Exports waiting for ClickHouse); retry later",
            exhausted=True,
            retry_after_s=1.0,
        )

    def export_trace_bytes(self, data: bytes) -> Outcome:
        """Store the valid spans of a serialized Export (OTLP/gRPC, OTLP/HTTP protobuf).

        The caller holds ``data`` against the memory limit (``holding``). Raises
        ``MalformedExport`` when ``data`` is not an Export, ``Refused`` when the collector cannot
        take its spans now (its memory limit or its queue is full, or it is stopping).
        """
        self.spans.check_room()  # a full queue or a stopping collector refuses before decoding
        # Without the C decoder, the Python mapping first parses into protobuf objects.
        parse = 0 if NATIVE else len(data) * PARSE_EXPANSION
        with self.spans.arriving(), self.holding(parse):
            with self._mapping:
                # Decoding stops where the memory left runs out, before the rest is read.
                room = self.memory.available
                try:
                    decoded = decode_spans(
                        data, self._limits(), max_bytes=min(MAX_DECODED_BYTES, room)
                    )
                except ExportTooLarge:
                    if room < MAX_DECODED_BYTES:
                        raise self.memory_refusal("traces") from None
                    raise
                held = self._take(decoded.table)
            ticket = self._submit(
                "traces", self.spans, decoded, decoded.table, data, held, decoded.expanded
            )
        return self._outcome(ticket, "traces", decoded, "span")

    def export_traces(self, request: trace_service_pb2.ExportTraceServiceRequest) -> Outcome:
        """Store the valid spans of a parsed Export (OTLP/HTTP JSON); raises ``Refused``.

        The caller holds the parsed request against the memory limit.
        """
        with self.spans.arriving():
            with self._mapping:
                cols = SpanColumns(self._limits())
                cols.add(request.resource_spans)
                table = cols.table()
                held = self._take(table)
            # The journal keeps Exports in the wire format, whatever encoding they came in.
            try:
                raw = request.SerializeToString() if cols.rows else b""
            except BaseException:
                self.memory.release(held)
                raise
            ticket = self._submit("traces", self.spans, cols, table, raw, held)
        return self._outcome(ticket, "traces", cols, "span")

    def export_metrics(self, request: metrics_service_pb2.ExportMetricsServiceRequest) -> Outcome:
        """Store the valid data points of an Export: gauges and sums in the metrics table,
        histograms and exponential histograms in one table each; raises ``Refused``."""
        writers = [self.metrics, *self.histograms.values()]
        with ExitStack() as arriving:
            for writer in writers:
                arriving.enter_context(writer.arriving())
            with self._mapping:
                cols = MetricColumns(self.limits)
                cols.add(request.resource_metrics)
                tables = [(self.metrics, cols.table()), *(
                    (self.histograms[name], table)
                    for name, table in cols.histogram_tables().items()
                    if name in self.histograms
                )]  # fmt: skip
            telemetry.RECEIVED.labels("metrics").inc(cols.rows + cols.rejected)
            if cols.rejected:
                telemetry.REJECTED.labels("metrics").inc(cols.rejected)
            tickets = []
            for writer, table in tables:
                if not table.num_rows:
                    continue
                try:
                    tickets.append(writer.submit(table))
                except Refused:
                    telemetry.REFUSED.labels("metrics").inc(table.num_rows)
                    raise
        for ticket in tickets:
            ticket.wait(ACK_TIMEOUT_S)
        return self._outcome(None, "metrics", cols, "data point")

    def _take(self, table: pa.Table) -> int:
        """Count a decoded table against the limit (the span writer releases it once the rows
        are inserted, or spooled); raises ``Refused`` when it does not fit."""
        held = table_bytes(table) if table.num_rows else 0
        if not self.memory.reserve(held):
            raise self.memory_refusal("traces")
        return held

    def _submit(
        self,
        signal: str,
        writer: BatchWriter | JournalWriter,
        cols: _Counts,
        table: pa.Table,
        raw: bytes | None = None,
        held: int = 0,
        expanded: int | None = None,
    ) -> Ticket | None:
        telemetry.RECEIVED.labels(signal).inc(cols.rows + cols.rejected)
        if cols.rejected:
            telemetry.REJECTED.labels(signal).inc(cols.rejected)
        if not cols.rows:
            self.memory.release(held)
            return None
        try:
            if isinstance(writer, JournalWriter):
                assert raw is not None
                return writer.submit(table, raw, held=held, expanded=expanded)
            return writer.submit(table)
        except Refused:
            self.memory.release(held)  # the writer did not take the rows
            telemetry.REFUSED.labels(signal).inc(cols.rows)
            raise

    @staticmethod
    def _outcome(ticket: Ticket | None, signal: str, cols: _Counts, noun: str) -> Outcome:
        if ticket is not None:
            ticket.wait(ACK_TIMEOUT_S)  # the writer counts what it refuses
        if not cols.rejected:
            return Outcome()
        return Outcome(
            cols.rejected, f"{cols.rejected} {noun}(s) rejected; first: {cols.first_problem}"
        )


def retry_status(error: Refused) -> tuple[grpc.StatusCode, list[tuple[str, bytes]]]:
    """The gRPC code and trailing metadata (google.rpc.Status + RetryInfo) for a refusal."""
    delay = Duration()
    delay.FromMilliseconds(int(error.retry_after_s * 1000))
    info = error_details_pb2.RetryInfo(retry_delay=delay)
    code = grpc.StatusCode.RESOURCE_EXHAUSTED if error.exhausted else grpc.StatusCode.UNAVAILABLE
    status = status_pb2.Status(
        code=code_pb2.RESOURCE_EXHAUSTED if error.exhausted else code_pb2.UNAVAILABLE,
        message=str(error),
    )
    status.details.add().Pack(info)
    # The OTLP spec puts RetryInfo in the status details; opentelemetry-python's exporter reads
    # it from its own trailer key, so both are sent.
    return code, [
        ("grpc-status-details-bin", status.SerializeToString()),
        ("google.rpc.retryinfo-bin", info.SerializeToString()),
    ]


def _check(ingest: Ingest, context: grpc.ServicerContext) -> None:
    ingest.last_arrival = time.monotonic()
    if not ingest.authorized(metadata_authorization(context.invocation_metadata())):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHORIZED)


def _abort(context: grpc.ServicerContext, error: Refused) -> None:
    code, trailers = retry_status(error)
    context.set_trailing_metadata(tuple(trailers))
    context.abort(code, str(error))


TRACE_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
METRICS_SERVICE = "opentelemetry.proto.collector.metrics.v1.MetricsService"


def trace_response(outcome: Outcome) -> trace_service_pb2.ExportTraceServiceResponse:
    """The OTLP answer to a trace Export: empty, or the partial success."""
    response = trace_service_pb2.ExportTraceServiceResponse()
    if outcome.rejected:
        response.partial_success.rejected_spans = outcome.rejected
        response.partial_success.error_message = outcome.message
    return response


def _register_export(
    server: grpc.Server,
    service: str,
    export: Callable[[Iterator[bytes], grpc.ServicerContext], bytes],
) -> None:
    """Add ``service``'s Export method to ``server``, client-streaming (a unary call is a stream
    of one message on the wire), with no request parse and no response encoding."""
    handlers: dict[str, grpc.RpcMethodHandler[bytes, bytes]] = {
        "Export": grpc.stream_unary_rpc_method_handler(export)
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    # Registered methods are matched by the gRPC core instead of a Python lookup per call.
    server.add_registered_method_handlers(service, handlers)


def _message(requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
    """The one message of a call to an Export method registered by ``_register_export``, read
    now; a call that carried none is answered ``INVALID_ARGUMENT``."""
    message = next(requests, None)
    if message is None:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call carried no Export message")
    return message


class TraceReceiver:
    """OTLP/gRPC ``TraceService/Export``, registered to take the request as unparsed bytes.

    The method is registered as client-streaming: on the wire a unary call is a stream of one
    message, so every OTLP exporter calls it as before, and the handler runs before that message
    is read. It is counted against the memory limit first (``Ingest.receiving``), and an Export
    that does not fit is refused unread, its bytes never taken from the connection."""

    def __init__(self, ingest: Ingest) -> None:
        self.ingest = ingest

    def Export(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        _check(self.ingest, context)
        try:
            with self.ingest.receiving("traces") as received:
                request = _message(requests, context)
                received(len(request))
                outcome = self.ingest.export_trace_bytes(request)
        except MalformedExport as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Refused as error:
            _abort(context, error)
        if not outcome.rejected:
            return b""  # an empty ExportTraceServiceResponse
        return trace_response(outcome).SerializeToString()

    def register(self, server: grpc.Server) -> None:
        _register_export(server, TRACE_SERVICE, self.Export)


class MetricsReceiver:
    """OTLP/gRPC ``MetricsService/Export``: gauges, sums and histograms into the metric tables.

    Registered as the trace method is (``TraceReceiver``): client-streaming, the request as
    bytes, so an Export is counted against the memory limit (as its parse) before it is read and
    parsed, and refused unread when that does not fit; one that does not parse is answered
    ``INVALID_ARGUMENT`` (``latscope.rpc.refuse_malformed``)."""

    def __init__(self, ingest: Ingest) -> None:
        self.ingest = ingest

    def Export(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        _check(self.ingest, context)
        try:
            with self.ingest.receiving("metrics") as received:
                data = _message(requests, context)
                # Held as its parse, for as long as it is mapped.
                received(len(data) * PARSE_EXPANSION)
                try:
                    request = metrics_service_pb2.ExportMetricsServiceRequest.FromString(data)
                except Exception as exc:  # protobuf's DecodeError, as gRPC's parse would catch
                    refuse_malformed(context, f"{METRICS_SERVICE}/Export", parse_error(exc))
                outcome = self.ingest.export_metrics(request)
        except Refused as error:
            _abort(context, error)
        response = metrics_service_pb2.ExportMetricsServiceResponse()
        if outcome.rejected:
            response.partial_success.rejected_data_points = outcome.rejected
            response.partial_success.error_message = outcome.message
        return response.SerializeToString()

    def register(self, server: grpc.Server) -> None:
        _register_export(server, METRICS_SERVICE, self.Export)


__all__ = [
    "METRICS_SERVICE",
    "TRACE_SERVICE",
    "Ingest",
    "MetricsReceiver",
    "Outcome",
    "TraceReceiver",
    "retry_status",
    "trace_response",
]
