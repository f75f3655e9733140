"""The questions on-call asks, answered by ClickHouse over the attribution table.

Every function runs SQL in the store (nothing is pulled row by row into Python), binds every value
as a query parameter, and returns a JSON-ready dict with times in milliseconds (floats; ``None``
where there is no data). Time windows are ``[since_ns, until_ns)`` in ns since the epoch, on the
request's start (``Timestamp``: the client's clock when a client span was seen).

Reads use ``FINAL`` so a re-attributed request counts once (see 002_attribution.sql). ``summary``
and ``tail`` (so ``compare`` and ``diagnose`` too) take the hours wholly inside their window from
the hourly rollup where it is up to date, and read only the rest raw (``rollups.plan``): the same
answers, from a few thousand rollup rows instead of millions of requests.

>>> summary(store, since_ns=t0, until_ns=t1, group_by="model")  # doctest: +SKIP
{"count": 1200, "e2e_ms": {"p50": ..., "p90": ..., "p95": ..., "p99": ..., "mean": ...},
 "buckets_ms": {"queue": {"p50": ..., "p95": ..., "p99": ..., "mean": ..., "share": 0.31}, ...},
 "streaming": {"ttft_ms": {...}, "tpot_ms": {...}, "itl_ms": {...}},
 "groups": [{"key": "llama-3-8b", "count": 700, "e2e_ms": {...}, "buckets_ms": {...}}, ...]}

Functions: ``summary``, ``tail``, ``compare``, ``diagnose``, ``slo``, and the helpers
``slowest``, ``services``, ``gpu_by_phase``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from latscope.attribution import coldstart, dimensions, rollups
from latscope.attribution.rollups import ROLLUP_TABLE, Plan
from latscope.semconv import BUCKETS
from latscope.storage import ATTRIBUTION_TABLE, Store

__all__ = [
    "GROUP_BY_COLUMNS",
    "AggregateError",
    "Objective",
    "compare",
    "diagnose",
    "gpu_by_phase",
    "services",
    "slo",
    "slowest",
    "summary",
    "tail",
]


class AggregateError(ValueError):
    """An aggregate was asked something it cannot answer (bad group_by, empty window...)."""


#: bucket -> column of the attribution table.
BUCKET_COLUMNS: dict[str, str] = {
    "network": "NetworkNs",
    "queue": "QueueNs",
    "preprocess": "PreprocessNs",
    "prefill": "PrefillNs",
    "decode": "DecodeNs",
    "postprocess": "PostprocessNs",
    "other": "OtherNs",
}

#: ``group_by`` names -> SQL expression. Any other name ``resource.<key>`` (or a bare resource
#: attribute key containing a dot, e.g. ``k8s.pod.name``) groups by that resource attribute,
#: whose key is bound as a parameter.
GROUP_BY_COLUMNS: dict[str, str] = {
    "service": "ServiceName",
    "model": "Model",
    "route": "Route",
    "operation": "Operation",
    "status": "StatusCode",
}
_RESOURCE_GROUP = "ResourceAttributes[{group_key:String}]"

#: Quantile levels of the e2e figure and of each bucket (the REST contract's keys).
E2E_LEVELS = (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99))
BUCKET_LEVELS = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
STREAM_LEVELS = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))

#: Percentiles. ``exact=True``: linear interpolation between order statistics (numpy's and polars'
#: "linear", Excel's PERCENTILE.INC), from every value (each column is sorted: seconds over
#: millions of rows, always read raw). ``exact=False`` (the default): the same interpolation over
#: histograms with bins 1 % wide (``rollups.quantiles``), within 0.5 % of the exact value; the
#: histograms of settled hours come from the rollup. Counts, means and shares are exact either way.
#: docs/benchmarks.md has the figures.
EXACT_QUANTILES = "quantilesExactInclusive"

_WHERE = """
    Timestamp >= fromUnixTimestamp64Nano({since_ns:Int64})
    AND Timestamp < fromUnixTimestamp64Nano({until_ns:Int64})
    AND ({service:String} = '' OR ServiceName = {service:String})
    AND ({model:String} = '' OR Model = {model:String})
"""

_FROM = f"{ATTRIBUTION_TABLE} FINAL"

#: A request's rows share one sorting key, and the key's hour fixes the partition (day), so FINAL
#: never needs to merge across partitions: each partition is deduplicated on its own (and one
#: with a single part not at all).
_SETTINGS = "\nSETTINGS do_not_merge_across_partitions_select_final = 1"


def _levels(levels: Sequence[tuple[str, float]]) -> str:
    return ", ".join(repr(q) for _, q in levels)


def _stat_columns() -> str:
    fn = EXACT_QUANTILES
    parts = [
        "count() AS n",
        f"{fn}({_levels(E2E_LEVELS)})(E2eNs) AS e2e_q",
        "avg(E2eNs) AS e2e_mean",
        "sum(E2eNs) AS e2e_sum",
    ]
    for bucket, col in BUCKET_COLUMNS.items():
        parts += [
            f"{fn}({_levels(BUCKET_LEVELS)})({col}) AS {bucket}_q",
            f"avg({col}) AS {bucket}_mean",
            f"sum({col}) AS {bucket}_sum",
        ]
    parts += [
        f"{fn}({_levels(STREAM_LEVELS)})(coalesce(TtftClientNs, TtftServerNs)) AS ttft_q",
        "avg(coalesce(TtftClientNs, TtftServerNs)) AS ttft_mean",
        f"{fn}({_levels(STREAM_LEVELS)})(TtftServerNs) AS ttft_server_q",
        f"{fn}({_levels(STREAM_LEVELS)})(TpotNs) AS tpot_q",
        "avg(TpotNs) AS tpot_mean",
        f"{fn}({_levels(STREAM_LEVELS)})(ItlP50Ns) AS itl_p50_q",
        f"{fn}({_levels(STREAM_LEVELS)})(ItlP99Ns) AS itl_p99_q",
        "max(ItlMaxNs) AS itl_max",
        "sum(Stalls) AS stalls",
        "countIf(Stalls > 0) AS stalled_requests",
        "countIf(HasClient) AS with_client",
    ]
    return ",\n    ".join(parts)


#: The whole window in one row, every value read (``exact=True``).
SUMMARY_SQL = f"SELECT\n    {_stat_columns()}\nFROM {_FROM}\nWHERE {_WHERE}{_SETTINGS}"

#: One row per group (``exact=True``); ``{group}`` is a whitelisted expression from
#: GROUP_BY_COLUMNS or _RESOURCE_GROUP, never input.
SUMMARY_GROUPED_SQL = (
    f"SELECT\n    {{group}} AS grp,\n    {_stat_columns()}\nFROM {_FROM}\n"
    f"WHERE {_WHERE}\nGROUP BY grp\nORDER BY n DESC, grp\nLIMIT {{limit:UInt32}}{_SETTINGS}"
)

#: Filters of a raw read over the plan's raw ranges (``{ranges}``, from ``rollups.raw_where``).
_RAW_WHERE = """{ranges}
    AND ({service:String} = '' OR ServiceName = {service:String})
    AND ({model:String} = '' OR Model = {model:String})"""

#: Counts, sums and means over rollup rows and raw rows alike (``{sources}``: a UNION ALL of
#: SELECTs giving ``grp`` and the rollup's columns), per ``{sets}`` (``grp``, or grouping sets of
#: every group and the whole window, told apart by ``total``).
APPROX_SUMMARY_SQL = (
    """
