"""The latency budget of a window: count, e2e and per-bucket percentiles, means and shares, and
the streaming figures, for the whole window and per group.

Without ``exact`` the hours wholly inside the window come from the hourly rollup where it is up to
date and only the rest is read raw (``window.plan_windows``): the same answer, from a few thousand
rollup rows instead of millions of requests, percentiles within 0.5 % (``figures.EXACT_QUANTILES``).

>>> got = summary(store, since_ns=t0, until_ns=t1, group_by="model")  # doctest: +SKIP
>>> got.count, got.e2e_ms.p99, got.buckets_ms["queue"].share, got.groups[0].key  # doctest: +SKIP
(1200, 2210.4, 0.31, 'llama-3-8b')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from latscope.attribution import rollups
from latscope.attribution.answers.common import (
    FROM,
    RAW_WHERE,
    SETTINGS,
    WHERE,
    bounded,
    filters,
    query_dicts,
    window_params,
)
from latscope.attribution.answers.figures import (
    METRIC_LEVELS,
    row_stats,
    stat_columns,
    stats_or_empty,
)
from latscope.attribution.answers.groups import group_expr
from latscope.attribution.answers.models import Summary, SummaryGroup, Window
from latscope.attribution.answers.window import PlannedWindow, plan_windows, planned_sources
from latscope.attribution.rollups import ROLLUP_TABLE
from latscope.attribution.table import BUCKET_COLUMNS
from latscope.sqltext import render
from latscope.storage import Store

__all__ = ["approx_summary", "summary"]

#: The whole window in one row, every value read (``exact=True``).
SUMMARY_SQL = f"SELECT\n    {stat_columns()}\nFROM {FROM}\nWHERE {WHERE}{SETTINGS}"

#: One row per group (``exact=True``); ``$GROUP`` is a whitelisted expression
#: (``groups.group_expr``), never input.
SUMMARY_GROUPED_SQL = (
    f"SELECT\n    $GROUP AS grp,\n    {stat_columns()}\nFROM {FROM}\n"
    f"WHERE {WHERE}\nGROUP BY grp\nORDER BY n DESC, grp\nLIMIT {{limit:UInt32}}{SETTINGS}"
)

#: Counts, sums and means over rollup rows and raw rows alike (``$SOURCES``: a UNION ALL of
#: SELECTs giving ``grp`` and the rollup's columns), per ``$SETS`` (``grp``, or grouping sets of
#: every group and the whole window, told apart by ``$TOTAL``).
APPROX_SUMMARY_SQL = (
    """
SELECT grp, $TOTAL AS total,
    sum(Requests) AS n, sum(WithClient) AS with_client,
    sum(E2eSum) AS e2e_sum, e2e_sum / n AS e2e_mean,
    sum(NetworkSum) AS network_sum, network_sum / sum(NetworkCount) AS network_mean,
"""
    + "".join(
        f"    sum({rollups.BUCKET_SUMS[b]}) AS {b}_sum, {b}_sum / n AS {b}_mean,\n"
        for b in BUCKET_COLUMNS
        if b != "network"
    )
    + """    sum(TtftSum) / sum(TtftCount) AS ttft_mean, sum(TpotSum) / sum(TpotCount) AS tpot_mean,
    max(ItlMax) AS itl_max, sum(StallsSum) AS stalls, sum(StalledRequests) AS stalled_requests
FROM ($SOURCES)
GROUP BY $SETS"""
    + SETTINGS
    + ", force_grouping_standard_compatibility = 1"
)

#: The same sources' histograms: bin counts per group (and total) and key (metric * 4096 + bin).
APPROX_HIST_SQL = (
    """
