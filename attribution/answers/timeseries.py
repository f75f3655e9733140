"""Since when: every figure of a window per time step, and the latency heatmap.

``timeseries`` gives, per step, the request count, e2e percentiles and mean, each bucket's
percentiles, mean and share of the time, and TTFT and TPOT percentiles and means, for the whole
window and per group (service, model, route, operation, status or ``resource.<key>``).
``heatmap`` counts requests per step and latency bin (log-scaled, ``bins_per_decade`` per factor
of ten) for e2e or any bucket, TTFT or TPOT; a rectangle of it is a selection for
``dimensions.why``.

Both read the hourly rollup where a step holds whole hours (steps that are whole hours; windows of
a day or more get them by default) and the attribution table for the rest (``window``), as
``summary`` does; percentiles then come from the same 1 %-wide bins, within 0.5 % of
the exact ones, read off the bins inside ClickHouse. A window read wholly raw (shorter steps) of
at most ``EXACT_MAX_REQUESTS`` gets exact percentiles instead: keeping its values costs less than
binning them.

>>> got = timeseries(store, since_ns=t0, until_ns=t1)  # doctest: +SKIP
>>> got.step_s, got.series[0].key, got.series[0].points[0].count  # doctest: +SKIP
(30, '', 9)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from latscope.attribution import rollups
from latscope.attribution.answers import window
from latscope.attribution.answers.common import FILTERS, bounded, ms
from latscope.attribution.answers.errors import TimeseriesError
from latscope.attribution.answers.figures import BUCKET_LEVELS, E2E_LEVELS, STREAM_LEVELS
from latscope.attribution.answers.groups import group_expr
from latscope.attribution.answers.models import (
    HeatBin,
    Heatmap,
    ReadSource,
    Series,
    StepBucket,
    StepPercentiles,
    StepPoint,
    Timeseries,
    Window,
)
from latscope.attribution.answers.window import WindowRead
from latscope.attribution.rollups import BUCKET_SUMS, KEY_STRIDE, METRICS, ROLLUP_TABLE
from latscope.attribution.table import BUCKET_COLUMN_LIST
from latscope.semconv import BUCKETS
from latscope.sqltext import render
from latscope.storage import Store
from latscope.windows import HEATMAP_METRICS, STEPS_S, choose_step

__all__ = [
    "HEATMAP_METRICS",
    "STEPS_S",
    "TimeseriesError",
    "choose_step",
    "heatmap",
    "timeseries",
]


#: Most groups a timeseries carries a series for (the whole window's aside).
MAX_SERIES = 50

#: A step given explicitly may make at most this many points.
MAX_POINTS = 2000
MIN_STEP_S = 1

_METRIC_INDEX = {name: i for i, name in enumerate(METRICS)}
#: Figures with percentiles per step (``HEATMAP_METRICS``), and their levels.
_SERIES_METRICS: dict[str, tuple[tuple[str, float], ...]] = {
    m: {"e2e": E2E_LEVELS, "ttft": STREAM_LEVELS, "tpot": STREAM_LEVELS}.get(m, BUCKET_LEVELS)
    for m in HEATMAP_METRICS
}

_SETTINGS = (
    "\nSETTINGS do_not_merge_across_partitions_select_final = 1, "
    "force_grouping_standard_compatibility = 1, group_by_use_nulls = 0"
)
_FILTERS = f"""
    AND {FILTERS}"""
_STEP_RAW = "intDiv(toUnixTimestamp(Timestamp), {step_s:UInt32})"
_STEP_ROLLUP = "intDiv(toUInt32(toUnixTimestamp(Timestamp)), {step_s:UInt32})"


def _bin_value_sql(b: str) -> str:
    """SQL twin of ``rollups.bin_value`` (the same operations in the same order)."""
    return (
        f"if({b} = 0, 0., exp(({b} - 1) * {math.log(rollups.GAMMA)!r}) * 2 * {rollups.GAMMA!r}"
        f" / ({rollups.GAMMA!r} + 1))"
    )


def quantiles_sql(levels: Sequence[float]) -> str:
    """SQL over ``bins`` (ascending) and ``cum`` (their running counts) giving the ``levels``
    as ``rollups.quantiles`` does: linear interpolation between order statistics, each read as
    its bin's value. Each level's two order statistics are found once (a scan of ``cum`` each),
    then read as values."""
    pos = "q * (cum[-1] - 1)"
    lo = f"floor({pos})"
    levels_sql = f"[{', '.join(repr(float(q)) for q in levels)}]"

    def index(k: str) -> str:
        return f"arrayMap(q -> arrayFirstIndex(x -> x > {k}, cum), {levels_sql})"

    stat_lo, stat_hi = _bin_value_sql("bins[i]"), _bin_value_sql("bins[j]")
    return (
        f"arrayMap((q, i, j) -> {stat_lo} + ({pos} - {lo}) * if({pos} > {lo}, "
        f"{stat_hi} - {stat_lo}, 0.), {levels_sql}, {index(lo)}, {index(f'{lo} + 1')})"
    )


def _prepare(
    store: Store,
    since_ns: int,
    until_ns: int,
    step_s: int,
    service: str | None,
    model: str | None,
    group_by: str | None,
    use_rollups: bool,
) -> WindowRead:
    params: dict[str, Any] = {"step_s": int(step_s), "service": service or "", "model": model or ""}
    # The whole window's series is the literal group ''.
    group = group_expr(group_by, params) if group_by else "''"
    wanted = [name for name, v in (("service", service), ("model", model)) if v]
    if group_by:
        wanted.append(group_by)
    return window.prepare(
        store,
        since_ns,
        until_ns,
        step_s=step_s,
        params=params,
        wanted=wanted,
        group=group,
        use_rollups=use_rollups,
    )


def _check_window(since_ns: int, until_ns: int, step_s: int | None) -> int:
    if until_ns <= since_ns:
        raise TimeseriesError(f"empty window: until ({until_ns}) must be after since ({since_ns})")
    window_s = (until_ns - since_ns) / 1e9
    step = choose_step(window_s) if step_s is None else int(step_s)
    if step < MIN_STEP_S or step > 400 * 86_400:
        raise TimeseriesError(f"step must be between {MIN_STEP_S} s and 400 days, got {step_s}")
    first, last = since_ns // (step * 10**9), (until_ns - 1) // (step * 10**9)
    if last - first + 1 > MAX_POINTS:
        raise TimeseriesError(
            f"a step of {step} s cuts this window into {last - first + 1} points; at most "
            f"{MAX_POINTS}: give a longer step"
        )
    return step


# -- over time -----------------------------------------------------------------------------------

_SCALARS = ", ".join(rollups.SCALAR_COLUMNS)
_TS_FIGURES_SQL = (
    """