SELECT grp, {total} AS total,
    sum(Requests) AS n, sum(WithClient) AS with_client,
    sum(E2eSum) AS e2e_sum, e2e_sum / n AS e2e_mean,
    sum(NetworkSum) AS network_sum, network_sum / sum(NetworkCount) AS network_mean,
"""
    + "".join(
        f"    sum({b.capitalize()}Sum) AS {b}_sum, {b}_sum / n AS {b}_mean,\n"
        for b in BUCKET_COLUMNS
        if b != "network"
    )
    + """    sum(TtftSum) / sum(TtftCount) AS ttft_mean, sum(TpotSum) / sum(TpotCount) AS tpot_mean,
    max(ItlMax) AS itl_max, sum(StallsSum) AS stalls, sum(StalledRequests) AS stalled_requests
FROM ({sources})
GROUP BY {sets}"""
    + _SETTINGS
    + ", force_grouping_standard_compatibility = 1"
)

#: The same sources' histograms: bin counts per group (and total) and key (metric * 4096 + bin).
APPROX_HIST_SQL = (
    """
SELECT grp, {total} AS total, key, sum(c) AS c
FROM ({sources})
GROUP BY {sets}{having}
ORDER BY total, grp, key"""
    + _SETTINGS
    + ", force_grouping_standard_compatibility = 1"
)
_HAVING_GROUPS = "\nHAVING total = 1 OR grp IN {groups:Array(String)}"

_ROLLUP_SCALARS = (
    f"SELECT {{group}} AS grp, {', '.join(rollups.SCALAR_COLUMNS)} "
    f"FROM {ROLLUP_TABLE} WHERE {{rollup_where}}"
)
#: Raw reads, by whether ``{group}`` is a literal (the whole window, or a window's index in
#: ``compare``): a literal stays out of the aggregation's keys, where a constant string costs a
#: third more over millions of rows.
_RAW_SCALARS = {
    False: (
        f"SELECT {{group}} AS grp, {rollups.SCALARS_SQL} FROM {_FROM} WHERE {_RAW_WHERE} "
        "GROUP BY grp"
    ),
    True: f"SELECT {{group}} AS grp, {rollups.SCALARS_SQL} FROM {_FROM} WHERE {_RAW_WHERE}",
}
_ROLLUP_HIST = (
    f"SELECT {{group}} AS grp, key, c FROM {ROLLUP_TABLE} "
    "ARRAY JOIN HistKeys AS key, HistCounts AS c WHERE {rollup_where}"
)
_RAW_HIST = {
    False: (
        f"SELECT grp, key, count() AS c FROM (SELECT {{group}} AS grp, {rollups.HIST_KEYS_SQL} "
        f"AS keys FROM {_FROM} WHERE {_RAW_WHERE}) ARRAY JOIN keys AS key GROUP BY grp, key"
    ),
    True: (
        f"SELECT {{group}} AS grp, key, count() AS c FROM (SELECT {rollups.HIST_KEYS_SQL} AS keys "
        f"FROM {_FROM} WHERE {_RAW_WHERE}) ARRAY JOIN keys AS key GROUP BY key"
    ),
}

#: Quantile levels per histogram metric (the row keys are ``<metric>_q``).
_METRIC_LEVELS = {
    "e2e": E2E_LEVELS,
    **dict.fromkeys(BUCKET_COLUMNS, BUCKET_LEVELS),
    **dict.fromkeys(("ttft", "ttft_server", "tpot", "itl_p50", "itl_p99"), STREAM_LEVELS),
}


@dataclass(frozen=True)
class _Window:
    """A window to read: its plan and its bounds (ns)."""

    plan: Plan
    since_ns: int
    until_ns: int


def _sources(
    windows: Sequence[_Window],
    dims: int | None,
    params: dict[str, Any],
    group: str,
    rollup_sql: str,
    raw_sql: Mapping[bool, str],
) -> str:
    """UNION ALL of each window's rollup rows (its usable hours at level ``dims``) and raw reads
    of the rest (all of it when ``dims`` is None: no level has what the query needs). With
    several windows, ``grp`` is the window's index instead of ``group``."""
    parts = []
    for i, w in enumerate(windows):
        tag = group if len(windows) == 1 else f"'{i}'"
        rollup = bool(w.plan.hours) and dims is not None
        ranges = w.plan.raw if rollup else [(w.since_ns, w.until_ns)]
        if rollup:
            where = rollups.rollup_where(w.plan, int(dims or 0), params, f"w{i}_")
            parts.append(rollup_sql.replace("{rollup_where}", where).replace("{group}", tag))
        if ranges:
            where = rollups.raw_where(ranges, params, f"w{i}_")
            raw = raw_sql[tag.startswith("'")]
            parts.append(raw.replace("{ranges}", where).replace("{group}", tag))
    return "\n    UNION ALL\n    ".join(parts)


