"""OTLP/HTTP: ``POST /v1/traces`` and ``POST /v1/metrics``, protobuf or JSON, optionally gzip'd.

Follows the OTLP/HTTP spec: the response uses the request's encoding; errors carry a
``google.rpc.Status`` (JSON or protobuf); backpressure is 429 (full) or 503 (shutting down)
with ``Retry-After``; partial success is a 200 with ``partialSuccess`` filled in. In OTLP/JSON
trace and span ids are hex strings, not base64 as protobuf's JSON mapping would have them.
Protobuf trace bodies take the gRPC receiver's path (the C decoder, no protobuf objects); JSON
bodies are parsed into messages and mapped in Python.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import time
import zlib
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request, Response
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from google.rpc import status_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from latscope.auth import UNAUTHORIZED
from latscope.collector.mapping import MalformedExport
from latscope.collector.receiver import PARSE_EXPANSION, Ingest, Outcome, trace_response
from latscope.collector.writer import Refused

PROTOBUF = "application/x-protobuf"
JSON = "application/json"


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _read_body(raw: bytes, encoding: str, max_bytes: int) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return raw
    if encoding != "gzip":
        raise BadRequest(415, f"unsupported Content-Encoding {encoding!r}; use gzip or none")
    # Bounded inflate: a small gzip bomb must not become gigabytes in memory.
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        body = inflater.decompress(raw, max_bytes + 1)
    except zlib.error as exc:
        raise BadRequest(400, f"body is not valid gzip: {exc}") from None
    if len(body) > max_bytes or inflater.unconsumed_tail:
        raise BadRequest(413, f"decompressed body is larger than {max_bytes} bytes")
    return body


def _hex_to_b64(obj: dict, key: str) -> None:
    value = obj.get(key)
    if isinstance(value, str) and value:
        try:
            obj[key] = base64.b64encode(bytes.fromhex(value)).decode("ascii")
        except ValueError:
            # Not hex: leave the id empty so validation rejects this span alone.
            obj[key] = ""


def _fix_ids(doc: Any, ids: tuple[str, ...]) -> None:
    """Rewrite OTLP/JSON hex ids into protobuf-JSON base64, in place, at any depth."""
    if isinstance(doc, dict):
        for key in ids:
            _hex_to_b64(doc, key)
        for value in doc.values():
            if isinstance(value, (dict, list)):
                _fix_ids(value, ids)
    elif isinstance(doc, list):
        for value in doc:
            _fix_ids(value, ids)


_SPAN_IDS = ("traceId", "spanId", "parentSpanId")
_TOO_DEEP = "body is nested too deeply to be an OTLP JSON Export"
_METRIC_IDS = ("traceId", "spanId")  # exemplars


def _parse(body: bytes, json_body: bool, message: Message, ids: tuple[str, ...]) -> None:
    if json_body:
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadRequest(400, f"body is not valid JSON: {exc}") from None
        except RecursionError:
            raise BadRequest(400, _TOO_DEEP) from None
        if not isinstance(doc, dict):
            raise BadRequest(400, "body must be a JSON object")
        try:
            _fix_ids(doc, ids)
        except RecursionError:
            raise BadRequest(400, _TOO_DEEP) from None
        try:
            json_format.ParseDict(doc, message, ignore_unknown_fields=True)
        except (json_format.ParseError, ValueError, TypeError, RecursionError) as exc:
            raise BadRequest(400, f"body is not an OTLP JSON Export: {exc}") from None
    else:
        try:
            message.ParseFromString(body)
        except (DecodeError, RuntimeError, ValueError) as exc:
            raise BadRequest(400, f"body is not an OTLP protobuf Export: {exc}") from None


def _status_response(status: int, message: str, json_body: bool, **headers: str) -> Response:
    body = status_pb2.Status(code=status, message=message)
    if json_body:
        return Response(json_format.MessageToJson(body), status, headers, media_type=JSON)
    return Response(body.SerializeToString(), status, headers, media_type=PROTOBUF)


def otlp_http_router(ingest: Ingest, max_bytes: int, body_timeout_s: float = 30.0) -> APIRouter:
    """The OTLP/HTTP routes over ``ingest``; bodies above ``max_bytes`` get a 413, bodies that
    have not arrived ``body_timeout_s`` after their headers a 408."""
    router = APIRouter(tags=["otlp"])

    def handle(
        request_body: bytes | None,
        headers: Any,
        make: Callable[[], Message],
        ids: tuple[str, ...],
        export: Callable[[Any], Outcome],
        respond: Callable[[Outcome], Message],
        export_bytes: Callable[[bytes], Outcome] | None = None,
    ) -> Response:
        content_type = headers.get("content-type", PROTOBUF).split(";")[0].strip().lower()
        json_body = content_type == JSON
        if not ingest.authorized(headers.get("authorization")):
            return _status_response(
                401, UNAUTHORIZED, json_body,
                **{"WWW-Authenticate": "Bearer"},
            )  # fmt: skip
        if content_type not in (JSON, PROTOBUF):
            return _status_response(
                415, f"unsupported Content-Type {content_type!r}; use {PROTOBUF} or {JSON}", False
            )
        try:
            if request_body is None:
                raise BadRequest(413, f"body is larger than {max_bytes} bytes")
            body = _read_body(request_body, headers.get("content-encoding", ""), max_bytes)
            # The body as read is held by the route; an inflated copy is held here.
            inflated = len(body) if body is not request_body else 0
            signal = "traces" if export_bytes is not None else "metrics"
            with ingest.holding(inflated, signal):
                if export_bytes is not None and not json_body:
                    try:
                        outcome = export_bytes(body)
                    except MalformedExport as exc:
                        raise BadRequest(
                            400, f"body is not an OTLP protobuf Export: {exc}"
                        ) from None
                else:
                    # Parsed into Python objects (JSON, protobuf classes) while it is mapped.
                    with ingest.holding(len(body) * PARSE_EXPANSION, signal):
                        message = make()
                        _parse(body, json_body, message, ids)
                        outcome = export(message)
        except BadRequest as exc:
            return _status_response(exc.status, str(exc), json_body)
        except Refused as exc:
            retry = str(max(1, math.ceil(exc.retry_after_s)))
            # Shutting down: the client is told to close this connection too, so none is left
            # idle for the server's exit to close under a request the client sends just then.
            close = {} if exc.exhausted else {"Connection": "close"}
            return _status_response(
                429 if exc.exhausted else 503,
                str(exc),
                json_body,
                **{"Retry-After": retry},
                **close,
            )
        reply = respond(outcome)
        if json_body:
            return Response(json_format.MessageToJson(reply), 200, media_type=JSON)
        return Response(reply.SerializeToString(), 200, media_type=PROTOBUF)

    def metric_reply(outcome: Outcome) -> Message:
        reply = metrics_service_pb2.ExportMetricsServiceResponse()
        if outcome.rejected:
            reply.partial_success.rejected_data_points = outcome.rejected
            reply.partial_success.error_message = outcome.message
        return reply

    async def _body(request: Request, held: list[int], signal: str) -> bytes | None:
        """The body, read at most ``max_bytes`` (None: larger) and counted against the memory
        limit as it arrives (``held`` says how much; Refused when it does not fit)."""
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                return None
            if not ingest.memory.reserve(len(chunk)):
                raise ingest.memory_refusal(signal)
            held[0] += len(chunk)
            chunks.append(chunk)
        return b"".join(chunks)

    async def receive(request: Request, signal: str, *args: Any) -> Response:
        from starlette.concurrency import run_in_threadpool

        json_body = request.headers.get("content-type", "").split(";")[0].strip() == JSON
        ingest.last_arrival = time.monotonic()
        # The token before a byte of the body: a peer without it holds nothing of the memory
        # limit, which authenticated Exports share over HTTP and gRPC (issue 44). The unread
        # body ends the connection after the answer.
        if not ingest.authorized(request.headers.get("authorization")):
            return _status_response(401, UNAUTHORIZED, json_body, **{"WWW-Authenticate": "Bearer"})
        declared = request.headers.get("content-length", "")
        # Refused before a byte is read when its declared size does not fit.
        if declared.isdigit() and int(declared) <= max_bytes and not ingest.fits(int(declared)):
            refused = ingest.memory_refusal(signal)
            return _status_response(429, str(refused), json_body, **{"Retry-After": "1"})
        held = [0]
        try:
            try:
                # What a sender was granted is given back if its body does not come in time.
                body = await asyncio.wait_for(_body(request, held, signal), body_timeout_s)
            except Refused as exc:
                return _status_response(429, str(exc), json_body, **{"Retry-After": "1"})
            except TimeoutError:
                message = f"the body did not arrive within {body_timeout_s:g} s of its headers"
                return _status_response(408, message, json_body, Connection="close")
            return await run_in_threadpool(handle, body, request.headers, *args)
        finally:
            ingest.memory.release(held[0])

    @router.post("/v1/traces", response_class=Response)
    async def traces(request: Request) -> Response:
        """OTLP/HTTP trace Export (protobuf or JSON, gzip optional)."""
        return await receive(
            request, "traces", trace_service_pb2.ExportTraceServiceRequest, _SPAN_IDS,
            ingest.export_traces, trace_response, ingest.export_trace_bytes,
        )  # fmt: skip

    @router.post("/v1/metrics", response_class=Response)
    async def metrics(request: Request) -> Response:
        """OTLP/HTTP metrics Export: gauges, sums and (exponential) histograms are stored."""
        return await receive(
            request, "metrics", metrics_service_pb2.ExportMetricsServiceRequest, _METRIC_IDS,
            ingest.export_metrics, metric_reply,
        )  # fmt: skip

    return router


__all__ = ["otlp_http_router"]