SELECT grp, $TOTAL AS total, key, sum(c) AS c
FROM ($SOURCES)
GROUP BY $SETS$HAVING
ORDER BY total, grp, key"""
    + SETTINGS
    + ", force_grouping_standard_compatibility = 1"
)
_HAVING_GROUPS = "\nHAVING total = 1 OR grp IN {groups:Array(String)}"

_ROLLUP_SCALARS = (
    f"SELECT $GROUP AS grp, {', '.join(rollups.SCALAR_COLUMNS)} "
    f"FROM {ROLLUP_TABLE} WHERE $ROLLUP_WHERE"
)
#: Raw reads, by whether ``$GROUP`` is a literal (the whole window, or a window's index in
#: ``compare``): a literal stays out of the aggregation's keys, where a constant string costs a
#: third more over millions of rows.
_RAW_SCALARS = {
    False: (
        f"SELECT $GROUP AS grp, {rollups.SCALARS_SQL} FROM {FROM} WHERE {RAW_WHERE} GROUP BY grp"
    ),
    True: f"SELECT $GROUP AS grp, {rollups.SCALARS_SQL} FROM {FROM} WHERE {RAW_WHERE}",
}
_ROLLUP_HIST = (
    f"SELECT $GROUP AS grp, key, c FROM {ROLLUP_TABLE} "
    "ARRAY JOIN HistKeys AS key, HistCounts AS c WHERE $ROLLUP_WHERE"
)
_RAW_HIST = {
    False: (
        f"SELECT grp, key, count() AS c FROM (SELECT $GROUP AS grp, {rollups.HIST_KEYS_SQL} "
        f"AS keys FROM {FROM} WHERE {RAW_WHERE}) ARRAY JOIN keys AS key GROUP BY grp, key"
    ),
    True: (
        f"SELECT $GROUP AS grp, key, count() AS c FROM (SELECT {rollups.HIST_KEYS_SQL} AS keys "
        f"FROM {FROM} WHERE {RAW_WHERE}) ARRAY JOIN keys AS key GROUP BY key"
    ),
}


#: Most groups a summary lists.
MAX_GROUPS = 500


def approx_summary(
    store: Store,
    windows: Sequence[PlannedWindow],
    params: Mapping[str, Any],
    *,
    group: str | None,
    dims: int | None,
    limit: int = 0,
    total: bool = True,
) -> tuple[list[dict[str, Any] | None], list[dict[str, Any]]]:
    """(each window's total row, None if it has no requests; rows of the top ``limit`` groups) with
    ``figures.row_stats``'s columns. Groups by ``group`` (an SQL expression; one window only),
    from the windows' rollup hours at level ``dims`` and raw reads of the rest. Two queries
    whatever the number of windows: figures, then histograms; a window's total is a grouping set
    of the same pass as its groups."""
    q = dict(params)
    if group is None:
        flag, sets, hist_sets = "1", "grp", "grp, key"
    elif total:
        flag = "grouping(grp)"
        sets, hist_sets = "GROUPING SETS ((grp), ())", "GROUPING SETS ((grp, key), (key))"
    else:
        flag, sets, hist_sets = "0", "grp", "grp, key"

    def fill(
        template: str, rollup_sql: str, raw_sql: Mapping[bool, str], sets: str, having: str = ""
    ) -> str:
        sources = planned_sources(windows, dims, q, group or "''", rollup_sql, raw_sql)
        return render(template, {"SOURCES": sources, "TOTAL": flag, "SETS": sets, "HAVING": having})

    rows = query_dicts(store, fill(APPROX_SUMMARY_SQL, _ROLLUP_SCALARS, _RAW_SCALARS, sets), q)
    if not rows:
        return [None] * len(windows), []
    totals = sorted((row for row in rows if row["total"]), key=lambda r: r["grp"])
    groups = sorted((row for row in rows if not row["total"]), key=lambda r: (-r["n"], r["grp"]))
    having = ""
    if len(groups) > limit:
        groups = groups[:limit]
        q["groups"] = [row["grp"] for row in groups]
        having = _HAVING_GROUPS
    elif group is not None and total:
        # Every group is answered: the total's histograms are their sum, no second grouping set.
        flag, hist_sets = "0", "grp, key"
    sql = fill(APPROX_HIST_SQL, _ROLLUP_HIST, _RAW_HIST, hist_sets, having)
    hists = rollups.histograms(query_dicts(store, sql, q))
    if group is not None and total and not having:
        hists[(True, "")] = rollups.merge_histograms(
            hists.get((False, row["grp"]), {}) for row in groups
        )
    for row in totals + groups:
        found = hists.get((bool(row["total"]), row["grp"]), {})
        for metric, levels in METRIC_LEVELS.items():
            bins, counts = found.get(metric, ((), ()))
            row[f"{metric}_q"] = (
                rollups.quantiles(bins, counts, [lv for _, lv in levels]) if counts else None
            )
    if len(windows) == 1:
        return [totals[0] if totals else None], groups
    by_window = {row["grp"]: row for row in totals}  # grp is the window's index
    return [by_window.get(str(i)) for i in range(len(windows))], groups


def summary(
    store: Store,
    *,
    since_ns: int,
    until_ns: int,
    service: str | None = None,
    model: str | None = None,
    group_by: str | None = None,
    limit_groups: int = 100,
    exact: bool = False,
    use_rollups: bool = True,
) -> Summary:
    """Count, e2e and per-bucket percentiles, shares and streaming figures over a window.

    ``share`` is the bucket's fraction of all end-to-end time in the window (the shares sum to
    1); ``network`` figures cover only requests with a client span. With ``group_by`` (service,
    model, route, operation, status or ``resource.<key>``: ``groups.check_group_by``) ``groups``
    lists the same figures per group (largest first, at most ``limit_groups``, up to
    ``MAX_GROUPS``), each with its ``key``; otherwise it is []. Percentiles are within 0.5 %
    unless ``exact`` (``figures.EXACT_QUANTILES``). ``use_rollups=False`` reads every request
    raw (the same answer, slower; for checking).
    """
    params = window_params(since_ns, until_ns, service, model)
    expr = group_expr(group_by, params) if group_by else None
    limit_groups = bounded(limit_groups, 1, MAX_GROUPS)
    rows: list[dict[str, Any]] = []
    if exact:
        found = query_dicts(store, SUMMARY_SQL, params)
        total = found[0] if found else None
        if expr:
            params["limit"] = int(limit_groups)
            rows = query_dicts(store, render(SUMMARY_GROUPED_SQL, {"GROUP": expr}), params)
    else:
        window = plan_windows(store, [(since_ns, until_ns)], use_rollups)
        wanted = filters(service, model)
        # One pass answers the window and its groups when a rollup level has the group; groups
        # by a resource attribute (only in the raw rows) are read raw, in a pass of their own.
        dims = rollups.level_for([*wanted, group_by]) if group_by else None
        if expr and dims is not None:
            totals, rows = approx_summary(
                store, window, params, group=expr, dims=dims, limit=limit_groups
            )
        else:
            totals, _ = approx_summary(
                store, window, params, group=None, dims=rollups.level_for(wanted)
            )
            if expr:
                _, rows = approx_summary(
                    store, window, params, group=expr, dims=None, limit=limit_groups, total=False
                )
        total = totals[0]
    return Summary(
        **dict(stats_or_empty(total)),
        group_by=group_by,
        groups=[SummaryGroup(key=row["grp"], **dict(row_stats(row))) for row in rows],
        window=Window.of(since_ns, until_ns),
    )
