"""The REST query API (FastAPI). Errors are JSON: ``{"error": ..., "detail": ...}``."""

from __future__ import annotations

import hmac
import re
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from latscope import __version__
from latscope.attribution import attribute_trace, load_trace
from latscope.config import Settings
from latscope.metrics import REGISTRY
from latscope.storage import Store, StoreError, StoreUnavailable

_TRACE_ID = re.compile(r"^[0-9a-fA-F]{32}$")


class ApiError(HTTPException):
    def __init__(self, status: int, error: str, detail: str) -> None:
        super().__init__(status_code=status, detail=detail)
        self.error = error


def _error(status: int, error: str, detail: Any) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": error, "detail": detail})


def create_app(store: Store, settings: Settings, *, routers: Sequence[APIRouter] = ()) -> FastAPI:
    """The API over ``store``; with ``settings.token`` set, every /v1 route needs it."""
    app = FastAPI(
        title="latscope",
        version=__version__,
        description="Where the time of an AI inference request went.",
    )

    def require_token(request: Request) -> None:
        if not settings.token:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode(), settings.token.encode()
        ):
            raise ApiError(401, "unauthorized", "send 'Authorization: Bearer <token>'")

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        response = _error(exc.status_code, exc.error, exc.detail)
        if headers:
            response.headers.update(headers)
        return response

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(
            exc.status_code, "not_found" if exc.status_code == 404 else "http_error", exc.detail
        )

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        detail = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", "")} for e in exc.errors()]
        return _error(422, "invalid_request", detail)

    @app.exception_handler(StoreUnavailable)
    async def _store_down(_: Request, exc: StoreUnavailable) -> JSONResponse:
        return _error(503, "store_unavailable", str(exc))

    @app.exception_handler(StoreError)
    async def _store_error(_: Request, exc: StoreError) -> JSONResponse:
        return _error(500, "store_error", str(exc))

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """Liveness: the process answers. Needs no token."""
        return {"status": "ok"}

    @app.get("/metrics", tags=["health"], response_class=Response)
    def metrics() -> Response:
        """Prometheus text exposition of every latscope metric in this process."""
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    for router in routers:
        app.include_router(router)

    @app.get(
        "/v1/requests/{trace_id}/attribution",
        tags=["attribution"],
        dependencies=[Depends(require_token)],
        responses={404: {"description": "no spans stored for this trace id"}},
    )
    def request_attribution(trace_id: str) -> dict[str, Any]:
        """Where one request's end-to-end time went, bucket by bucket (milliseconds)."""
        if not _TRACE_ID.match(trace_id):
            raise ApiError(400, "invalid_trace_id", "trace_id must be 32 hexadecimal characters")
        trace_id = trace_id.lower()
        spans = load_trace(store, trace_id)
        if not spans:
            raise ApiError(404, "trace_not_found", f"no spans stored for trace {trace_id}")
        result = attribute_trace(trace_id, spans)
        if result is None:
            raise ApiError(
                404,
                "no_server_span",
                f"trace {trace_id} has {len(spans)} span(s) but no SERVER span to attribute",
            )
        return result.to_json()

    return app
