"""Latency objectives: compliance, error budget left, multi-window burn rates and the SRE
workbook's alerts, and where the budget went, bucket by bucket.

>>> got = slo(store, objectives=[Objective("ttft", threshold_ms=500)], now_ns=now)  # doctest: +SKIP
>>> first = got.objectives[0]  # doctest: +SKIP
>>> first.name, first.met, first.burn_rates["5m"], first.budget_by_bucket["window"].dominant
... # doctest: +SKIP
('ttft p99 < 500 ms', True, 0.2, 'queue')
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from latscope.attribution.answers import dimensions, window
from latscope.attribution.answers.common import FILTERS, SETTINGS, query_dicts
from latscope.attribution.answers.errors import AggregateError
from latscope.attribution.answers.models import ObjectiveStatus, Slo
from latscope.attribution.answers.models.base import format_ns
from latscope.sqltext import render
from latscope.storage import Store
from latscope.windows import ALERTS, BURN_WINDOWS_S, FAST_BURN, SLOW_BURN, TICKET_BURN

__all__ = [
    "ALERTS",
    "BURN_WINDOWS_S",
    "FAST_BURN",
    "SLOW_BURN",
    "SLO_METRICS",
    "TICKET_BURN",
    "Objective",
    "burn_rate",
    "slo",
]

#: metric name -> attribution column the objective is on.
SLO_METRICS: dict[str, str] = {
    "e2e": "toFloat64(E2eNs)",
    "ttft": "toFloat64(coalesce(TtftClientNs, TtftServerNs))",
    "tpot": "TpotNs",
}


#: The columns the objectives' values are taken from (``SLO_METRICS``).
SLO_COLUMNS = "Timestamp, E2eNs, TtftClientNs, TtftServerNs, TpotNs"

#: ``$VALUE`` is a whitelisted expression from SLO_METRICS. Requests without the metric (no
#: tokens -> no TTFT) do not count for that objective.
SLO_SQL = f"""
SELECT
    countIf(v IS NOT NULL AND Timestamp >= fromUnixTimestamp64Nano({{window_start:Int64}}))
        AS total,
    countIf(v > {{threshold_ns:Float64}}
            AND Timestamp >= fromUnixTimestamp64Nano({{window_start:Int64}})) AS bad,
    countIf(v IS NOT NULL AND Timestamp >= fromUnixTimestamp64Nano({{s5m:Int64}})) AS total_5m,
    countIf(v > {{threshold_ns:Float64}} AND Timestamp >= fromUnixTimestamp64Nano({{s5m:Int64}}))
        AS bad_5m,
    countIf(v IS NOT NULL AND Timestamp >= fromUnixTimestamp64Nano({{s30m:Int64}})) AS total_30m,
    countIf(v > {{threshold_ns:Float64}} AND Timestamp >= fromUnixTimestamp64Nano({{s30m:Int64}}))
        AS bad_30m,
    countIf(v IS NOT NULL AND Timestamp >= fromUnixTimestamp64Nano({{s1h:Int64}})) AS total_1h,
    countIf(v > {{threshold_ns:Float64}} AND Timestamp >= fromUnixTimestamp64Nano({{s1h:Int64}}))
        AS bad_1h,
    countIf(v IS NOT NULL AND Timestamp >= fromUnixTimestamp64Nano({{s6h:Int64}})) AS total_6h,
    countIf(v > {{threshold_ns:Float64}} AND Timestamp >= fromUnixTimestamp64Nano({{s6h:Int64}}))
        AS bad_6h,
    countIf(v IS NOT NULL AND Timestamp >= fromUnixTimestamp64Nano({{s3d:Int64}})) AS total_3d,
    countIf(v > {{threshold_ns:Float64}} AND Timestamp >= fromUnixTimestamp64Nano({{s3d:Int64}}))
        AS bad_3d