def _approx_summary(
    store: Store,
    windows: Sequence[_Window],
    params: Mapping[str, Any],
    *,
    group: str | None,
    dims: int | None,
    limit: int = 0,
    total: bool = True,
) -> tuple[list[dict[str, Any] | None], list[dict[str, Any]]]:
    """(each window's total row, None if it has no requests; rows of the top ``limit`` groups) with
    ``_stats_json``'s columns. Groups by ``group`` (an SQL expression; one window only), from
    the windows' rollup hours at level ``dims`` and raw reads of the rest. Two queries whatever
    the number of windows: figures, then histograms; a window's total is a grouping set of the
    same pass as its groups."""
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
        sources = _sources(windows, dims, q, group or "''", rollup_sql, raw_sql)
        return (
            template.replace("{sources}", sources)
            .replace("{total}", flag)
            .replace("{sets}", sets)
            .replace("{having}", having)
        )

    rows = _query_dicts(store, fill(APPROX_SUMMARY_SQL, _ROLLUP_SCALARS, _RAW_SCALARS, sets), q)
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
    hists = rollups.histograms(_query_dicts(store, sql, q))
    if group is not None and total and not having:
        hists[(True, "")] = rollups.merge_histograms(
            hists.get((False, row["grp"]), {}) for row in groups
        )
    for row in totals + groups:
        found = hists.get((bool(row["total"]), row["grp"]), {})
        for metric, levels in _METRIC_LEVELS.items():
            bins, counts = found.get(metric, ((), ()))
            row[f"{metric}_q"] = (
                rollups.quantiles(bins, counts, [lv for _, lv in levels]) if counts else None
            )
    if len(windows) == 1:
        return [totals[0] if totals else None], groups
    by_window = {row["grp"]: row for row in totals}  # grp is the window's index
    return [by_window.get(str(i)) for i in range(len(windows))], groups


def _ms(ns: float | None) -> float | None:
    if ns is None:
        return None
    value = float(ns)
    return None if math.isnan(value) else value / 1e6


def _qdict(values: Sequence[float] | None, levels: Sequence[tuple[str, float]], n: int) -> dict:
    if not values or n == 0:
        return {name: None for name, _ in levels}
    return {name: _ms(v) for (name, _), v in zip(levels, values, strict=True)}


def _params(since_ns: int, until_ns: int, service: str | None, model: str | None) -> dict[str, Any]:
    if until_ns <= since_ns:
        raise AggregateError(f"empty window: until ({until_ns}) must be after since ({since_ns})")
    return {
        "since_ns": int(since_ns),
        "until_ns": int(until_ns),
        "service": service or "",
        "model": model or "",
    }


def _stats_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """One stats row (columns of _STATS) -> the REST shape."""
    n = int(row["n"] or 0)
    e2e_sum = float(row["e2e_sum"] or 0)
    e2e = _qdict(row["e2e_q"], E2E_LEVELS, n)
    e2e["mean"] = _ms(row["e2e_mean"]) if n else None
    buckets = {}
    for bucket in BUCKETS:
        figures = _qdict(row[f"{bucket}_q"], BUCKET_LEVELS, n)
        figures["mean"] = _ms(row[f"{bucket}_mean"]) if n else None
        total = row[f"{bucket}_sum"]
        figures["share"] = (float(total or 0) / e2e_sum) if e2e_sum else None
        buckets[bucket] = figures
    ttft = _qdict(row["ttft_q"], STREAM_LEVELS, n)
    ttft["mean"] = _ms(row["ttft_mean"])
    tpot = _qdict(row["tpot_q"], STREAM_LEVELS, n)
    tpot["mean"] = _ms(row["tpot_mean"])
    return {
        "count": n,
        "with_client": int(row["with_client"] or 0),
        "e2e_ms": e2e,
        "buckets_ms": buckets,
        "streaming": {
            "ttft_ms": ttft,
            "ttft_server_ms": _qdict(row["ttft_server_q"], STREAM_LEVELS, n),
            "tpot_ms": tpot,
            "itl_p50_ms": _qdict(row["itl_p50_q"], STREAM_LEVELS, n),
            "itl_p99_ms": _qdict(row["itl_p99_q"], STREAM_LEVELS, n),
            "itl_max_ms": _ms(row["itl_max"]),
            "stalls": int(row["stalls"] or 0),
            "stalled_requests": int(row["stalled_requests"] or 0),
        },
    }


def _query_dicts(store: Store, sql: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
    table = store.query_arrow(sql, dict(params))
    return table.to_pylist()


def _group_expr(group_by: str, params: dict[str, Any]) -> str:
    if group_by in GROUP_BY_COLUMNS:
        return GROUP_BY_COLUMNS[group_by]
    key = group_by.removeprefix("resource.") if group_by.startswith("resource.") else group_by
    if "." in group_by and key:
        params["group_key"] = key
        return _RESOURCE_GROUP
    raise AggregateError(
        f"group_by {group_by!r}: use one of {', '.join(GROUP_BY_COLUMNS)} or "
        "resource.<attribute> (e.g. resource.k8s.pod.name)"
    )


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
) -> dict[str, Any]:
    """Count, e2e and per-bucket percentiles, shares and streaming figures over a window.

    ``share`` is the bucket's fraction of all end-to-end time in the window (the shares sum to
    1); ``network`` figures cover only requests with a client span. With ``group_by`` (service,
    model, route, operation, status or ``resource.<key>``) ``groups`` lists the same figures per
    group (largest first, at most ``limit_groups``), each with its ``key``; otherwise it is [].
    Percentiles are within 0.5 % unless ``exact`` (see EXACT_QUANTILES). ``use_rollups=False``
    reads every request raw (the same answer, slower; for checking).
    """
    params = _params(since_ns, until_ns, service, model)
    expr = _group_expr(group_by, params) if group_by else None
    rows: list[dict[str, Any]] = []
    if exact:
        found = _query_dicts(store, SUMMARY_SQL, params)
        total = found[0] if found else None
        if expr:
            params["limit"] = int(limit_groups)
            rows = _query_dicts(store, SUMMARY_GROUPED_SQL.replace("{group}", expr), params)
    else:
        window = _windows(store, [(since_ns, until_ns)], use_rollups)
        filters = _filters(service, model)
        # One pass answers the window and its groups when a rollup level has the group; groups
        # by a resource attribute (only in the raw rows) are read raw, in a pass of their own.
        dims = rollups.level_for([*filters, group_by]) if group_by else None
        if expr and dims is not None:
            totals, rows = _approx_summary(
                store, window, params, group=expr, dims=dims, limit=limit_groups
            )
        else:
            totals, _ = _approx_summary(
                store, window, params, group=None, dims=rollups.level_for(filters)
            )
            if expr:
                _, rows = _approx_summary(
                    store, window, params, group=expr, dims=None, limit=limit_groups, total=False
                )
        total = totals[0]
    out = _stats_or_empty(total)
    out["window"] = {"since_ns": int(since_ns), "until_ns": int(until_ns)}
    out["group_by"] = group_by
    out["groups"] = [{"key": row["grp"], **_stats_json(row)} for row in rows]
    return out


