"""The API's errors: every failure a client sees is JSON ``{"error": code, "detail": why}``.

``ApiError`` (status, code, detail) is raised by routes and parameter parsing; the handlers in
``latscope.api.app`` turn it, FastAPI's validation errors and store errors into that shape.

* 400 ``invalid_*`` — a parameter parsed but is unusable (time range, trace id, group key)
* 401 ``unauthorized`` — a token is configured and the request did not carry it
* 404 ``*_not_found`` — the trace, request or route does not exist
* 409 ``several_requests`` — a trace id names a request only when the trace holds one call
* 422 ``invalid_request`` — a parameter failed its declared type or bounds;
  ``trace_too_large`` — the trace holds more spans than ``--max-trace-spans``
* 503 ``store_unavailable`` — ClickHouse did not answer; ``busy``, ``query_timeout`` — the
  answers about one trace are queued or took longer than ``--query-timeout-s``; retry later
"""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException

from latscope.auth import UNAUTHORIZED


class QueryError(Exception):
    """A question latscope cannot answer as asked; REST, gRPC and the CLI each translate it.

    ``status`` is the HTTP status it maps to, ``error`` a stable code, ``detail`` a sentence.
    """

    def __init__(self, status: int, error: str, detail: Any) -> None:
        super().__init__(detail if isinstance(detail, str) else error)
        self.status = status
        self.error = error
        self.detail = detail


class NotFound(QueryError):
    def __init__(self, error: str, detail: str) -> None:
        super().__init__(404, error, detail)


class InvalidParameter(QueryError):
    def __init__(self, error: str, detail: str) -> None:
        super().__init__(400, error, detail)


class ApiError(HTTPException):
    """An HTTP-only error (e.g. 401); ``error`` is a stable code, ``detail`` a sentence."""

    def __init__(self, status: int, error: str, detail: Any) -> None:
        super().__init__(status_code=status, detail=detail)
        self.error = error


#: OpenAPI ``responses=`` fragment describing the error body, for every route.
ERROR_SCHEMA = {
    "type": "object",
    "required": ["error", "detail"],
    "properties": {
        "error": {"type": "string", "description": "stable error code"},
        "detail": {"description": "what went wrong, for a person"},
    },
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI descriptions of the error statuses a route can answer with."""
    texts = {
        400: ("invalid_time", "since must be RFC 3339 or a relative span like 15m, 2h, 7d"),
        401: ("unauthorized", UNAUTHORIZED),
        404: ("trace_not_found", "no spans stored for trace 4bf92f3577b34da6a3ce929d0e0e4736"),
        409: (
            "several_requests",
            "trace 4bf92f3577b34da6a3ce929d0e0e4736 holds 3 inference calls: name one by its "
            "request id (4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7, ...), or list them "
            "all with /v1/traces/4bf92f3577b34da6a3ce929d0e0e4736/requests",
        ),
        422: ("invalid_request", [{"loc": ["query", "limit"], "msg": "less than or equal 1000"}]),
        503: ("store_unavailable", "ClickHouse did not answer"),
    }
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        code, detail = texts[status]
        out[status] = {
            "description": {
                400: "a parameter is unusable",
                401: "token missing or wrong",
                404: "not found",
                409: "a trace id was given for a trace with several calls: name one",
                422: "a parameter failed validation, or (trace_too_large) the trace holds more "
                "spans than --max-trace-spans",
                503: "the store did not answer, or (busy, query_timeout) trace answers are "
                "queued or took longer than --query-timeout-s: retry later",
            }[status],
            "content": {
                "application/json": {
                    "schema": ERROR_SCHEMA,
                    "example": {"error": code, "detail": detail},
                }
            },
        }
    return out
