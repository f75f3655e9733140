"""The ``/v1`` routes about a window's latency budget: summary, tail, compare, diagnose, slo."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from latscope.api import queries as aggregates
from latscope.api.routes.params import (
    MANY,
    OBJECTIVE_PATTERN,
    Exact,
    Model,
    Percentile,
    Service,
    Since,
    Until,
    served,
    time_query,
)
from latscope.api.schemas import (
    Compare,
    Diagnosis,
    Slo,
    Summary,
    Tail,
)
from latscope.attribution.aggregates import MAX_GROUPS
from latscope.config import Settings
from latscope.storage import Store


def add_budget_routes(router: APIRouter, store: Store, settings: Settings) -> None:
    """The latency budget of a window, its tail, two windows compared, the diagnosis, objectives."""

    @router.get("/attribution/summary", tags=["aggregates"], response_model=Summary, responses=MANY)
    def summary(
        since: Since = None,
        until: Until = None,
        service: Service = None,
        model: Model = None,
        group_by: Annotated[
            str | None,
            Query(
                description="also per group: service, model, route, operation, status or "
                "resource.<attribute> (e.g. resource.k8s.pod.name)",
                max_length=160,
                examples=["model"],
            ),
        ] = None,
        limit_groups: Annotated[
            int, Query(description="at most this many groups, largest first", ge=1, le=MAX_GROUPS)
        ] = 100,
        exact: Exact = False,
    ) -> Response:
        """Count, percentiles of e2e and of each bucket, and each bucket's share of the time."""
        return served(
            aggregates.summary(
                store,
                since=since,
                until=until,
                service=service,
                model=model,
                group_by=group_by,
                limit_groups=limit_groups,
                exact=exact,
            )
        )

    @router.get("/attribution/tail", tags=["aggregates"], response_model=Tail, responses=MANY)
    def tail(
        since: Since = None,
        until: Until = None,
        service: Service = None,
        model: Model = None,
        percentile: Percentile = 99,
        exact: Exact = False,
    ) -> Response:
        """Which bucket the slowest requests spend their extra time in, against the median."""
        return served(
            aggregates.tail(
                store,
                since=since,
                until=until,
                service=service,
                model=model,
                percentile=percentile,
                exact=exact,
            )
        )

    @router.get("/attribution/compare", tags=["aggregates"], response_model=Compare, responses=MANY)
    def compare(
        after_since: Annotated[
            str | None, time_query("start of the window under study (default 1h)", "1h")
        ] = None,
        after_until: Annotated[
            str | None, time_query("end of the window under study (default now)", "5m")
        ] = None,
        before_since: Annotated[
            str | None,
            time_query("start of the baseline (default: the same length just before)", "25h"),
        ] = None,
        before_until: Annotated[str | None, time_query("end of the baseline", "24h")] = None,
        service: Service = None,
        model: Model = None,
        exact: Exact = False,
    ) -> Response:
        """Two windows (e.g. before and after a deploy) bucket by bucket; the biggest mover."""
        return served(
            aggregates.compare(
                store,
                before_since=before_since,
                before_until=before_until,
                after_since=after_since,
                after_until=after_until,
                service=service,
                model=model,
                exact=exact,
            )
        )

    @router.get(
        "/attribution/diagnose", tags=["aggregates"], response_model=Diagnosis, responses=MANY
    )
    def diagnose(
        since: Since = None,
        until: Until = None,
        service: Service = None,
        model: Model = None,
        percentile: Percentile = 99,
    ) -> Response:
        """The dominant bucket, the usual cause and first fixes, with the numbers behind each."""
        return served(
            aggregates.diagnose(
                store,
                since=since,
                until=until,
                service=service,
                model=model,
                percentile=percentile,
                warmup_requests=settings.warmup_requests,
                warmup_s=settings.warmup_s,
            )
        )

    @router.get("/slo", tags=["aggregates"], response_model=Slo, responses=MANY)
    def slo(
        objective: Annotated[
            list[str] | None,
            Query(
                description="METRIC:THRESHOLD_MS:TARGET[:WINDOW_DAYS], metric e2e, ttft or "
                "tpot; repeat for several (default: "
                + ", ".join(aggregates.DEFAULT_OBJECTIVES)
                + ")",
                max_length=20,
                examples=[["ttft:500:0.99:30"]],
                json_schema_extra={"items": {"type": "string", "pattern": OBJECTIVE_PATTERN}},
            ),
        ] = None,
        at: Annotated[
            str | None, time_query("evaluate as of (default now)", "2026-01-02T15:00:00Z")
        ] = None,
        service: Service = None,
        model: Model = None,
    ) -> Response:
        """Error budget left and burn rates (5m, 30m, 1h, 6h, 3d) per objective, with the
        fast-burn (14.4x), slow-burn (6x) and ticket (1x) alerts of the SRE workbook."""
        return served(
            aggregates.slo(store, objective=objective, at=at, service=service, model=model)
        )
