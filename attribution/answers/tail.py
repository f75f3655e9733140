"""Where the slowest requests spend their extra time: each bucket's mean over the tail (e2e at or
above a percentile) minus its mean over the median requests. Means add up, so the buckets' extra
times add up to the tail's extra e2e.

>>> got = tail(store, since_ns=t0, until_ns=t1, percentile=99)  # doctest: +SKIP
>>> got.threshold_ms, got.tail_count, got.dominant, got.buckets_ms["queue"].extra  # doctest: +SKIP
(2210.4, 12, 'queue', 1830.2)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from latscope.attribution import rollups
from latscope.attribution.answers.common import (
    FROM,
    RAW_WHERE,
    SETTINGS,
    WHERE,
    filters,
    ms,
    query_dicts,
    window_params,
)
from latscope.attribution.answers.errors import AggregateError
from latscope.attribution.answers.figures import EXACT_QUANTILES
from latscope.attribution.answers.models import Tail, TailBucket, Window
from latscope.attribution.answers.window import PlannedWindow, plan_windows, planned_sources
from latscope.attribution.rollups import ROLLUP_TABLE
from latscope.attribution.table import BUCKET_COLUMNS
from latscope.semconv import BUCKETS
from latscope.sqltext import render
from latscope.storage import Store

__all__ = ["MEDIAN_BAND", "tail"]

#: The band of e2e that stands for "the median request": p45..p55, so that one odd request
#: cannot be the baseline the tail is measured against.
MEDIAN_BAND = (0.45, 0.55)

#: Thresholds first (``exact=True``): the pXX of e2e, and the median band's edges.
_BAND = f"{MEDIAN_BAND[0]!r}, {MEDIAN_BAND[1]!r}"
TAIL_THRESHOLDS_SQL = f"""
SELECT count() AS n, {EXACT_QUANTILES}({{q:Float64}}, {_BAND})(E2eNs) AS t
FROM {FROM}
WHERE {WHERE}{SETTINGS}
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
    FROM {FROM}
    WHERE {WHERE}
){SETTINGS}
"""

_TAIL_SUMS = rollups.TAIL_SUM_NAMES  # n, e2e, then each bucket

#: ``exact=False``: the e2e histogram with each bucket's sum per bin, over rollup and raw rows.
APPROX_TAIL_SQL = (
    f"""
SELECT bin, {", ".join(f"sum({name}) AS {name}" for name in _TAIL_SUMS)}
FROM ($SOURCES)
GROUP BY bin
ORDER BY bin"""
    + SETTINGS
)
_ROLLUP_TAIL = (
    f"SELECT bin, {', '.join(_TAIL_SUMS)} FROM {ROLLUP_TABLE} ARRAY JOIN TailBins AS bin, "
    + ", ".join(
        f"Tail{'Requests' if name == 'n' else name.capitalize()} AS {name}" for name in _TAIL_SUMS
    )
    + " WHERE $ROLLUP_WHERE"
)
_RAW_TAIL = dict.fromkeys(
    (False, True),
    f"SELECT {rollups.bin_sql('E2eNs')} AS bin, {rollups.TAIL_SUMS_SQL} "
    f"FROM {FROM} WHERE {RAW_WHERE} GROUP BY bin",
)


def _approx_tail(
    store: Store, w: PlannedWindow, params: Mapping[str, Any], q: float, dims: int | None
) -> tuple[float, dict[str, Any]] | None:
    """(threshold ns, TAIL_SQL's row) from the binned e2e: the tail is every request in the bin
    of the pXX request or above (the threshold is that bin's lower edge), the median band every
    request from the p45 request's bin to the p55 one's; means are exact over those requests."""
    qp = dict(params)
    sources = planned_sources([w], dims, qp, "''", _ROLLUP_TAIL, _RAW_TAIL)
    rows = query_dicts(store, render(APPROX_TAIL_SQL, {"SOURCES": sources}), qp)
    bins, counts = [int(r["bin"]) for r in rows], [int(r["n"]) for r in rows]
    if not counts:
        return None
    tail_bin = rollups.bin_of_rank(bins, counts, q, upper=False)
    mid_lo = rollups.bin_of_rank(bins, counts, MEDIAN_BAND[0], upper=False)
    mid_hi = rollups.bin_of_rank(bins, counts, MEDIAN_BAND[1], upper=True)
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
) -> Tail:
    """Where the slowest requests spend their extra time.

    For requests with e2e at or above the ``percentile``-th percentile, each bucket's mean minus
    its mean over the median requests (e2e in ``MEDIAN_BAND``, p45..p55): ``extra_ms`` per
    bucket adds up to the tail's extra e2e; ``dominant`` names the bucket with the most extra
    time. Unless ``exact``, the threshold is the lower edge of the 1 %-wide e2e bin that holds
    the pXX request (so at most 1 % below it) and the tail is every request from there up; means
    are exact.
    """
    if not 0 < percentile < 100:
        raise AggregateError(f"percentile must be between 0 and 100, got {percentile}")
    params = window_params(since_ns, until_ns, service, model)
    return _tail(store, params, percentile, service, model, exact, use_rollups)


def _tail(
    store: Store,
    params: dict[str, Any],
    percentile: float,
    service: str | None,
    model: str | None,
    exact: bool,
    use_rollups: bool,
) -> Tail:
    window = Window.of(params["since_ns"], params["until_ns"])
    if exact:
        params["q"] = percentile / 100
        first = query_dicts(store, TAIL_THRESHOLDS_SQL, params)[0]
        count = int(first["n"] or 0)
        if count == 0:
            return _no_tail(percentile, count, window)
        threshold, mid_lo, mid_hi = first["t"]
        params.update(threshold=float(threshold), mid_lo=float(mid_lo), mid_hi=float(mid_hi))
        row = query_dicts(store, TAIL_SQL, params)[0]
    else:
        (w,) = plan_windows(store, [(params["since_ns"], params["until_ns"])], use_rollups)
        level = rollups.level_for(filters(service, model), tail=True)
        found = _approx_tail(store, w, params, percentile / 100, level)
        if found is None:
            return _no_tail(percentile, 0, window)
        threshold, row = found
        count = int(row["n"])
    extra_total = (row["e2e_tail"] or 0) - (row["e2e_mid"] or 0)
    buckets = {}
    for bucket in BUCKETS:
        t, m = row[f"{bucket}_tail"] or 0.0, row[f"{bucket}_mid"] or 0.0
        buckets[bucket] = TailBucket(
            tail_mean=ms(t),
            median_mean=ms(m),
            extra=ms(t - m),
            extra_share=((t - m) / extra_total) if extra_total > 0 else None,
        )
    return Tail(
        percentile=percentile,
        count=count,
        threshold_ms=ms(threshold),
        tail_count=int(row["n_tail"]),
        tail_e2e_ms=ms(row["e2e_tail"]),
        median_e2e_ms=ms(row["e2e_mid"]),
        extra_e2e_ms=ms(extra_total),
        buckets_ms=buckets,
        dominant=max(BUCKETS, key=lambda b: buckets[b].extra or 0.0),
        window=window,
    )


def _no_tail(percentile: float, count: int, window: Window) -> Tail:
    """The answer over a window without requests (or, exact, without a tail to read)."""
    return Tail(
        percentile=percentile,
        count=count,
        threshold_ms=None,
        tail_count=0,
        tail_e2e_ms=None,
        median_e2e_ms=None,
        extra_e2e_ms=None,
        buckets_ms={},
        dominant=None,
        window=window,
    )