def _windows(store: Store, bounds: Sequence[tuple[int, int]], use_rollups: bool) -> list[_Window]:
    """The windows to read, each with its plan (all raw when ``use_rollups`` is False)."""
    found = rollups.plans(store, bounds) if use_rollups else [Plan([], [b]) for b in bounds]
    return [_Window(p, lo, hi) for p, (lo, hi) in zip(found, bounds, strict=True)]


def _filters(service: str | None, model: str | None) -> list[str]:
    """The dimensions a query filters on, for ``rollups.level_for``."""
    return [name for name, value in (("service", service), ("model", model)) if value]


def _stats_or_empty(row: dict[str, Any] | None) -> dict[str, Any]:
    return _stats_json(row) if row else _stats_json({"n": 0} | _EMPTY_ROW)


_EMPTY_ROW: dict[str, Any] = {
    key: None
    for key in [
        "e2e_q",
        "e2e_mean",
        "e2e_sum",
        "ttft_q",
        "ttft_mean",
        "ttft_server_q",
        "tpot_q",
        "tpot_mean",
        "itl_p50_q",
        "itl_p99_q",
        "itl_max",
        "stalls",
        "stalled_requests",
        "with_client",
    ]
} | {f"{b}_{s}": None for b in BUCKETS for s in ("q", "mean", "sum")}


# -- tail -----------------------------------------------------------------------------------------

#: Thresholds first (``exact=True``): the pXX of e2e, and the band around the median that stands
#: for "the median request" (p45..p55, so one odd request cannot be the baseline).
TAIL_THRESHOLDS_SQL = f"""
SELECT count() AS n, {EXACT_QUANTILES}({{q:Float64}}, 0.45, 0.55)(E2eNs) AS t
FROM {_FROM}
WHERE {_WHERE}{_SETTINGS}
"""


def _bucket_means(prefix: str) -> str:
    return ", ".join(
        f"avgIf(ifNull({col}, 0), {prefix}) AS {bucket}_{'tail' if prefix == 'is_tail' else 'mid'}"
        for bucket, col in BUCKET_COLUMNS.items()
    )


#: Mean of each bucket over the tail (e2e >= threshold) and over the median band. Network counts
#: as 0 for server-only requests here so that the extra times add up to the extra e2e.
TAIL_SQL = f"""
SELECT
    countIf(is_tail) AS n_tail, countIf(is_mid) AS n_mid,
    avgIf(E2eNs, is_tail) AS e2e_tail, avgIf(E2eNs, is_mid) AS e2e_mid,
    {_bucket_means("is_tail")},
    {_bucket_means("is_mid")}
FROM (
    SELECT E2eNs, {", ".join(BUCKET_COLUMNS.values())},
           E2eNs >= {{threshold:Float64}} AS is_tail,
           E2eNs >= {{mid_lo:Float64}} AND E2eNs <= {{mid_hi:Float64}} AS is_mid
    FROM {_FROM}
    WHERE {_WHERE}
){_SETTINGS}
"""

_TAIL_SUMS = rollups.TAIL_SUM_NAMES  # n, e2e, then each bucket

#: ``exact=False``: the e2e histogram with each bucket's sum per bin, over rollup and raw rows.
APPROX_TAIL_SQL = (
    f"""
SELECT bin, {", ".join(f"sum({name}) AS {name}" for name in _TAIL_SUMS)}
FROM ({{sources}})
GROUP BY bin
ORDER BY bin"""
    + _SETTINGS
)
_ROLLUP_TAIL = (
    f"SELECT bin, {', '.join(_TAIL_SUMS)} FROM {ROLLUP_TABLE} ARRAY JOIN TailBins AS bin, "
    + ", ".join(
        f"Tail{'Requests' if name == 'n' else name.capitalize()} AS {name}" for name in _TAIL_SUMS
    )
    + " WHERE {rollup_where}"
)
_RAW_TAIL = dict.fromkeys(
    (False, True),
    f"SELECT {rollups.bin_sql('E2eNs')} AS bin, {rollups.TAIL_SUMS_SQL} "
    f"FROM {_FROM} WHERE {_RAW_WHERE} GROUP BY bin",
)


def _approx_tail(
    store: Store, w: _Window, params: Mapping[str, Any], q: float, dims: int | None
) -> tuple[float, dict[str, Any]] | None:
    """(threshold ns, TAIL_SQL's row) from the binned e2e: the tail is every request in the bin
    of the pXX request or above (the threshold is that bin's lower edge), the median band every
    request from the p45 request's bin to the p55 one's; means are exact over those requests."""
    qp = dict(params)
    sources = _sources([w], dims, qp, "''", _ROLLUP_TAIL, _RAW_TAIL)
    rows = _query_dicts(store, APPROX_TAIL_SQL.replace("{sources}", sources), qp)
    bins, counts = [int(r["bin"]) for r in rows], [int(r["n"]) for r in rows]
    if not counts:
        return None
    tail_bin = rollups.bin_of_rank(bins, counts, q, upper=False)
    mid_lo = rollups.bin_of_rank(bins, counts, 0.45, upper=False)
    mid_hi = rollups.bin_of_rank(bins, counts, 0.55, upper=True)
    tail_rows = [r for r in rows if r["bin"] >= tail_bin]
    mid_rows = [r for r in rows if mid_lo <= r["bin"] <= mid_hi]
    n_tail, n_mid = sum(r["n"] for r in tail_rows), sum(r["n"] for r in mid_rows)
    row: dict[str, Any] = {"n": sum(counts), "n_tail": n_tail, "n_mid": n_mid}
    for name in ("e2e", *BUCKET_COLUMNS):
        row[f"{name}_tail"] = sum(r[name] for r in tail_rows) / n_tail
        row[f"{name}_mid"] = sum(r[name] for r in mid_rows) / n_mid
    return rollups.bin_floor(tail_bin), row


