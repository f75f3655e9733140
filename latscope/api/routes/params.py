"""What the ``/v1`` routes share: their parameters (documented in the OpenAPI document, with
their patterns), the error responses they declare, and how an answer is served."""

from __future__ import annotations

import zlib
from typing import Annotated, Any

from fastapi import Path, Query
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from latscope.api import trace
from latscope.api.errors import error_responses
from latscope.api.schemas import (
    REQUEST_ID_EXAMPLE,
    TRACE_ID_EXAMPLE,
    Answer,
)
from latscope.api.timerange import TIME_PATTERN
from latscope.api.trace_state import gzip_kept, json_of, keep_gzip

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
SpanId = Annotated[
    str,
    Path(
        description="16 hexadecimal characters (W3C span id)",
        examples=["00f067aa0ba902b7"],
        max_length=32,
        json_schema_extra={"pattern": trace.SPAN_ID_PATTERN},
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


def time_query(description: str, example: str) -> Any:
    return Query(
        description=f"{description}: {_TIME_HELP}",
        max_length=64,
        examples=[example],
        json_schema_extra={"pattern": TIME_PATTERN},
    )


Since = Annotated[
    str | None, time_query("start of the window (default: 1 hour before until)", "2h")
]
Until = Annotated[str | None, time_query("end of the window (default: now)", "5m")]
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
KEYS_PATTERN = r"^[A-Za-z0-9_.\-/]{1,128}$"


#: An answer's JSON of this many bytes or more goes gzip-compressed to a client that accepts it.
GZIP_MIN_BYTES = 64 << 10
#: The most bytes of an answer handed to the HTTP server at once (``AnswerResponse``).
BODY_CHUNK = 256 << 10
#: An answer's JSON is compressed this many bytes at a time, each piece sent as it is compressed.
GZIP_PIECE = 1 << 20
#: gzip's cheapest level: a 19,801-span trace view goes from 16.6 MB to 1.2 MB in 37 ms of CPU.
GZIP_LEVEL = 1


def _accepts_gzip(scope: Scope) -> bool:
    """Whether the request's Accept-Encoding takes gzip (or ``*``) with a non-zero quality."""
    for key, value in scope.get("headers", ()):
        if key != b"accept-encoding":
            continue
        for item in value.decode("latin-1").split(","):
            name, _, params = item.partition(";")
            if name.strip().lower() not in ("gzip", "*"):
                continue
            quality = params.strip().lower()
            if not quality.startswith("q="):
                return True
            try:
                if float(quality[2:]) > 0:
                    return True
            except ValueError:  # a malformed weight: the coding is not taken
                continue
    return False


class AnswerResponse(Response):
    """An answer's JSON, gzip-compressed when it is large and the client accepts gzip (httpx and
    browsers do; curl with ``--compressed``). A wide trace's answers run to megabytes, and the
    HTTP server copies every byte it writes while holding the GIL that the gRPC handlers
    acknowledging Exports need: compressed, a 19,801-span trace view is 1.2 MB instead of 16.6.

    The first asker of an answer gets it compressed as it goes (``_send_compressing``): a piece
    of ``GZIP_PIECE`` bytes at a time, in zlib in a worker thread without the GIL, each sent
    before the next is compressed, so the client reads and inflates one while the server
    compresses the next (a 28 MB trace view carrying prompts takes 127 ms to compress and 54 to
    inflate). Without a length: the body goes in HTTP/1.1's chunked encoding. What it sent is
    kept with a shared answer's state (``trace_state.keep_gzip``) and its next askers get it
    whole, with its length. Every body goes to the server in pieces of at most ``BODY_CHUNK``
    bytes: the server waits for the socket to drain between them, so each is written as it goes
    instead of the whole answer being copied into the transport's buffer (and, under h11, into
    its framing) at once while the GIL is held."""

    media_type = "application/json"

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        super().__init__(json_of(answer), headers={"Vary": "Accept-Encoding"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if len(self.body) >= GZIP_MIN_BYTES and _accepts_gzip(scope):
            packed = gzip_kept(self.answer)
            if packed is None:
                await self._send_compressing(send)
                return
            self.body = packed
            self._gzip_headers(len(packed))
        await self._start(send)
        await _send_body(send, self.body, last=True)

    def _gzip_headers(self, length: int | None) -> None:
        """The headers of the answer sent gzip-compressed in ``length`` bytes (None: a length
        not known when they are sent)."""
        headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        headers.append((b"content-encoding", b"gzip"))
        if length is not None:
            headers.append((b"content-length", str(length).encode()))
        self.raw_headers = headers

    async def _start(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})  # fmt: skip

    async def _send_compressing(self, send: Send) -> None:
        """The answer gzip-compressed a piece at a time, each sent as it is compressed; then what
        was sent kept for the next askers (``trace_state.keep_gzip``)."""
        self._gzip_headers(None)
        await self._start(send)
        deflate = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        text = memoryview(self.body)
        sent = []
        for at in range(0, len(text), GZIP_PIECE):
            last = at + GZIP_PIECE >= len(text)
            piece = await run_in_threadpool(_deflate, deflate, text[at : at + GZIP_PIECE], last)
            sent.append(piece)
            if piece or last:
                await _send_body(send, piece, last=last)
        keep_gzip(self.answer, b"".join(sent))


def _deflate(deflate: Any, piece: memoryview, last: bool) -> bytes:
    """``piece`` through the gzip stream ``deflate``; its end too when ``last``."""
    out = deflate.compress(piece)
    return out + deflate.flush() if last else out


async def _send_body(send: Send, body: bytes | memoryview, *, last: bool) -> None:
    """``body`` to the server in pieces of at most ``BODY_CHUNK`` bytes; the response's end with
    the last piece when ``last``."""
    for at in range(0, max(len(body), 1), BODY_CHUNK):
        more = not last or at + BODY_CHUNK < len(body)
        await send({"type": "http.response.body", "body": body[at : at + BODY_CHUNK],
                    "more_body": more})  # fmt: skip


def served(answer: Answer) -> Response:
    """The answer's JSON (``AnswerResponse``). The answering function built and checked the
    model; ``response_model`` documents it (returning the model itself would have FastAPI
    validate it a second time). Written by pydantic's serializer straight to bytes: a wide
    trace's answer is tens of thousands of rows, and a dict of them dumped again by ``json``
    costs as much once more; a trace's answers, shared by their askers, are written once
    (``trace_state.json_of``)."""
    return AnswerResponse(answer)


ONE = error_responses(400, 401, 404, 422, 503)
REQUEST = error_responses(400, 401, 404, 409, 422, 503)
MANY = error_responses(400, 401, 422, 503)
#: Parquet's media type (registered with IANA in 2024).
PARQUET = "application/vnd.apache.parquet"