FROM (
    SELECT Timestamp, $VALUE AS v
    FROM ($ROWS)
){SETTINGS}
"""

_H = 3600 * 10**9


@dataclass(frozen=True)
class Objective:
    """A latency objective: ``target`` of requests have ``metric`` at or below ``threshold_ms``.

    >>> Objective("ttft", threshold_ms=500, target=0.99, window_days=30)
    Objective(metric='ttft', threshold_ms=500, target=0.99, window_days=30, name='')
    """

    metric: str  #: "e2e", "ttft" or "tpot"
    threshold_ms: float
    target: float = 0.99  #: fraction of requests that must meet the threshold
    window_days: float = 30  #: the budget's window; 30 days is the SRE workbook's
    name: str = ""

    def validate(self) -> None:
        if self.metric not in SLO_METRICS:
            raise AggregateError(
                f"objective metric {self.metric!r}: use one of {', '.join(SLO_METRICS)}"
            )
        if not 0 < self.target < 1:
            raise AggregateError(f"objective target must be in (0, 1), got {self.target}")
        if self.threshold_ms <= 0 or self.window_days <= 0:
            raise AggregateError("objective threshold_ms and window_days must be positive")


def slo(
    store: Store,
    *,
    objectives: Iterable[Objective | Mapping[str, Any]],
    now_ns: int,
    service: str | None = None,
    model: str | None = None,
    explain: bool = True,
) -> Slo:
    """Error budget left and multi-window burn rates for each objective, as of ``now_ns``.

    A burn rate is the window's bad fraction divided by the budget (1 - target): 1.0 spends the
    budget exactly over the objective's window. ``alerts.fast_burn`` is 1 h and 5 m both above
    FAST_BURN (14.4), ``alerts.slow_burn`` 6 h and 30 m both above SLOW_BURN (6),
    ``alerts.ticket`` 3 d and 6 h both above TICKET_BURN (1; Google SRE workbook). With
    ``explain``, ``budget_by_bucket`` says per window (the objective's, then each burn rate's)
    which bucket the budget went to: the bad requests' extra time over the good ones, by bucket
    (``dimensions.slo_buckets``).
    """
    results = []
    for raw in objectives:
        obj = raw if isinstance(raw, Objective) else Objective(**dict(raw))
        obj.validate()
        window_ns = int(obj.window_days * 24 * _H)
        params = {
            "since_ns": int(now_ns) - window_ns,
            "until_ns": int(now_ns),
            "window_start": int(now_ns) - window_ns,
            **{f"s{w}": int(now_ns) - s * 10**9 for w, s in BURN_WINDOWS_S.items()},
            "threshold_ns": float(obj.threshold_ms) * 1e6,
            "service": service or "",
            "model": model or "",
        }
        spent = None
        if explain:
            # One read gives both: each window's bad and good requests are the burn rates'
            # counts, and their buckets say where the budget went.
            starts = {"window": int(now_ns) - window_ns} | {
                w: int(now_ns) - s * 10**9 for w, s in BURN_WINDOWS_S.items()
            }
            spent = dimensions.slo_buckets(
                store, value_sql=SLO_METRICS[obj.metric], threshold_ms=obj.threshold_ms,
                windows=starts, until_ns=int(now_ns), service=service, model=model,
            )  # fmt: skip
            row = {"total": spent["window"].bad + spent["window"].good, "bad": spent["window"].bad}
            for w in BURN_WINDOWS_S:
                row[f"bad_{w}"] = spent[w].bad
                row[f"total_{w}"] = spent[w].bad + spent[w].good
        else:
            # Hours known clean are read as stored, the others with FINAL (``window``).
            split = window.raw_ranges(store, [(int(now_ns) - window_ns, int(now_ns))])
            rows = window.raw_rows(split, params, SLO_COLUMNS, FILTERS)
            sql = render(SLO_SQL, {"VALUE": SLO_METRICS[obj.metric], "ROWS": rows})
            row = query_dicts(store, sql, params)[0]
        budget = 1 - obj.target
        total, bad = int(row["total"]), int(row["bad"])
        rates = {
            w: burn_rate(int(row[f"bad_{w}"]), int(row[f"total_{w}"]), obj.target)
            for w in BURN_WINDOWS_S
        }
        compliance = (1 - bad / total) if total else None
        budget_left = (1 - (bad / total) / budget) if total else None
        results.append(
            ObjectiveStatus(
                name=obj.name or f"{obj.metric} p{obj.target * 100:g} < {obj.threshold_ms:g} ms",
                metric=obj.metric,
                threshold_ms=obj.threshold_ms,
                target=obj.target,
                window_days=obj.window_days,
                total=total,
                bad=bad,
                compliance=compliance,
                met=None if compliance is None else compliance >= obj.target,
                error_budget=budget,
                budget_left=budget_left,
                burn_rates=rates,
                alerts={
                    name: _above(rates[long], rates[short], limit)
                    for name, (long, short, limit) in ALERTS.items()
                },
                budget_by_bucket=spent,
            )
        )
    return Slo(at=format_ns(now_ns), now_ns=int(now_ns), objectives=results)


def burn_rate(bad: int, total: int, target: float) -> float | None:
    """The window's bad fraction over the error budget (1 - ``target``); None without
    requests. 1.0 spends the budget exactly over the objective's window.

    >>> burn_rate(30, 100, 0.75)
    1.2
    """
    return (bad / total) / (1 - target) if total else None


def _above(long: float | None, short: float | None, limit: float) -> bool:
    return long is not None and short is not None and long > limit and short > limit