def tail(
    store: Store,
    *,
    since_ns: int,
    until_ns: int,
    percentile: float = 99,
    service: str | None = None,
    model: str | None = None,
    exact: bool = False,
    use_rollups: bool = True,
) -> dict[str, Any]:
    """Where the slowest requests spend their extra time.

    For requests with e2e at or above the ``percentile``-th percentile, each bucket's mean minus
    its mean over the median requests (e2e between p45 and p55): ``extra_ms`` per bucket adds up
    to the tail's extra e2e; ``dominant`` names the bucket with the most extra time. Unless
    ``exact``, the threshold is the lower edge of the 1 %-wide e2e bin that holds the pXX request
    (so at most 1 % below it) and the tail is every request from there up; means are exact.
    """
    if not 0 < percentile < 100:
        raise AggregateError(f"percentile must be between 0 and 100, got {percentile}")
    params = _params(since_ns, until_ns, service, model)
    out: dict[str, Any] = {
        "percentile": percentile,
        "count": 0,
        "threshold_ms": None,
        "tail_count": 0,
        "tail_e2e_ms": None,
        "median_e2e_ms": None,
        "extra_e2e_ms": None,
        "buckets_ms": {},
        "dominant": None,
    }
    if exact:
        params["q"] = percentile / 100
        first = _query_dicts(store, TAIL_THRESHOLDS_SQL, params)[0]
        out["count"] = int(first["n"] or 0)
        if out["count"] == 0:
            return out
        threshold, mid_lo, mid_hi = first["t"]
        params.update(threshold=float(threshold), mid_lo=float(mid_lo), mid_hi=float(mid_hi))
        row = _query_dicts(store, TAIL_SQL, params)[0]
    else:
        (w,) = _windows(store, [(since_ns, until_ns)], use_rollups)
        level = rollups.level_for(_filters(service, model), tail=True)
        found = _approx_tail(store, w, params, percentile / 100, level)
        if found is None:
            return out
        threshold, row = found
        out["count"] = int(row["n"])
    out.update(
        threshold_ms=_ms(threshold),
        tail_count=int(row["n_tail"]),
        tail_e2e_ms=_ms(row["e2e_tail"]),
        median_e2e_ms=_ms(row["e2e_mid"]),
    )
    extra_total = (row["e2e_tail"] or 0) - (row["e2e_mid"] or 0)
    out["extra_e2e_ms"] = _ms(extra_total)
    for bucket in BUCKETS:
        t, m = row[f"{bucket}_tail"] or 0.0, row[f"{bucket}_mid"] or 0.0
        out["buckets_ms"][bucket] = {
            "tail_mean": _ms(t),
            "median_mean": _ms(m),
            "extra": _ms(t - m),
            "extra_share": ((t - m) / extra_total) if extra_total > 0 else None,
        }
    out["dominant"] = max(BUCKETS, key=lambda b: out["buckets_ms"][b]["extra"] or 0.0)
    return out


# -- compare --------------------------------------------------------------------------------------


def compare(
    store: Store,
    *,
    before: tuple[int, int],
    after: tuple[int, int],
    service: str | None = None,
    model: str | None = None,
    exact: bool = False,
    use_rollups: bool = True,
) -> dict[str, Any]:
    """Two windows bucket by bucket: p50 / p99 / mean / share before, after and the delta.

    ``mover`` names the bucket whose mean changed most (means add up to the e2e mean, so the
    movers explain the e2e change); ``e2e_ms`` carries the same figures for the whole request.
    """
    if exact:
        common = {"service": service, "model": model, "exact": True}
        a = summary(store, since_ns=before[0], until_ns=before[1], **common)
        b = summary(store, since_ns=after[0], until_ns=after[1], **common)
    else:
        # Both windows in one pass: their hours looked up once, one figures query and one
        # histogram query over both.
        _params(after[0], after[1], service, model)  # both windows must be non-empty
        params = _params(before[0], before[1], service, model)
        windows = _windows(store, [before, after], use_rollups)
        totals, _ = _approx_summary(
            store, windows, params, group=None, dims=rollups.level_for(_filters(service, model))
        )
        a, b = (_stats_or_empty(t) for t in totals)

    def delta(x: float | None, y: float | None) -> float | None:
        return None if x is None or y is None else y - x

    buckets = {}
    for bucket in BUCKETS:
        fa, fb = a["buckets_ms"][bucket], b["buckets_ms"][bucket]
        buckets[bucket] = {
            key: {"before": fa[key], "after": fb[key], "delta": delta(fa[key], fb[key])}
            for key in ("p50", "p99", "mean", "share")
        }
    e2e = {
        key: {
            "before": a["e2e_ms"][key],
            "after": b["e2e_ms"][key],
            "delta": delta(a["e2e_ms"][key], b["e2e_ms"][key]),
        }
        for key in ("p50", "p99", "mean")
    }
    movers = [b for b in BUCKETS if buckets[b]["mean"]["delta"] is not None]
    mover = max(movers, key=lambda k: abs(buckets[k]["mean"]["delta"]), default=None)
    return {
        "before": {"since_ns": before[0], "until_ns": before[1], "count": a["count"]},
        "after": {"since_ns": after[0], "until_ns": after[1], "count": b["count"]},
        "e2e_ms": e2e,
        "buckets_ms": buckets,
        "mover": mover,
        "mover_delta_ms": buckets[mover]["mean"]["delta"] if mover else None,
        "p99_mover": max(
            (k for k in BUCKETS if buckets[k]["p99"]["delta"] is not None),
            key=lambda k: abs(buckets[k]["p99"]["delta"]),
            default=None,
        ),
    }


# -- diagnose -------------------------------------------------------------------------------------

#: Prompts at most this long count as "tiny" (their prefill is too short to explain slowness).
TINY_PROMPT_TOKENS = 64

