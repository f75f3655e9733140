"""The REST query API (FastAPI), the web page and the health and metrics endpoints.

Errors are JSON ``{"error": ..., "detail": ...}`` (see ``latscope.api.errors``). With
``settings.token`` set, every ``/v1`` route needs ``Authorization: Bearer <token>``;
``/healthz``, ``/readyz``, ``/metrics`` and the page itself stay open (the page asks for the token
and sends it with its API calls).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from latscope import __version__
from latscope.api.errors import ApiError, QueryError, error_responses
from latscope.api.routes import v1_router
from latscope.api.schemas import Health
from latscope.auth import UNAUTHORIZED, bearer_ok
from latscope.config import Settings
from latscope.metrics import REGISTRY
from latscope.storage import Store, StoreError, StoreOutOfMemory, StoreUnavailable

log = logging.getLogger(__name__)

DESCRIPTION = """Where the time of an AI inference request went.

Every request's end-to-end latency is split into seven buckets that add up to the whole:
`network | queue | preprocess | prefill | decode | postprocess | other`. Times in the JSON are
milliseconds as floats. Time-range parameters (`since`, `until`) accept RFC 3339
(`2026-01-02T15:04:05Z`) or a relative span before now (`15m`, `2h`, `7d`).

Errors are JSON `{"error": code, "detail": why}`: 400 (unusable parameter), 401 (token missing
or wrong, when the server has one), 404 (unknown trace), 409 (a trace id where a request is
meant, for a trace with several inference calls), 422 (parameter out of bounds).
"""


def _error(status: int, error: str, detail: Any) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": error, "detail": detail})


def _add_docs(app: FastAPI) -> None:
    """``/docs``: Swagger UI from the swagger-ui-bundle-v2 package's files, so the page works on
    a machine with no internet (FastAPI's default loads it from a CDN and stays blank offline)."""
    from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
    from fastapi.staticfiles import StaticFiles
    from swagger_ui_bundle import swagger_ui_path

    app.mount("/docs/static", StaticFiles(directory=str(swagger_ui_path)), name="docs-static")

    @app.get("/docs", include_in_schema=False)
    def docs() -> Response:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title="latscope API",
            swagger_js_url="/docs/static/swagger-ui-bundle.js",
            swagger_css_url="/docs/static/swagger-ui.css",
            swagger_favicon_url="/docs/static/favicon-32x32.png",
            oauth2_redirect_url="/docs/oauth2-redirect",
        )

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    def oauth2_redirect() -> Response:
        return get_swagger_ui_oauth2_redirect_html()


def create_app(store: Store, settings: Settings, *, routers: Sequence[APIRouter] = ()) -> FastAPI:
    """The API over ``store``; with ``settings.token`` set, every /v1 route needs it."""
    app = FastAPI(
        title="latscope",
        version=__version__,
        description=DESCRIPTION,
        docs_url=None,  # served by _add_docs from local files, not a CDN
        redoc_url=None,
        openapi_tags=[
            {"name": "requests", "description": "one request: buckets, spans, tokens"},
            {"name": "traces", "description": "a trace: its calls, its run's critical path"},
            {"name": "conversations", "description": "an agent's session across traces"},
            {"name": "aggregates", "description": "many requests: summary, tail, compare, ..."},
            {"name": "health", "description": "liveness, readiness, Prometheus metrics"},
        ],
    )
    _add_docs(app)

    def require_token(request: Request) -> None:
        if not bearer_ok(request.headers.get("authorization"), settings.token):
            raise ApiError(401, "unauthorized", UNAUTHORIZED)

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        response = _error(exc.status_code, exc.error, exc.detail)
        if exc.status_code == 401:
            response.headers["WWW-Authenticate"] = "Bearer"
        return response

    @app.exception_handler(QueryError)
    async def _query_error(_: Request, exc: QueryError) -> JSONResponse:
        return _error(exc.status, exc.error, exc.detail)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        response = _error(
            exc.status_code, "not_found" if exc.status_code == 404 else "http_error", exc.detail
        )
        # Starlette puts what a 405 must carry (Allow, RFC 9110 15.5.6) in the exception.
        response.headers.update(exc.headers or {})
        return response

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        detail = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", "")} for e in exc.errors()]
        return _error(422, "invalid_request", detail)

    @app.exception_handler(StoreUnavailable)
    async def _store_down(_: Request, exc: StoreUnavailable) -> JSONResponse:
        return _error(503, "store_unavailable", str(exc))

    @app.exception_handler(StoreOutOfMemory)
    async def _store_busy(_: Request, exc: StoreOutOfMemory) -> JSONResponse:
        # ClickHouse's memory is taken for now (an insert, a merge, other queries): the same
        # question may pass a moment later.
        log.warning("store out of memory for a query: %s", exc)
        response = _error(
            503, "store_busy",
            "ClickHouse refused the query for its memory limit (MEMORY_LIMIT_EXCEEDED): "
            "retry shortly; if it persists, raise --memory-limit-bytes (the embedded store) "
            f"or the server's limits: {exc}",
        )  # fmt: skip
        response.headers["Retry-After"] = "1"
        return response

    @app.exception_handler(StoreError)
    async def _store_error(_: Request, exc: StoreError) -> JSONResponse:
        log.error("store error: %s", exc)
        return _error(500, "store_error", str(exc))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Logged with its stack here; the client gets JSON without one.
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return _error(500, "internal_error", "the server failed this request; see its log")

    @app.get("/healthz", tags=["health"], response_model=Health)
    def healthz() -> dict[str, str]:
        """Liveness: the process answers. Needs no token."""
        return {"status": "ok"}

    @app.get(
        "/readyz",
        tags=["health"],
        response_model=Health,
        responses=error_responses(503),
    )
    def readyz() -> Any:
        """Readiness: the store answers a query. Needs no token."""
        if not store.ping():
            # Open without a token: the address, never the password.
            return _error(503, "store_unavailable", f"the store {store.safe_dsn} does not answer")
        return {"status": "ready"}

    @app.get(
        "/metrics",
        tags=["health"],
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}},
    )
    def metrics() -> Response:
        """Prometheus text exposition of every latscope metric in this process, including
        ``latscope_request_bucket_seconds`` (per bucket, service and model)."""
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    for router in routers:
        app.include_router(router)
    app.include_router(v1_router(store, settings), dependencies=[Depends(require_token)])

    from latscope.web import mount_web

    mount_web(app)
    return app
