"""The ``/v1`` routes, one module per family of answers. Each route validates its parameters,
then calls the function that answers the question (``latscope.api.trace`` for one request,
``latscope.api.queries`` for many) and serves the answer's model; those functions are shared with
the gRPC service and the CLI's direct mode.

=================  =============================================================================
``params``         the parameters the routes share, their error responses, serving an answer
``traces``         one request, one trace, the live feed
``budget``         summary, tail, compare, diagnose, slo
``overtime``       timeseries, heatmap, why, coldstart
``listings``       gpu, services, the requests export, the slowest requests
``conversations``  conversations across traces
=================  =============================================================================
"""

from __future__ import annotations

from fastapi import APIRouter

from latscope.api.routes.budget import add_budget_routes
from latscope.api.routes.conversations import add_conversation_routes
from latscope.api.routes.listings import add_listing_routes
from latscope.api.routes.overtime import add_overtime_routes
from latscope.api.routes.traces import add_trace_routes
from latscope.config import Settings
from latscope.storage import Store


def v1_router(store: Store, settings: Settings) -> APIRouter:
    """Every ``/v1`` route over ``store`` (the caller adds the token check), in the order the
    OpenAPI document lists them."""
    router = APIRouter(prefix="/v1")
    add_trace_routes(router, store, settings)
    add_budget_routes(router, store, settings)
    add_overtime_routes(router, store, settings)
    add_listing_routes(router, store, settings)
    add_conversation_routes(router, store, settings)
    return router