#: Figures the diagnosis rules look at, in one pass.
DIAGNOSE_SQL = f"""
SELECT
    count() AS n,
    quantileExactInclusive(0.5)(E2eNs) AS e2e_p50,
    quantileExactInclusive(0.99)(E2eNs) AS e2e_p99,
    countIf(InputTokens <= {{tiny:UInt32}}) AS n_tiny,
    quantileExactInclusiveIf(0.5)(E2eNs, InputTokens <= {{tiny:UInt32}}) AS tiny_e2e_p50,
    avgIf(ifNull(NetworkNs, 0) + QueueNs, InputTokens <= {{tiny:UInt32}}) AS tiny_net_queue,
    avgIf(E2eNs, InputTokens <= {{tiny:UInt32}}) AS tiny_e2e_mean,
    corr(toFloat64(InputTokens), toFloat64(coalesce(TtftServerNs, TtftClientNs))) AS ttft_corr,
    corr(toFloat64(InputTokens), toFloat64(PrefillNs)) AS prefill_corr,
    simpleLinearRegression(toFloat64(InputTokens), toFloat64(PrefillNs)).1 AS prefill_ns_per_token,
    quantileExactInclusive(0.95)(coalesce(TtftClientNs, TtftServerNs)) AS ttft_p95,
    countIf(Stalls > 0) AS n_stalled,
    sum(Stalls) AS stalls,
    quantileExactInclusive(0.5)(ItlP50Ns) AS itl_p50,
    quantileExactInclusive(0.99)(ItlMaxNs) AS itl_max_p99,
    sum(QueueNs) / sum(E2eNs) AS queue_share,
    sum(PrefillNs) / sum(E2eNs) AS prefill_share,
    sumIf(PrefillNs, coalesce(TtftClientNs, TtftServerNs) IS NOT NULL)
        / sum(coalesce(TtftClientNs, TtftServerNs)) AS prefill_ttft_share,
    sum(DecodeNs) / sum(E2eNs) AS decode_share
FROM {_FROM}
WHERE {_WHERE}{_SETTINGS}
"""

#: Per-minute load against per-minute latency: is it slow only at peak?
DIAGNOSE_PEAK_SQL = f"""
SELECT
    count() AS minutes,
    corr(toFloat64(n), toFloat64(p95)) AS load_latency_corr,
    corr(toFloat64(n), toFloat64(queue_mean)) AS load_queue_corr,
    max(n) AS peak_rpm, quantileExactInclusive(0.5)(n) AS median_rpm,
    argMax(p95, n) AS peak_p95, quantileExactInclusive(0.5)(p95) AS median_p95
FROM (
    SELECT toStartOfMinute(Timestamp) AS minute, count() AS n,
           quantileExactInclusive(0.95)(E2eNs) AS p95, avg(QueueNs) AS queue_mean
    FROM {_FROM}
    WHERE {_WHERE}
    GROUP BY minute
){_SETTINGS}
"""

#: Verdicts: cause, bucket, the usual first fixes.
CAUSES: dict[str, dict[str, Any]] = {
    "queue_tail": {
        "bucket": "queue",
        "cause": "load exceeds capacity: the slowest requests wait for a worker or batch slot",
        "fixes": [
            "cap the queue depth and shed or reject early",
            "scale out earlier (autoscale on queue time, not CPU)",
            "separate interactive from batch traffic",
        ],
    },
    "tiny_prompts_slow": {
        "bucket": "network/queue",
        "cause": "slow even for tiny prompts: the time is spent outside the model "
        "(network, proxies or queueing)",
        "fixes": [
            "check proxies, TLS and connection reuse between client and server",
            "look at queue time: requests wait before any model work starts",
        ],
    },
    "prefill_prompt_length": {
        "bucket": "prefill",
        "cause": "TTFT grows with prompt length: prefill dominates time to first token",
        "fixes": [
            "shrink prompts (trim history, retrieval results)",
            "enable prefix caching for shared system prompts",
            "cap the prefill batch (chunked prefill) so long prompts do not block others",
        ],
    },
    "decode_stalls": {
        "bucket": "decode",
        "cause": "inter-token stalls: decode batching holds streams back",
        "fixes": [
            "cap the decode batch size",
            "isolate long generations on their own replicas",
            "enable chunked prefill so new prompts do not stall running streams",
        ],
    },
    "peak_only": {
        "bucket": "queue",
        "cause": "slow only at peak: latency follows load, queueing at busy minutes",
        "fixes": [
            "scale ahead of the daily peak",
            "rate-limit or defer batch traffic at peak",
        ],
    },
}