SELECT step, grp, $TOTAL AS total, sum(Requests) AS n, sum(E2eSum) AS e2e_sum,
    sum(NetworkSum) AS network_sum, sum(NetworkCount) AS network_n,
"""
    + "".join(f"    sum({BUCKET_SUMS[b]}) AS {b}_sum,\n" for b in BUCKETS if b != "network")
    + """    sum(TtftSum) AS ttft_sum, sum(TtftCount) AS ttft_n,
    sum(TpotSum) AS tpot_sum, sum(TpotCount) AS tpot_n
FROM ($SOURCES)
GROUP BY $SETS
ORDER BY total, grp, step"""
    + _SETTINGS
)
_TS_ROLLUP_FIGURES = (
    f"SELECT {_STEP_ROLLUP} AS step, $GROUP AS grp, {_SCALARS} "
    f"FROM {ROLLUP_TABLE} WHERE $ROLLUP_WHERE"
)
_TS_RAW_FIGURES = (
    f"SELECT {_STEP_RAW} AS step, $GROUP AS grp, {rollups.SCALARS_SQL} "
    f"FROM $FROM WHERE $RANGES{_FILTERS} GROUP BY step, grp"
)

#: Histogram keys of the figures with percentiles per step (a subset of rollups.METRICS).
_KEYS = [_METRIC_INDEX[m] for m in _SERIES_METRICS]


def _keys_sql(keys: Sequence[int]) -> str:
    """Per attribution row, the histogram keys of its known figures among ``keys`` (metric
    indexes): only those figures are binned (a logarithm each)."""
    names = list(METRICS)
    return (
        "arrayFilter(k -> k != 65535, arrayMap((v, i) -> if(isNull(v), toUInt16(65535), "
        f"toUInt16(i * {KEY_STRIDE} + {rollups.bin_sql('assumeNotNull(v)')})), ["
        + ", ".join(f"toNullable(toFloat64({METRICS[names[k]]}))" for k in keys)
        + f"], [{', '.join(map(str, keys))}]))"
    )


#: Groups' series carry percentiles of e2e, TTFT and TPOT only (and every bucket's mean and
#: share): a third of the histogram rows to merge, and the figures a per-group chart shows.
_GROUP_KEYS = [_METRIC_INDEX[m] for m in ("e2e", "ttft", "tpot")]
#: ``$KEYS``: the histogram keys kept (``_hist_sources``).
_KEEP = f"intDiv(k, {KEY_STRIDE}) IN ($KEYS)"
#: Per step and group, each figure's histogram (rollup rows' and raw rows' bins merged), read as
#: percentiles inside ClickHouse; ``$SOURCES`` gives (step, grp, total, key, c) rows. A bin may
#: come several times (from each hour of the step, and from raw rows): it is not summed first,
#: as the percentiles read the same off the sorted bins either way (the running count passes a
#: rank inside a run of equal bins, whichever of them it is) and a GROUP BY per key cost more
#: than the rest of the query (a week by model: 1.2 s CPU with it, 0.7 s without).
_TS_HIST_SQL = (
    f"""
