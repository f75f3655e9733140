"""The ``/v1`` routes over time and about what is different: timeseries, heatmap, why,
coldstart."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from latscope.api import queries as aggregates
from latscope.api.errors import InvalidParameter
from latscope.api.routes.params import (
    KEYS_PATTERN,
    MANY,
    Metric,
    Model,
    Percentile,
    Service,
    Since,
    Step,
    Until,
    served,
    time_query,
)
from latscope.api.schemas import (
    ColdStart,
    Heatmap,
    Timeseries,
    Why,
)
from latscope.attribution.aggregates import MAX_EXAMPLES, MAX_SERIES, MAX_VALUES
from latscope.config import Settings
from latscope.storage import Store


def add_overtime_routes(router: APIRouter, store: Store, settings: Settings) -> None:
    """Figures per time step, the heatmap, what is different (why), cold starts."""

    @router.get(
        "/attribution/timeseries", tags=["aggregates"], response_model=Timeseries, responses=MANY
    )
    def timeseries(
        since: Since = None,
        until: Until = None,
        service: Service = None,
        model: Model = None,
        step: Step = None,
        group_by: Annotated[
            str | None,
            Query(
                description="also a series per group: service, model, route, operation, status "
                "or resource.<attribute>",
                max_length=160,
                examples=["model"],
            ),
        ] = None,
        limit_groups: Annotated[
            int, Query(description="at most this many groups, largest first", ge=1, le=MAX_SERIES)
        ] = 10,
    ) -> Response:
        """Since when: percentiles, means and shares of every bucket, TTFT and TPOT per step."""
        return served(
            aggregates.timeseries(
                store,
                since=since,
                until=until,
                service=service,
                model=model,
                step=step,
                group_by=group_by,
                limit_groups=limit_groups,
            )
        )

    @router.get("/attribution/heatmap", tags=["aggregates"], response_model=Heatmap, responses=MANY)
    def heatmap(
        since: Since = None,
        until: Until = None,
        service: Service = None,
        model: Model = None,
        step: Step = None,
        metric: Metric = "e2e",
        bins_per_decade: Annotated[
            int,
            Query(description="latency bins per factor of ten: 5, 10, 20 or 46", examples=[10]),
        ] = 10,
    ) -> Response:
        """Requests per time step and log-scaled latency bin of e2e (or a bucket, TTFT, TPOT)."""
        return served(
            aggregates.heatmap(
                store,
                since=since,
                until=until,
                service=service,
                model=model,
                step=step,
                metric=metric,
                bins_per_decade=bins_per_decade,
            )
        )

    @router.get("/attribution/why", tags=["aggregates"], response_model=Why, responses=MANY)
    def why(
        since: Since = None,
        until: Until = None,
        service: Service = None,
        model: Model = None,
        selection: Annotated[
            str,
            Query(
                description="which requests: percentile (metric at or above the percentile), "
                "region (a heatmap rectangle: sel_since..sel_until, min_ms..max_ms), slo (an "
                "objective's bad requests) or before (the window against the one before it)",
                pattern="^(percentile|region|slo|before)$",
                examples=["percentile"],
            ),
        ] = "percentile",
        metric: Metric = "e2e",
        percentile: Percentile = 99,
        objective: Annotated[
            str | None,
            Query(
                description="for selection=slo: METRIC:THRESHOLD_MS (e.g. ttft:500)",
                max_length=64,
                examples=["ttft:500"],
            ),
        ] = None,
        sel_since: Annotated[
            str | None, time_query("for selection=region: start of the region", "30m")
        ] = None,
        sel_until: Annotated[
            str | None, time_query("for selection=region: end of the region", "10m")
        ] = None,
        min_ms: Annotated[
            float | None,
            Query(description="for selection=region: metric at least this (ms)", ge=0, le=1e9),
        ] = None,
        max_ms: Annotated[
            float | None,
            Query(description="for selection=region: metric below this (ms)", gt=0, le=1e9),
        ] = None,
        resource: Annotated[
            list[str] | None,
            Query(
                description="more resource attributes to rank (repeat), beside "
                "service.instance.id, k8s.pod.name, k8s.node.name, host.name, "
                "cloud.availability_zone, cloud.region, service.version",
                max_length=16,
                examples=[["k8s.deployment.name"]],
            ),
        ] = None,
        attribute: Annotated[
            list[str] | None,
            Query(
                description="span attributes to rank (repeat), e.g. a tenant id: the value on "
                "any span of the request's trace",
                max_length=16,
                examples=[["tenant.id"]],
            ),
        ] = None,
        limit_values: Annotated[
            int, Query(description="values listed per dimension", ge=1, le=MAX_VALUES)
        ] = 5,
        examples: Annotated[
            int, Query(description="slowest selected requests listed", ge=0, le=MAX_EXAMPLES)
        ] = 5,
    ) -> Response:
        """What is different about these requests: every dimension ranked by how differently
        its values are spread inside the selection and outside, and each top value's extra
        time split into the seven buckets (they add up)."""
        for key in [*(resource or []), *(attribute or [])]:
            if not re.match(KEYS_PATTERN, key):
                raise InvalidParameter(
                    "invalid_parameter",
                    f"attribute key {key!r}: letters, digits and . _ - / only, at most 128",
                )
        return served(
            aggregates.why(
                store,
                since=since,
                until=until,
                service=service,
                model=model,
                selection=selection,
                metric=metric,
                percentile=percentile,
                objective=objective,
                sel_since=sel_since,
                sel_until=sel_until,
                min_ms=min_ms,
                max_ms=max_ms,
                resource=resource,
                attribute=attribute,
                limit_values=limit_values,
                examples=examples,
            )
        )

    @router.get(
        "/attribution/coldstart", tags=["aggregates"], response_model=ColdStart, responses=MANY
    )
    def coldstart(
        since: Since = None,
        until: Until = None,
        service: Service = None,
        model: Model = None,
        warmup_requests: Annotated[
            int | None,
            Query(
                description="a new replica warms up for its first N requests (default: the "
                "server's --warmup-requests; 0: off)",
                ge=0,
                le=10_000,
            ),
        ] = None,
        warmup_s: Annotated[
            float | None,
            Query(
                description="...and its first S seconds (default: --warmup-s; 0: off)",
                ge=0,
                le=86_400,
            ),
        ] = None,
        lookback_s: Annotated[
            float,
            Query(description="look for replicas this long before the window", gt=300, le=604_800),
        ] = 3600,
    ) -> Response:
        """Cold starts and scale-up lag: replicas that appeared, their warm-up requests, and
        warm-up against warm latency bucket by bucket."""
        return served(
            aggregates.coldstart(
                store,
                since=since,
                until=until,
                service=service,
                model=model,
                warmup_requests=settings.warmup_requests
                if warmup_requests is None
                else warmup_requests,
                warmup_s=settings.warmup_s if warmup_s is None else warmup_s,
                lookback_s=lookback_s,
            )
        )