def diagnose(
    store: Store,
    *,
    since_ns: int,
    until_ns: int,
    service: str | None = None,
    model: str | None = None,
    percentile: float = 99,
    stall_share: float = 0.05,
    warmup: coldstart.WarmupRule | None = None,
) -> dict[str, Any]:
    """Map what the window shows to the usual cause and first fix.

    Returns ``{"count", "dominant", "tail_dominant", "verdicts": [{"id", "cause", "bucket",
    "fixes", "evidence": {...}, "where": {...} | None}]}``, strongest first; each verdict
    carries the numbers behind it, and ``where`` the dimension value that concentrates it and
    since when (``dimensions.concentration``). ``warmup`` is the cold-start rule.
    """
    params = _params(since_ns, until_ns, service, model)
    params["tiny"] = TINY_PROMPT_TOKENS
    f = _query_dicts(store, DIAGNOSE_SQL, params)[0]
    n = int(f["n"] or 0)
    out: dict[str, Any] = {"count": n, "dominant": None, "tail_dominant": None, "verdicts": []}
    if n == 0:
        return out
    s = summary(store, since_ns=since_ns, until_ns=until_ns, service=service, model=model)
    shares = {b: v["share"] or 0.0 for b, v in s["buckets_ms"].items()}
    out["dominant"] = max(shares, key=lambda b: shares[b])
    out["shares"] = shares
    t = tail(
        store,
        since_ns=since_ns,
        until_ns=until_ns,
        percentile=percentile,
        service=service,
        model=model,
    )
    out["tail_dominant"] = t["dominant"]
    verdicts: list[tuple[float, str, dict[str, Any]]] = []

    if t["dominant"] == "queue" and t["tail_count"]:
        extra = t["buckets_ms"]["queue"]
        verdicts.append(
            (
                extra["extra_share"] or 0.0,
                "queue_tail",
                {
                    "tail_percentile": percentile,
                    "tail_threshold_ms": t["threshold_ms"],
                    "queue_extra_ms": extra["extra"],
                    "queue_extra_share": extra["extra_share"],
                    "queue_tail_mean_ms": extra["tail_mean"],
                    "queue_median_mean_ms": extra["median_mean"],
                },
            )
        )
    n_tiny = int(f["n_tiny"] or 0)
    if n_tiny and f["tiny_e2e_mean"]:
        outside = (f["tiny_net_queue"] or 0) / f["tiny_e2e_mean"]
        if outside >= 0.5 and (f["tiny_e2e_p50"] or 0) >= 0.5 * (f["e2e_p50"] or 0):
            verdicts.append(
                (
                    outside,
                    "tiny_prompts_slow",
                    {
                        "tiny_prompt_tokens": TINY_PROMPT_TOKENS,
                        "tiny_requests": n_tiny,
                        "tiny_e2e_p50_ms": _ms(f["tiny_e2e_p50"]),
                        "all_e2e_p50_ms": _ms(f["e2e_p50"]),
                        "tiny_network_plus_queue_share": outside,
                    },
                )
            )
    # TTFT grows with the prompt when prefill does and prefill is a real part of TTFT as the
    # client felt it (a noisy queue can hide the trend in TTFT itself, so both correlations are
    # reported). The server's TTFT would miss the network: 5 ms of prefill is most of a 7 ms
    # server TTFT, but not of the 130 ms the client waited behind a slow gateway.
    corr = _finite(f["prefill_corr"])
    in_ttft = _finite(f["prefill_ttft_share"]) or 0.0
    if corr is not None and corr >= 0.5 and in_ttft >= 0.2:
        verdicts.append(
            (
                corr * in_ttft,
                "prefill_prompt_length",
                {
                    "prefill_vs_prompt_tokens_corr": corr,
                    "ttft_vs_prompt_tokens_corr": _finite(f["ttft_corr"]),
                    "prefill_ms_per_1k_tokens": _ms(
                        (_finite(f["prefill_ns_per_token"]) or 0) * 1000
                    ),
                    "prefill_share_of_ttft": in_ttft,
                    "ttft_p95_ms": _ms(f["ttft_p95"]),
                    "prefill_share": f["prefill_share"],
                },
            )
        )
    stalled = int(f["n_stalled"] or 0)
    if stalled and stalled / n >= stall_share:
        verdicts.append(
            (
                stalled / n,
                "decode_stalls",
                {
                    "stalled_requests": stalled,
                    "stalled_share": stalled / n,
                    "stalls": int(f["stalls"] or 0),
                    "itl_p50_ms": _ms(f["itl_p50"]),
                    "itl_max_p99_ms": _ms(f["itl_max_p99"]),
                    "decode_share": f["decode_share"],
                },
            )
        )
    peak = _query_dicts(store, DIAGNOSE_PEAK_SQL, params)[0]
    load_corr = _finite(peak["load_latency_corr"])
    if (
        int(peak["minutes"] or 0) >= 5
        and load_corr is not None
        and load_corr >= 0.6
        and (peak["peak_p95"] or 0) >= 1.5 * (peak["median_p95"] or 0)
    ):
        verdicts.append(
            (
                load_corr * 0.9,
                "peak_only",
                {
                    "minutes": int(peak["minutes"]),
                    "load_vs_p95_corr": load_corr,
                    "load_vs_queue_corr": _finite(peak["load_queue_corr"]),
                    "peak_requests_per_minute": int(peak["peak_rpm"]),
                    "median_requests_per_minute": float(peak["median_rpm"]),
                    "peak_minute_p95_ms": _ms(peak["peak_p95"]),
                    "median_minute_p95_ms": _ms(peak["median_p95"]),
                },
            )
        )
    cold = coldstart.verdict(
        coldstart.coldstart(
            store, since_ns=since_ns, until_ns=until_ns, service=service, model=model, rule=warmup
        )
    )
    if cold is not None:
        verdicts.append((cold[0], "cold_start", cold[1]))
    places: dict[str, dict[str, Any] | None] = {}
    for score, key, evidence in sorted(verdicts, key=lambda v: -v[0]):
        cause = dict(CAUSES.get(key) or coldstart.COLD_START_CAUSE)
        if key == "cold_start":
            cause["bucket"] = evidence["warmup_extra_bucket"] or cause["bucket"]
        bucket = cause["bucket"]
        if bucket not in places and key != "cold_start":
            places[bucket] = dimensions.concentration(
                store, since_ns=since_ns, until_ns=until_ns, bucket=bucket, service=service,
                model=model,
            )  # fmt: skip
        out["verdicts"].append(
            {"id": key, **cause, "score": score, "evidence": evidence, "where": places.get(bucket)}
        )
    return out


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


# -- slo ------------------------------------------------------------------------------------------

#: metric name -> attribution column the objective is on.
SLO_METRICS: dict[str, str] = {
    "e2e": "toFloat64(E2eNs)",
    "ttft": "toFloat64(coalesce(TtftClientNs, TtftServerNs))",
    "tpot": "TpotNs",
}

#: Google SRE workbook, "Alerting on SLOs": page when 2 % of a 30-day budget burns in 1 h
#: (14.4x) or 5 % in 6 h (6x), each confirmed by a short window (5 m, 30 m).
FAST_BURN, SLOW_BURN = 14.4, 6.0

#: ``{value}`` is a whitelisted expression from SLO_METRICS. Requests without the metric (no
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
        AS bad_6h
