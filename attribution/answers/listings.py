"""Lists to browse a window by: its slowest requests, the services and models seen, and GPU
figures per phase.

>>> top = slowest(store, since_ns=t0, until_ns=t1, limit=3).requests  # doctest: +SKIP
>>> top[0].e2e_ms, top[0].buckets_ms.queue  # doctest: +SKIP
(8120.5, 7010.2)
"""

from __future__ import annotations

from typing import Any

from latscope.attribution.answers.common import (
    FROM,
    SETTINGS,
    WHERE,
    bounded,
    ms,
    query_dicts,
    window_params,
)
from latscope.attribution.answers.models import (
    Buckets,
    Gpu,
    GpuFigure,
    ModelCount,
    Services,
    ServiceSeen,
    Slowest,
    SlowRequest,
    Window,
)
from latscope.attribution.model import request_id
from latscope.attribution.table import BUCKET_COLUMN_LIST, BUCKET_COLUMNS
from latscope.storage import Store

__all__ = ["gpu_by_phase", "services", "slowest"]

SLOWEST_SQL = f"""
SELECT TraceId AS trace_id, RequestSpanId AS request_span_id,
       toUnixTimestamp64Nano(Timestamp) AS start_ns,
       ServiceName AS service, Model AS model, Route AS route, StatusCode AS status,
       E2eNs, {BUCKET_COLUMN_LIST},
       coalesce(TtftClientNs, TtftServerNs) AS ttft, TpotNs AS tpot,
       InputTokens AS input_tokens, OutputTokens AS output_tokens, Stalls AS stalls,
       Attempts AS attempts
FROM {FROM}
WHERE {WHERE}
ORDER BY E2eNs DESC, TraceId
LIMIT {{limit:UInt32}}{SETTINGS}
"""


#: Most requests ``slowest`` lists.
MAX_SLOWEST = 1000


def slowest(
    store: Store,
    *,
    since_ns: int,
    until_ns: int,
    service: str | None = None,
    model: str | None = None,
    limit: int = 20,
) -> Slowest:
    """The ``limit`` slowest requests of the window (at most ``MAX_SLOWEST``), each with its
    buckets (ms)."""
    params = window_params(since_ns, until_ns, service, model)
    params["limit"] = bounded(limit, 1, MAX_SLOWEST)
    return Slowest(
        window=Window.of(since_ns, until_ns),
        requests=[
            SlowRequest(
                trace_id=row["trace_id"],
                request_id=request_id(row["trace_id"], row["request_span_id"]),
                start_ns=int(row["start_ns"]),
                service=row["service"],
                model=row["model"],
                route=row["route"],
                status=row["status"],
                e2e_ms=ms(row["E2eNs"]),
                buckets_ms=Buckets(**{b: ms(row[c]) for b, c in BUCKET_COLUMNS.items()}),
                ttft_ms=ms(row["ttft"]),
                tpot_ms=ms(row["tpot"]),
                input_tokens=row["input_tokens"],
                output_tokens=row["output_tokens"],
                stalls=row["stalls"],
                attempts=row["attempts"],
            )
            for row in query_dicts(store, SLOWEST_SQL, params)
        ],
    )


SERVICES_SQL = f"""
SELECT ServiceName AS service, Model AS model, count() AS n,
       toUnixTimestamp64Nano(max(Timestamp)) AS last_ns
FROM {FROM}
WHERE {WHERE}
GROUP BY service, model
ORDER BY service, n DESC, model{SETTINGS}
"""


def services(store: Store, *, since_ns: int, until_ns: int) -> Services:
    """Services seen in the window, each with its models and request counts."""
    params = window_params(since_ns, until_ns, None, None)
    by_service: dict[str, list[dict[str, Any]]] = {}
    for row in query_dicts(store, SERVICES_SQL, params):  # by service, then most requests
        by_service.setdefault(row["service"], []).append(row)
    return Services(
        window=Window.of(since_ns, until_ns),
        services=[
            ServiceSeen(
                service=service,
                count=sum(int(row["n"]) for row in rows),
                last_ns=max(int(row["last_ns"]) for row in rows),
                models=[ModelCount(model=row["model"], count=int(row["n"])) for row in rows],
            )
            for service, rows in by_service.items()
        ],
    )


#: GPU figures are stored as ``Gpu['<phase>.<figure>']`` (e.g. ``decode.energy_mj``).
GPU_SQL = f"""
SELECT splitByChar('.', key)[1] AS phase, substring(key, position(key, '.') + 1) AS figure,
       count() AS n, avg(value) AS mean, max(value) AS max, sum(value) AS total
FROM {FROM}
ARRAY JOIN mapKeys(Gpu) AS key, mapValues(Gpu) AS value
WHERE {WHERE}
GROUP BY phase, figure
ORDER BY phase, figure{SETTINGS}
"""


def gpu_by_phase(
    store: Store,
    *,
    since_ns: int,
    until_ns: int,
    service: str | None = None,
    model: str | None = None,
) -> Gpu:
    """GPU figures per phase: ``{"phases": {phase: {figure: {"mean", "max", "total", "n"}}}}``.

    Figures: utilization_mean / utilization_max (%), memory_used_max (bytes), power_mean (W),
    sm_clock (MHz), energy_mj (mJ; ``total`` is the window's energy in that phase).
    """
    params = window_params(since_ns, until_ns, service, model)
    phases: dict[str, dict[str, GpuFigure]] = {}
    for row in query_dicts(store, GPU_SQL, params):
        phases.setdefault(row["phase"], {})[row["figure"]] = GpuFigure(
            mean=row["mean"], max=row["max"], total=row["total"], n=int(row["n"])
        )
    return Gpu(phases=phases, window=Window.of(since_ns, until_ns))
