"""Where one request stands among its peers: its percentile rank within its service and model
over the hour before it started, for the end-to-end time, each bucket, TTFT and TPOT.

"Is this one slow?" then has an answer beside the numbers: a request at the 99th percentile of
e2e whose queue sits at the 50th was slow for another reason than waiting.

>>> standing(store, service="llm", model="llama", start_ns=t, values={"e2e": 2.1e9, ...},
...          request=("4bf9...", "00f0..."))  # doctest: +SKIP
Standing(since=..., until=..., peers=812, percentiles=FigurePercentiles(e2e=97.4, ...))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from latscope.attribution.answers.common import FROM, SETTINGS, query_dicts
from latscope.attribution.answers.models import FigurePercentiles, Standing, format_ns
from latscope.attribution.answers.slo import SLO_METRICS
from latscope.attribution.table import BUCKET_COLUMNS
from latscope.sqltext import render
from latscope.storage import Store

__all__ = ["STANDING_FIGURES", "STANDING_WINDOW_NS", "standing"]

#: The peers: the requests of the same service and model that started in this long before it.
STANDING_WINDOW_NS = 3600 * 10**9
#: figure -> the attribution column (or expression) it is read from, in ns.
STANDING_FIGURES: dict[str, str] = {
    "e2e": SLO_METRICS["e2e"],
    **{bucket: f"toFloat64({column})" for bucket, column in BUCKET_COLUMNS.items()},
    "ttft": SLO_METRICS["ttft"],
    "tpot": SLO_METRICS["tpot"],
}

#: Per figure: the peers that have it, those below the request's value and those equal to it.
#: ``$COUNTS`` is rendered from STANDING_FIGURES; the values are bound parameters.
STANDING_SQL = f"""
SELECT count() AS peers$COUNTS
FROM {FROM}
WHERE ServiceName = {{service:String}} AND Model = {{model:String}}
  AND Timestamp >= fromUnixTimestamp64Nano({{since_ns:Int64}})
  AND Timestamp < fromUnixTimestamp64Nano({{until_ns:Int64}})
  AND NOT (TraceId = {{trace_id:String}} AND RequestSpanId = {{span_id:String}}){SETTINGS}
"""


def _counts() -> str:
    parts = []
    for name, expr in STANDING_FIGURES.items():
        parts.append(
            f",\n    countIf({expr} IS NOT NULL) AS n_{name}"
            f",\n    countIf({expr} < {{v_{name}:Float64}}) AS below_{name}"
            f",\n    countIf({expr} = {{v_{name}:Float64}}) AS equal_{name}"
        )
    return "".join(parts)


_SQL = render(STANDING_SQL, {"COUNTS": _counts()})


def standing(
    store: Store,
    *,
    service: str,
    model: str,
    start_ns: int,
    values: Mapping[str, float | None],
    request: tuple[str, str] = ("", ""),
    window_ns: int = STANDING_WINDOW_NS,
) -> Standing:
    """The percentile rank (0-100) of each of ``values`` (figure -> ns; None: the request has
    none) among the requests of ``service`` and ``model`` that started in the ``window_ns``
    before ``start_ns``, ``request`` (trace id, span id) left out. Rank = the peers below plus
    half of those equal, over the peers that have the figure; None without peers or value."""
    params: dict[str, Any] = {
        "service": service,
        "model": model,
        "since_ns": int(start_ns) - int(window_ns),
        "until_ns": int(start_ns),
        "trace_id": request[0],
        "span_id": request[1],
    }
    for name in STANDING_FIGURES:
        value = values.get(name)
        # A figure the request lacks still binds a number; its rank is None below.
        params[f"v_{name}"] = float(value) if value is not None else 0.0
    row = query_dicts(store, _SQL, params)[0]
    percentiles: dict[str, float | None] = {}
    for name in STANDING_FIGURES:
        n = int(row[f"n_{name}"])
        if values.get(name) is None or not n:
            percentiles[name] = None
            continue
        rank = int(row[f"below_{name}"]) + int(row[f"equal_{name}"]) / 2
        percentiles[name] = 100.0 * rank / n
    return Standing(
        since=format_ns(params["since_ns"]),
        until=format_ns(params["until_ns"]),
        peers=int(row["peers"]),
        percentiles=FigurePercentiles(**percentiles),
    )