SELECT step, grp, total, metric, cum[-1] AS n, {quantiles_sql([0.5, 0.9, 0.95, 0.99])} AS q
FROM (
    SELECT step, grp, total, intDiv(key, {KEY_STRIDE}) AS metric,
           groupArray(key % {KEY_STRIDE}) AS unsorted, arraySort(unsorted) AS bins,
           arrayCumSum(arraySort((c, b) -> b, groupArray(c), unsorted)) AS cum
    FROM ($SOURCES)
    GROUP BY step, grp, total, metric
)"""
    + _SETTINGS
)
#: One level's histogram rows: ``$TOTAL`` 1 for the whole window's series.
_TS_HIST_PART = """SELECT step, grp, $TOTAL AS total, key, c
        FROM ($SOURCES)$WHERE"""
#: Only the groups answered (the ``limit_groups`` largest).
_WHERE_GROUPS = "\n        WHERE grp IN {groups:Array(String)}"
_TS_ROLLUP_HIST = (
    f"SELECT {_STEP_ROLLUP} AS step, $GROUP AS grp, key, c FROM {ROLLUP_TABLE} "
    f"ARRAY JOIN arrayFilter(k -> {_KEEP}, HistKeys) AS key, "
    f"arrayFilter((c, k) -> {_KEEP}, HistCounts, HistKeys) AS c WHERE $ROLLUP_WHERE"
)
_TS_RAW_HIST = (
    f"SELECT step, grp, key, count() AS c FROM (SELECT {_STEP_RAW} AS step, $GROUP AS grp, "
    "$RAW_KEYS AS keys FROM $FROM "
    f"WHERE $RANGES{_FILTERS}) ARRAY JOIN keys AS key GROUP BY step, grp, key"
)


def _hist_sources(read: WindowRead, keys: Sequence[int], prefix: str) -> str:
    """The histogram rows of ``read`` restricted to the figures ``keys``."""
    kept = {"KEYS": ", ".join(map(str, keys)), "RAW_KEYS": _keys_sql(keys)}
    return window.sources(read, _TS_ROLLUP_HIST, _TS_RAW_HIST, prefix, kept)


#: Positions of the levels in the quantile arrays above.
_LEVEL_AT = {0.5: 0, 0.9: 1, 0.95: 2, 0.99: 3}


def timeseries(
    store: Store,
    *,
    since_ns: int,
    until_ns: int,
    step_s: int | None = None,
    service: str | None = None,
    model: str | None = None,
    group_by: str | None = None,
    limit_groups: int = 10,
    use_rollups: bool = True,
) -> Timeseries:
    """Every figure of ``summary`` per time step: ``series`` holds the whole window (key "") and,
    with ``group_by``, its ``limit_groups`` largest groups (at most ``MAX_SERIES``), each with
    one point per step (steps without requests have count 0 and null figures).

    Steps start at multiples of ``step_s`` since the epoch (chosen from the window unless given:
    ``choose_step``); the first and last are cut to the window. ``share`` is the bucket's
    fraction of the step's e2e time; ``network`` means cover requests with a client span.
    Groups carry percentiles of e2e, TTFT and TPOT, and each bucket's mean and share (their
    bucket percentiles are null); the whole window's series has every percentile.
    """
    step = _check_window(since_ns, until_ns, step_s)
    # The groups' read and the whole window's (``_binned_quantiles``) plan the same hours.
    limit = bounded(limit_groups, 1, MAX_SERIES)
    with rollups.one_view():
        return _timeseries(
            store, since_ns, until_ns, step, service, model, group_by, limit, use_rollups
        )


def _timeseries(
    store: Store,
    since_ns: int,
    until_ns: int,
    step: int,
    service: str | None,
    model: str | None,
    group_by: str | None,
    limit_groups: int,
    use_rollups: bool,
) -> Timeseries:
    read = _prepare(store, since_ns, until_ns, step, service, model, group_by, use_rollups)
    grouped = bool(group_by)
    flag = "grouping(grp)" if grouped else "1"
    sets = "GROUPING SETS ((step, grp), (step))" if grouped else "step, grp"
    sources = window.sources(read, _TS_ROLLUP_FIGURES, _TS_RAW_FIGURES)
    sql = render(_TS_FIGURES_SQL, {"SOURCES": sources, "TOTAL": flag, "SETS": sets})
    figures = store.query_arrow(sql, read.params).to_pylist()
    counts: dict[str, int] = {}
    for row in figures:
        if not row["total"]:
            counts[row["grp"]] = counts.get(row["grp"], 0) + int(row["n"])
    keys = sorted(counts, key=lambda k: (-counts[k], k))[:limit_groups]
    total_n = sum(int(row["n"]) for row in figures if row["total"])
    if not read.plan.hours and total_n <= EXACT_MAX_REQUESTS:
        sql = _exact_quantiles(read, flag, sets)
        hists = store.query_arrow(sql, read.params).to_pylist()
    else:
        sql, read = _binned_quantiles(
            store,
            read,
            grouped,
            keys,
            len(counts),
            flag,
            (since_ns, until_ns, step),
            (service, model, use_rollups),
        )
        hists = store.query_arrow(sql, read.params).to_pylist()
    first = since_ns // (step * 10**9)
    last = (until_ns - 1) // (step * 10**9)
    wanted = {(True, "")} | {(False, k) for k in keys}
    by_series: dict[tuple[bool, str], dict[int, dict[str, Any]]] = {}
    for row in figures:
        series_key = (bool(row["total"]), "" if row["total"] else row["grp"])
        if series_key in wanted:
            by_series.setdefault(series_key, {})[int(row["step"])] = row
    quantiles: dict[tuple[bool, str, int, int], tuple[int, list[float]]] = {}
    for row in hists:
        series_key = (bool(row["total"]), "" if row["total"] else row["grp"])
        if series_key in wanted:
            quantiles[(*series_key, int(row["step"]), int(row["metric"]))] = (
                int(row["n"]),
                row["q"],
            )
    series = []
    for total, key in [(True, ""), *((False, k) for k in keys)]:
        rows = by_series.get((total, key), {})
        points = [
            _point(s, step, since_ns, until_ns, rows.get(s), quantiles, total, key)
            for s in range(first, last + 1)
        ]
        series.append(Series(key=key, count=sum(p.count for p in points), points=points))
    return Timeseries(
        window=Window.of(since_ns, until_ns),
        step_s=step,
        group_by=group_by,
        series=series,
        source=_source(read),
    )


def _binned_quantiles(
    store: Store,
    read: WindowRead,
    grouped: bool,
    keys: list[str],
    groups_seen: int,
    flag: str,
    window: tuple[int, int, int],
    filters: tuple[str | None, str | None, bool],
) -> tuple[str, WindowRead]:
    """Percentiles from the 1 % bins of rollup hours and raw rows (the read of the whole
    window's series, whose parameters the query needs, comes back with it)."""
    only = ""
    if grouped and len(keys) < groups_seen:
        read.params["groups"] = keys
        only = _WHERE_GROUPS
    # The whole window's series from its own (cheaper) rollup level, the groups' from theirs.
    parts = [
        render(
            _TS_HIST_PART,
            {
                "TOTAL": "1" if not grouped else "0",
                "WHERE": only,
                "SOURCES": _hist_sources(read, _GROUP_KEYS if grouped else _KEYS, "g_"),
            },
        )
    ]
    if grouped:
        since_ns, until_ns, step = window
        service, model, use_rollups = filters
        whole = _prepare(store, since_ns, until_ns, step, service, model, None, use_rollups)
        whole.params.update(read.params)
        parts.append(
            render(
                _TS_HIST_PART,
                {"TOTAL": "1", "WHERE": "", "SOURCES": _hist_sources(whole, _KEYS, "t_")},
            )
        )
        read = whole
    return render(_TS_HIST_SQL, {"SOURCES": "\n    UNION ALL\n    ".join(parts)}), read


#: Windows read wholly raw with at most this many requests get exact percentiles per step
#: (every value kept per step: 10 figures x 8 bytes a request, so at most about 160 MB), which
#: costs less than binning each request's figures; bigger ones are binned.
EXACT_MAX_REQUESTS = 2_000_000
_EXACT_COLUMNS = (
    f"Timestamp, E2eNs, {BUCKET_COLUMN_LIST}, TtftClientNs, TtftServerNs, TpotNs, "
    "ServiceName, Model, Route, Operation, "
    "StatusCode"
)
_TS_EXACT_SQL = (
    """
SELECT step, grp, $TOTAL AS total, count() AS n, """
    + ", ".join(
        f"quantilesExactInclusive(0.5, 0.9, 0.95, 0.99)({METRICS[m]}) AS q{_METRIC_INDEX[m]}"
        for m in _SERIES_METRICS
    )
    + f"""
FROM (SELECT {_STEP_RAW} AS step, $GROUP AS grp, * FROM ($ROWS))
GROUP BY $SETS"""
    + _SETTINGS
)


def _exact_quantiles(read: WindowRead, flag: str, sets: str) -> str:
    """Exact percentiles per step (and group) from the raw rows of a window read wholly raw."""
    columns = _EXACT_COLUMNS + (", ResourceAttributes" if "Resource" in read.group else "")
    rows = window.raw_rows(read.raw, read.params, columns, FILTERS)
    sql = render(_TS_EXACT_SQL, {"ROWS": rows, "GROUP": read.group, "TOTAL": flag, "SETS": sets})
    # The same rows as the binned query gives: one per (step, grp, total, metric).
    unpivot = ", ".join(f"({i}, q{i})" for i in _KEYS)
    return (
        "SELECT step, grp, total, m.1 AS metric, if(isNaN(m.2[1]), 0, n) AS n, m.2 AS q "
        f"FROM ({sql.removesuffix(_SETTINGS)}) ARRAY JOIN [{unpivot}] AS m" + _SETTINGS
    )


def _source(read: WindowRead) -> ReadSource:
    """How the answer was read: rollup hours and raw ranges (for the curious and the tests)."""
    return ReadSource(
        rollup_hours=len(read.plan.hours) if read.dims is not None else 0,
        raw_ranges=len(read.raw.clean) + len(read.raw.final),
        raw_final_ranges=len(read.raw.final),
    )


def _levels(
    found: tuple[int, list[float]] | None, levels: Sequence[tuple[str, float]]
) -> dict[str, float | None]:
    if not found or not found[0]:
        return {name: None for name, _ in levels}
    values = found[1]
    return {name: ms(values[_LEVEL_AT[q]]) for name, q in levels}


def _point(
    s: int,
    step: int,
    since_ns: int,
    until_ns: int,
    row: Mapping[str, Any] | None,
    quantiles: Mapping[tuple[bool, str, int, int], tuple[int, list[float]]],
    total: bool,
    key: str,
) -> StepPoint:
    n = int(row["n"]) if row else 0

    def q(metric: str) -> dict[str, float | None]:
        if not total and _METRIC_INDEX[metric] not in _GROUP_KEYS:
            return _levels(None, _SERIES_METRICS[metric])  # groups: means and shares only
        return _levels(
            quantiles.get((total, key, s, _METRIC_INDEX[metric])), _SERIES_METRICS[metric]
        )

    def mean(name: str, counted: str | None = None) -> float | None:
        """The mean of ``name`` over the step's requests, or over those ``counted`` has."""
        count = (int(row[counted] or 0) if counted else n) if row else 0
        return ms(float(row[f"{name}_sum"] or 0) / count) if row and count else None

    e2e_sum = float(row["e2e_sum"] or 0) if row else 0.0
    buckets = {}
    for bucket in BUCKETS:
        total_b = float(row[f"{bucket}_sum"] or 0) if row else 0.0
        buckets[bucket] = StepBucket(
            **q(bucket),
            mean=mean(bucket, "network_n" if bucket == "network" else None),
            share=(total_b / e2e_sum) if e2e_sum else None,
        )
    return StepPoint(
        start_ns=max(since_ns, s * step * 10**9),
        end_ns=min(until_ns, (s + 1) * step * 10**9),
        count=n,
        e2e_ms=StepPercentiles(**q("e2e"), mean=mean("e2e")),
        buckets_ms=buckets,
        ttft_ms=StepPercentiles(**q("ttft"), mean=mean("ttft", "ttft_n")),
        tpot_ms=StepPercentiles(**q("tpot"), mean=mean("tpot", "tpot_n")),
    )


# -- heatmap -------------------------------------------------------------------------------------

#: Fine (1 %) bins per decade of latency: ln(10) / ln(GAMMA), about 230.
FINE_PER_DECADE = math.log(10) / math.log(rollups.GAMMA)
BINS_PER_DECADE = (5, 10, 20, 46)

_HEAT_SQL = (
    """
SELECT step, if(bin = 0, -1, intDiv(bin - 1, {width:UInt16})) AS row, sum(c) AS n
FROM ($SOURCES)
GROUP BY step, row
ORDER BY step, row"""
    + _SETTINGS
)
_HEAT_ROLLUP = (
    f"SELECT {_STEP_ROLLUP} AS step, key % {KEY_STRIDE} AS bin, c FROM {ROLLUP_TABLE} "
    "ARRAY JOIN HistKeys AS key, HistCounts AS c "
    f"WHERE $ROLLUP_WHERE AND intDiv(key, {KEY_STRIDE}) = {{metric_index:UInt16}}"
)
#: ``$VALUE``: the metric's expression (``rollups.METRICS``), ``$BIN`` its bin.
_HEAT_RAW = (
    f"SELECT {_STEP_RAW} AS step, $BIN AS bin, count() AS c FROM $FROM "
    f"WHERE $RANGES{_FILTERS} AND $VALUE IS NOT NULL GROUP BY step, bin"
)


def heatmap(
    store: Store,
    *,
    since_ns: int,
    until_ns: int,
    step_s: int | None = None,
    metric: str = "e2e",
    service: str | None = None,
    model: str | None = None,
    bins_per_decade: int = 10,
    use_rollups: bool = True,
) -> Heatmap:
    """Requests per time step and latency bin of ``metric`` (e2e, a bucket, ttft or tpot).

    Latency bins are log-scaled: ``bins_per_decade`` per factor of ten, each the union of
    ``width`` consecutive 1 % bins of the rollup's histograms (so a bin's edges are
    ``GAMMA ** (row * width)`` ns). ``counts[i][j]`` is the number of requests of step ``i``
    (``times_ns[i]``) whose metric is in ``bins[j]`` (``[lo_ms, hi_ms)``); bins span the
    smallest to the largest value seen. Values below 1 ns (a bucket of 0) are counted apart, in
    ``zero_counts[i]``.
    """
    if metric not in HEATMAP_METRICS:
        raise TimeseriesError(f"metric {metric!r}: use one of {', '.join(HEATMAP_METRICS)}")
    if bins_per_decade not in BINS_PER_DECADE:
        raise TimeseriesError(
            f"bins_per_decade must be one of {', '.join(map(str, BINS_PER_DECADE))}"
        )
    step = _check_window(since_ns, until_ns, step_s)
    read = _prepare(store, since_ns, until_ns, step, service, model, None, use_rollups)
    width = round(FINE_PER_DECADE / bins_per_decade)
    expr = METRICS[metric]
    read.params.update(width=width, metric_index=_METRIC_INDEX[metric])
    metric_sql = {"BIN": rollups.bin_sql(f"assumeNotNull({expr})"), "VALUE": expr}
    sources = window.sources(read, _HEAT_ROLLUP, _HEAT_RAW, fragments=metric_sql)
    sql = render(_HEAT_SQL, {"SOURCES": sources})
    rows = store.query_rows(sql, read.params)
    first = since_ns // (step * 10**9)
    last = (until_ns - 1) // (step * 10**9)
    times = [max(since_ns, s * step * 10**9) for s in range(first, last + 1)]
    zeros = [0] * len(times)
    for s, row, n in rows:
        if int(row) < 0:
            zeros[int(s) - first] += int(n)
    rows = [r for r in rows if int(r[1]) >= 0]
    bins: list[HeatBin] = []
    counts: list[list[int]] = []
    if rows:
        lo_row = min(int(r[1]) for r in rows)
        hi_row = max(int(r[1]) for r in rows)
        counts = [[0] * (hi_row - lo_row + 1) for _ in times]
        for s, row, n in rows:
            counts[int(s) - first][int(row) - lo_row] += int(n)
        bins = [_heat_bin(r, width) for r in range(lo_row, hi_row + 1)]
    return Heatmap(
        window=Window.of(since_ns, until_ns),
        metric=metric,
        step_s=step,
        bins_per_decade=bins_per_decade,
        times_ns=times,
        bins=bins,
        counts=counts,
        zero_counts=zeros,
        count=sum(map(sum, counts)) + sum(zeros),
        max_count=max((max(row) for row in counts if row), default=0),
        source=_source(read),
    )


def heat_edge_ns(row: int, width: int) -> float:
    """The lower edge (ns) of heatmap row ``row``: ``GAMMA ** (row * width)``, the lower edge of
    its first 1 % bin (``rollups.bin_floor``)."""
    return rollups.bin_floor(row * width + 1)


def _heat_bin(row: int, width: int) -> HeatBin:
    return HeatBin(
        row=row,
        lo_ms=heat_edge_ns(row, width) / 1e6,
        hi_ms=heat_edge_ns(row + 1, width) / 1e6,
    )
