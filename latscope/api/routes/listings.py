"""The ``/v1`` routes that list: GPU figures, services, the requests export, the slowest."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from latscope.api import queries as aggregates
from latscope.api.routes.params import MANY, PARQUET, Model, Service, Since, Until, served
from latscope.api.schemas import (
    Gpu,
    Services,
    Slowest,
)
from latscope.attribution.aggregates import MAX_SLOWEST
from latscope.config import Settings
from latscope.storage import Store


def add_listing_routes(router: APIRouter, store: Store, settings: Settings) -> None:
    """GPU figures per phase, the services seen, the requests as Parquet, the slowest requests."""

    @router.get("/gpu", tags=["aggregates"], response_model=Gpu, responses=MANY)
    def gpu(
        since: Since = None, until: Until = None, service: Service = None, model: Model = None
    ) -> Response:
        """GPU figures per phase over the window (from the NVML samples on phase spans)."""
        return served(aggregates.gpu(store, since=since, until=until, service=service, model=model))

    @router.get("/services", tags=["aggregates"], response_model=Services, responses=MANY)
    def services(since: Since = None, until: Until = None) -> Response:
        """The services and models seen in the window, with request counts."""
        return served(aggregates.services(store, since=since, until=until))

    @router.get(
        "/export/requests",
        tags=["aggregates"],
        response_class=Response,
        responses={
            **MANY,
            200: {
                "description": "a Parquet file, one row per attributed request (the "
                "attribution table's columns); `X-Latscope-Rows` says how many, "
                "`X-Latscope-Truncated: true` that the limit cut the window short",
                "content": {PARQUET: {"schema": {"type": "string", "format": "binary"}}},
            },
        },
    )
    def export_requests(
        since: Since = None,
        until: Until = None,
        service: Service = None,
        model: Model = None,
        limit: Annotated[
            int,
            Query(
                description="most requests, oldest first",
                ge=1,
                le=aggregates.MAX_EXPORT,
            ),
        ] = aggregates.MAX_EXPORT,
    ) -> Response:
        """The window's attributed requests as Parquet, for offline analysis (polars, pandas,
        DuckDB); ``latscope export --parquet FILE`` writes the same file."""
        body, rows = aggregates.export_requests(
            store, since=since, until=until, service=service, model=model, limit=limit
        )
        headers = {"X-Latscope-Rows": str(rows)}
        if rows >= limit:
            headers["X-Latscope-Truncated"] = "true"
        return Response(body, media_type=PARQUET, headers=headers)

    @router.get("/requests", tags=["aggregates"], response_model=Slowest, responses=MANY)
    def slowest(
        since: Since = None,
        until: Until = None,
        service: Service = None,
        model: Model = None,
        limit: Annotated[
            int, Query(description="how many, slowest first", ge=1, le=MAX_SLOWEST)
        ] = 20,
    ) -> Response:
        """The slowest requests of the window, slowest first, each with its buckets."""
        return served(
            aggregates.slowest(
                store, since=since, until=until, service=service, model=model, limit=limit
            )
        )