FROM (
    SELECT Timestamp, {{value}} AS v
    FROM {_FROM}
    WHERE Timestamp >= fromUnixTimestamp64Nano({{since_ns:Int64}})
      AND Timestamp < fromUnixTimestamp64Nano({{until_ns:Int64}})
      AND ({{service:String}} = '' OR ServiceName = {{service:String}})
      AND ({{model:String}} = '' OR Model = {{model:String}})
){_SETTINGS}
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
    window_days: float = 30
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
) -> dict[str, Any]:
    """Error budget left and multi-window burn rates for each objective, as of ``now_ns``.

    A burn rate is the window's bad fraction divided by the budget (1 - target): 1.0 spends the
    budget exactly over the objective's window. ``alerts.fast_burn`` is 1 h and 5 m both above
    14.4, ``alerts.slow_burn`` is 6 h and 30 m both above 6 (Google SRE workbook). With
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
            "s5m": int(now_ns) - _H // 12,
            "s30m": int(now_ns) - _H // 2,
            "s1h": int(now_ns) - _H,
            "s6h": int(now_ns) - 6 * _H,
            "threshold_ns": float(obj.threshold_ms) * 1e6,
            "service": service or "",
            "model": model or "",
        }
        spent = None
        if explain:
            # One read gives both: each window's bad and good requests are the burn rates'
            # counts, and their buckets say where the budget went.
            starts = {"window": params["window_start"]} | {
                w: params[f"s{w}"] for w in ("5m", "30m", "1h", "6h")
            }
            spent = dimensions.slo_buckets(
                store, value_sql=SLO_METRICS[obj.metric], threshold_ms=obj.threshold_ms,
                windows=starts, until_ns=int(now_ns), service=service, model=model,
            )  # fmt: skip
            row = {"total": spent["window"]["bad"] + spent["window"]["good"]}
            row["bad"] = spent["window"]["bad"]
            for w in ("5m", "30m", "1h", "6h"):
                row[f"bad_{w}"] = spent[w]["bad"]
                row[f"total_{w}"] = spent[w]["bad"] + spent[w]["good"]
        else:
            sql = SLO_SQL.replace("{value}", SLO_METRICS[obj.metric])
            row = _query_dicts(store, sql, params)[0]
        budget = 1 - obj.target

        def burn(bad: int, total: int, budget: float = budget) -> float | None:
            return (bad / total) / budget if total else None

        total, bad = int(row["total"]), int(row["bad"])
        rates = {
            w: burn(int(row[f"bad_{w}"]), int(row[f"total_{w}"])) for w in ("5m", "30m", "1h", "6h")
        }
        compliance = (1 - bad / total) if total else None
        budget_left = (1 - (bad / total) / budget) if total else None
        results.append(
            {
                "name": obj.name or f"{obj.metric} p{obj.target * 100:g} < {obj.threshold_ms:g} ms",
                "metric": obj.metric,
                "threshold_ms": obj.threshold_ms,
                "target": obj.target,
                "window_days": obj.window_days,
                "total": total,
                "bad": bad,
                "compliance": compliance,
                "met": None if compliance is None else compliance >= obj.target,
                "error_budget": budget,
                "budget_left": budget_left,
                "burn_rates": rates,
                "alerts": {
                    "fast_burn": _above(rates["1h"], rates["5m"], FAST_BURN),
                    "slow_burn": _above(rates["6h"], rates["30m"], SLOW_BURN),
                },
            }
        )
        if spent is not None:
            results[-1]["budget_by_bucket"] = spent
    return {"now_ns": int(now_ns), "objectives": results}


def _above(long: float | None, short: float | None, limit: float) -> bool:
    return long is not None and short is not None and long > limit and short > limit


# -- helpers for the API ---------------------------------------------------------------------------

SLOWEST_SQL = f"""
SELECT TraceId AS trace_id, toUnixTimestamp64Nano(Timestamp) AS start_ns,
       ServiceName AS service, Model AS model, Route AS route, StatusCode AS status,
       E2eNs, NetworkNs, QueueNs, PreprocessNs, PrefillNs, DecodeNs, PostprocessNs, OtherNs,
       coalesce(TtftClientNs, TtftServerNs) AS ttft, TpotNs AS tpot,
       InputTokens AS input_tokens, OutputTokens AS output_tokens, Stalls AS stalls,
       Attempts AS attempts
FROM {_FROM}
WHERE {_WHERE}
ORDER BY E2eNs DESC, TraceId
LIMIT {{limit:UInt32}}{_SETTINGS}
"""


def slowest(
    store: Store,
    *,
    since_ns: int,
    until_ns: int,
    service: str | None = None,
    model: str | None = None,
    limit: int = 20,
) -> list[dict[str, Any]]:
    """The ``limit`` slowest requests of the window, each with its buckets (ms)."""
    params = _params(since_ns, until_ns, service, model) | {"limit": int(limit)}
    out = []
    for row in _query_dicts(store, SLOWEST_SQL, params):
        out.append(
            {
                "trace_id": row["trace_id"],
                "start_ns": int(row["start_ns"]),
                "service": row["service"],
                "model": row["model"],
                "route": row["route"],
                "status": row["status"],
                "e2e_ms": _ms(row["E2eNs"]),
                "buckets_ms": {b: _ms(row[c]) for b, c in BUCKET_COLUMNS.items()},
                "ttft_ms": _ms(row["ttft"]),
                "tpot_ms": _ms(row["tpot"]),
                "input_tokens": row["input_tokens"],
                "output_tokens": row["output_tokens"],
                "stalls": row["stalls"],
                "attempts": row["attempts"],
            }
        )
    return out


SERVICES_SQL = f"""
SELECT ServiceName AS service, Model AS model, count() AS n,
       toUnixTimestamp64Nano(max(Timestamp)) AS last_ns
FROM {_FROM}
WHERE {_WHERE}
GROUP BY service, model
ORDER BY service, n DESC, model{_SETTINGS}
"""


def services(store: Store, *, since_ns: int, until_ns: int) -> list[dict[str, Any]]:
    """Services seen in the window, each with its models and request counts."""
    params = _params(since_ns, until_ns, None, None)
    by_service: dict[str, dict[str, Any]] = {}
    for row in _query_dicts(store, SERVICES_SQL, params):
        entry = by_service.setdefault(
            row["service"], {"service": row["service"], "count": 0, "last_ns": 0, "models": []}
        )
        entry["count"] += int(row["n"])
        entry["last_ns"] = max(entry["last_ns"], int(row["last_ns"]))
        entry["models"].append({"model": row["model"], "count": int(row["n"])})
    return list(by_service.values())


#: GPU figures are stored as ``Gpu['<phase>.<figure>']`` (e.g. ``decode.energy_mj``).
GPU_SQL = f"""
SELECT splitByChar('.', key)[1] AS phase, substring(key, position(key, '.') + 1) AS figure,
       count() AS n, avg(value) AS mean, max(value) AS max, sum(value) AS total
FROM {_FROM}
ARRAY JOIN mapKeys(Gpu) AS key, mapValues(Gpu) AS value
WHERE {_WHERE}
GROUP BY phase, figure
ORDER BY phase, figure{_SETTINGS}
"""


def gpu_by_phase(
    store: Store,
    *,
    since_ns: int,
    until_ns: int,
    service: str | None = None,
    model: str | None = None,
) -> dict[str, Any]:
    """GPU figures per phase: ``{"phases": {phase: {figure: {"mean", "max", "total", "n"}}}}``.

    Figures: utilization_mean / utilization_max (%), memory_used_max (bytes), power_mean (W),
    sm_clock (MHz), energy_mj (mJ; ``total`` is the window's energy in that phase).
    """
    params = _params(since_ns, until_ns, service, model)
    phases: dict[str, dict[str, Any]] = {}
    for row in _query_dicts(store, GPU_SQL, params):
        phases.setdefault(row["phase"], {})[row["figure"]] = {
            "mean": row["mean"],
            "max": row["max"],
            "total": row["total"],
            "n": int(row["n"]),
        }
    return {"phases": phases}
