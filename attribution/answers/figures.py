"""The figures of a set of requests, as the summary and compare report them: percentiles, means
and shares of e2e and of each bucket, and the streaming figures; the SQL that computes them
from raw rows, and one row of them as its model (``row_stats``).

Times are milliseconds (floats; ``None`` where there is no data).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from latscope.attribution.answers.common import ms
from latscope.attribution.answers.models import (
    BucketMeans,
    BucketStats,
    Percentiles,
    Stats,
    Streaming,
    StreamPercentiles,
    StreamStats,
    WhySide,
)
from latscope.attribution.table import BUCKET_COLUMNS
from latscope.semconv import BUCKETS

__all__ = [
    "BUCKET_LEVELS",
    "E2E_LEVELS",
    "EXACT_QUANTILES",
    "METRIC_LEVELS",
    "SHARE_SUMS",
    "STREAM_LEVELS",
    "bucket_shares",
    "levels_json",
    "row_stats",
    "stat_columns",
    "stats_or_empty",
]

#: Quantile levels of the e2e figure and of each bucket (the REST contract's keys).
E2E_LEVELS = (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99))
BUCKET_LEVELS = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
STREAM_LEVELS = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))

#: Quantile levels per histogram metric (the row keys are ``<metric>_q``).
METRIC_LEVELS = {
    "e2e": E2E_LEVELS,
    **dict.fromkeys(BUCKET_COLUMNS, BUCKET_LEVELS),
    **dict.fromkeys(("ttft", "ttft_server", "tpot", "itl_p50", "itl_p99"), STREAM_LEVELS),
}

#: Percentiles. ``exact=True``: linear interpolation between order statistics (numpy's and polars'
#: "linear", Excel's PERCENTILE.INC), from every value (each column is sorted: seconds over
#: millions of rows, always read raw). ``exact=False`` (the default): the same interpolation over
#: histograms with bins 1 % wide (``rollups.quantiles``), within 0.5 % of the exact value; the
#: histograms of settled hours come from the rollup. Counts, means and shares are exact either way.
EXACT_QUANTILES = "quantilesExactInclusive"


def _levels(levels: Sequence[tuple[str, float]]) -> str:
    return ", ".join(repr(q) for _, q in levels)


#: The sums each bucket's share of the window's time is read from (``bucket_shares``).
SHARE_SUMS = ",\n    ".join(
    ["sum(E2eNs) AS e2e_sum", *(f"sum({col}) AS {b}_sum" for b, col in BUCKET_COLUMNS.items())]
)


def bucket_shares(row: Mapping[str, Any]) -> dict[str, float | None]:
    """Each bucket's fraction of all end-to-end time, from the ``SHARE_SUMS`` columns of ``row``
    (None without any time)."""
    e2e_sum = float(row["e2e_sum"] or 0)
    return {b: float(row[f"{b}_sum"] or 0) / e2e_sum if e2e_sum else None for b in BUCKETS}


def stat_columns() -> str:
    """The columns of one stats row over raw requests (``exact=True``), as ``row_stats`` reads
    them."""
    fn = EXACT_QUANTILES
    parts = [
        "count() AS n",
        f"{fn}({_levels(E2E_LEVELS)})(E2eNs) AS e2e_q",
        "avg(E2eNs) AS e2e_mean",
        SHARE_SUMS,
    ]
    for bucket, col in BUCKET_COLUMNS.items():
        parts += [
            f"{fn}({_levels(BUCKET_LEVELS)})({col}) AS {bucket}_q",
            f"avg({col}) AS {bucket}_mean",
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


def levels_json(
    values: Sequence[float] | None, levels: Sequence[tuple[str, float]], n: int
) -> dict[str, float | None]:
    """Quantile values (ns, in ``levels``' order) -> ``{"p50": ms, ...}``; None without data."""
    if not values or n == 0:
        return {name: None for name, _ in levels}
    return {name: ms(v) for (name, _), v in zip(levels, values, strict=True)}


def row_stats(row: Mapping[str, Any]) -> Stats:
    """One stats row (the columns of ``stat_columns``) -> its figures."""
    n = int(row["n"] or 0)
    shares = bucket_shares(row)
    return Stats(
        count=n,
        with_client=int(row["with_client"] or 0),
        e2e_ms=Percentiles(
            **levels_json(row["e2e_q"], E2E_LEVELS, n), mean=ms(row["e2e_mean"]) if n else None
        ),
        buckets_ms={
            bucket: BucketStats(
                **levels_json(row[f"{bucket}_q"], BUCKET_LEVELS, n),
                mean=ms(row[f"{bucket}_mean"]) if n else None,
                share=shares[bucket],
            )
            for bucket in BUCKETS
        },
        streaming=Streaming(
            ttft_ms=StreamStats(
                **levels_json(row["ttft_q"], STREAM_LEVELS, n), mean=ms(row["ttft_mean"])
            ),
            ttft_server_ms=StreamPercentiles(**levels_json(row["ttft_server_q"], STREAM_LEVELS, n)),
            tpot_ms=StreamStats(
                **levels_json(row["tpot_q"], STREAM_LEVELS, n), mean=ms(row["tpot_mean"])
            ),
            itl_p50_ms=StreamPercentiles(**levels_json(row["itl_p50_q"], STREAM_LEVELS, n)),
            itl_p99_ms=StreamPercentiles(**levels_json(row["itl_p99_q"], STREAM_LEVELS, n)),
            itl_max_ms=ms(row["itl_max"]),
            stalls=int(row["stalls"] or 0),
            stalled_requests=int(row["stalled_requests"] or 0),
        ),
    )


#: A stats row of no requests.
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


def stats_or_empty(row: Mapping[str, Any] | None) -> Stats:
    """``row_stats`` of ``row``, or of no requests when it is None."""
    return row_stats(row) if row else row_stats({"n": 0} | _EMPTY_ROW)


S = TypeVar("S", bound=WhySide)


def side_means(n: int, sums: Mapping[str, float], side: type[S], **fields: Any) -> S:
    """Count and means (ms) of one side of a comparison (a selection and its baseline, warm-up
    and warm requests): e2e and each bucket, None when the side is empty; as ``side`` (a
    ``WhySide`` or a model extending it, whose other ``fields`` are given).

    >>> side_means(2, {"e2e": 3e6} | dict.fromkeys(BUCKETS, 1e6), WhySide).e2e_mean_ms
    1.5"""
    return side(
        count=n,
        e2e_mean_ms=ms(sums["e2e"] / n) if n else None,
        buckets_ms=BucketMeans(**{b: (ms(sums[b] / n) if n else None) for b in BUCKETS}),
        **fields,
    )
