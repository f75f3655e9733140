"""Figures over time and the latency heatmap, against polars on the same rows: counts, means and
shares exact, percentiles within the bins' 0.5 %, the rollup path equal to the raw path, and a
heatmap rectangle selecting exactly the requests ``why`` counts in it."""

from __future__ import annotations

import uuid

import polars as pl
import pytest

from latscope.attribution import rollups
from latscope.attribution.answers import dimensions as dm
from latscope.attribution.answers import timeseries as ts
from latscope.attribution.rollups import HOUR_NS, Rollups
from latscope.attribution.table import BUCKET_COLUMNS
from latscope.semconv import BUCKETS
from latscope.storage import Store
from tests import planted

H = HOUR_NS
S = 10**9
MS = 1e6
T0 = 1_704_000_000 * S // H * H
#: Not on an hour at either end: partial edge hours read raw, whole hours from the rollup.
SINCE, UNTIL = T0 + 20 * 60 * S, T0 + 4 * H + 10 * 60 * S


@pytest.fixture(scope="module")
def data(store: Store) -> tuple[pl.DataFrame, str]:
    service = f"ts-{uuid.uuid4().hex[:6]}"
    df = planted.slow_pod(T0, service=service, span_ns=5 * H, n=5000, slow_from=T0 + 2 * H)
    planted.insert(store, df)
    Rollups(store, settle_s=0, margin_s=0).run_until_idle()
    return df, service


def within(x: float) -> object:
    return pytest.approx(x, rel=rollups.ALPHA + 1e-9, abs=1e-9)


def approx(x: float) -> object:
    return pytest.approx(x, rel=1e-9, abs=1e-9)


def check_point(point: dict, rows: pl.DataFrame, *, buckets: bool = True) -> None:
    assert point["count"] == rows.height
    if not rows.height:
        assert point["e2e_ms"]["p99"] is None and point["e2e_ms"]["mean"] is None
        return
    e2e = rows["E2eNs"].cast(pl.Float64)
    assert point["e2e_ms"]["mean"] == approx(e2e.mean() / MS)
    for name, q in (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99)):
        assert point["e2e_ms"][name] == within(e2e.quantile(q, "linear") / MS), name
    for b in BUCKETS:
        col = rows[BUCKET_COLUMNS[b]]
        figures = point["buckets_ms"][b]
        assert figures["share"] == approx(col.fill_null(0).sum() / e2e.sum()), b
        assert figures["mean"] == approx(col.drop_nulls().mean() / MS), b
        if buckets:
            want = col.drop_nulls().cast(pl.Float64).quantile(0.99, "linear") / MS
            assert figures["p99"] == within(want), b
    ttft = rows.select(pl.coalesce("TtftClientNs", "TtftServerNs")).to_series()
    assert point["ttft_ms"]["p95"] == within(ttft.cast(pl.Float64).quantile(0.95, "linear") / MS)
    assert point["tpot_ms"]["mean"] == approx(rows["TpotNs"].mean() / MS)


def steps(df: pl.DataFrame, step_s: int) -> dict[int, pl.DataFrame]:
    inside = df.filter((pl.col("Timestamp") >= SINCE) & (pl.col("Timestamp") < UNTIL))
    keyed = inside.with_columns(step=pl.col("Timestamp") // (step_s * S))
    return {int(k[0]): g for k, g in keyed.group_by("step")}


@pytest.mark.parametrize("step_s", [900, 3600])
def test_every_step_matches_polars(store: Store, data, step_s: int) -> None:
    df, service = data
    got = ts.timeseries(
        store, since_ns=SINCE, until_ns=UNTIL, step_s=step_s, service=service
    ).model_dump()
    assert got["step_s"] == step_s
    [series] = got["series"]
    groups = steps(df, step_s)
    first = SINCE // (step_s * S)
    assert len(series["points"]) == (UNTIL - 1) // (step_s * S) - first + 1
    for i, point in enumerate(series["points"]):
        assert point["start_ns"] == max(SINCE, (first + i) * step_s * S)
        check_point(point, groups.get(first + i, df.clear()))
    # Whole-hour steps take their whole hours from the rollup; shorter steps read raw.
    assert (got["source"]["rollup_hours"] > 0) == (step_s == 3600)
    raw = ts.timeseries(
        store, since_ns=SINCE, until_ns=UNTIL, step_s=step_s, service=service, use_rollups=False
    ).model_dump()
    # Read raw, the window is small: exact percentiles, which the binned ones are within 0.5 % of.
    assert raw["source"]["rollup_hours"] == 0
    for a, b in zip(got["series"][0]["points"], raw["series"][0]["points"], strict=True):
        assert a["count"] == b["count"]
        if a["count"]:
            assert a["e2e_ms"]["p99"] == within(b["e2e_ms"]["p99"])
        assert a["buckets_ms"]["queue"]["share"] == approx(b["buckets_ms"]["queue"]["share"])


def test_binned_and_exact_percentiles_agree(store: Store, data, monkeypatch) -> None:
    df, service = data
    exact = ts.timeseries(
        store, since_ns=SINCE, until_ns=UNTIL, step_s=900, service=service
    ).model_dump()
    monkeypatch.setattr(ts, "EXACT_MAX_REQUESTS", 0)  # every window binned
    binned = ts.timeseries(
        store, since_ns=SINCE, until_ns=UNTIL, step_s=900, service=service
    ).model_dump()
    for a, b in zip(exact["series"][0]["points"], binned["series"][0]["points"], strict=True):
        for bucket in ("queue", "decode"):
            if a["count"]:
                assert b["buckets_ms"][bucket]["p95"] == within(a["buckets_ms"][bucket]["p95"])
    rows = steps(df, 900)
    first = SINCE // (900 * S)
    for i, point in enumerate(exact["series"][0]["points"]):
        mine = rows.get(first + i, df.clear())
        if mine.height:  # exact: as polars computes it
            want = mine["E2eNs"].cast(pl.Float64).quantile(0.99, "linear") / MS
            assert point["e2e_ms"]["p99"] == approx(want)


def test_groups_carry_their_own_series(store: Store, data) -> None:
    df, service = data
    got = ts.timeseries(
        store, since_ns=SINCE, until_ns=UNTIL, step_s=3600, service=service,
        group_by="resource.k8s.pod.name", limit_groups=3,
    ).model_dump()  # fmt: skip
    total, *groups = got["series"]
    assert total["key"] == "" and len(groups) == 3
    pods = df.with_columns(pod=df["ResourceAttributes"].list.first().struct.field("value"))
    for series in groups:
        mine = pods.filter(pl.col("pod") == series["key"])
        by_step = steps(mine, 3600)
        first = SINCE // (3600 * S)
        for i, point in enumerate(series["points"]):
            check_point(point, by_step.get(first + i, mine.clear()), buckets=False)
            assert point["buckets_ms"]["queue"]["p99"] is None  # groups: means and shares only
    # The largest groups, largest first.
    counts = [s["count"] for s in groups]
    assert counts == sorted(counts, reverse=True)


def test_heatmap_counts_requests_per_step_and_bin(store: Store, data) -> None:
    df, service = data
    got = ts.heatmap(
        store, since_ns=SINCE, until_ns=UNTIL, step_s=3600, service=service
    ).model_dump()
    raw = ts.heatmap(
        store, since_ns=SINCE, until_ns=UNTIL, step_s=3600, service=service, use_rollups=False
    ).model_dump()
    assert got["counts"] == raw["counts"] and got["bins"] == raw["bins"]
    assert got["source"]["rollup_hours"] > 0
    width = round(ts.FINE_PER_DECADE / got["bins_per_decade"])
    first = SINCE // (3600 * S)
    want: dict[tuple[int, int], int] = {}
    inside = df.filter((pl.col("Timestamp") >= SINCE) & (pl.col("Timestamp") < UNTIL))
    for t, v in inside.select("Timestamp", "E2eNs").iter_rows():
        row = (rollups.bin_index(v) - 1) // width
        key = (t // (3600 * S) - first, row)
        want[key] = want.get(key, 0) + 1
    rows = [b["row"] for b in got["bins"]]
    have = {
        (i, rows[j]): c for i, counts in enumerate(got["counts"]) for j, c in enumerate(counts) if c
    }
    assert have == want
    assert got["count"] == inside.height

    # Brushing a rectangle selects exactly its requests.
    j0, j1 = len(rows) // 3, 2 * len(rows) // 3
    region = dm.Selection(
        "region", since_ns=got["times_ns"][1], until_ns=got["times_ns"][3],
        min_ms=got["bins"][j0]["lo_ms"], max_ms=got["bins"][j1]["hi_ms"],
    )  # fmt: skip
    brushed = sum(got["counts"][i][j] for i in (1, 2) for j in range(j0, j1 + 1))
    why = dm.why(
        store, since_ns=SINCE, until_ns=UNTIL, service=service, selection=region
    ).model_dump()
    assert why["selection"]["count"] == brushed > 0


def test_heatmap_of_a_bucket_counts_zeros_apart(store: Store, data) -> None:
    df, service = data
    got = ts.heatmap(
        store, since_ns=SINCE, until_ns=UNTIL, step_s=900, service=service, metric="other"
    ).model_dump()
    inside = df.filter((pl.col("Timestamp") >= SINCE) & (pl.col("Timestamp") < UNTIL))
    assert sum(got["zero_counts"]) == int((inside["OtherNs"] == 0).sum()) > 0
    assert got["count"] == inside.height
    assert got["bins"][0]["lo_ms"] < got["bins"][0]["hi_ms"]


def test_percentiles_read_the_same_off_repeated_bins(store: Store) -> None:
    """A step's histogram rows are not summed per bin before its percentiles are read (one row
    per bin and hour, and raw rows): a bin repeated, its count split, reads the same."""
    merged = ([3, 140, 141, 900], [5, 2, 7, 1])
    repeated = ([3, 3, 140, 141, 141, 141, 900], [2, 3, 2, 1, 4, 2, 1])
    levels = [0.5, 0.9, 0.95, 0.99]

    def read(bins: list[int], counts: list[int]) -> list[float]:
        sql = (
            f"SELECT {ts.quantiles_sql(levels)} FROM "
            "(SELECT {bins:Array(UInt16)} AS bins, arrayCumSum({counts:Array(UInt64)}) AS cum)"
        )
        return store.query_rows(sql, {"bins": bins, "counts": counts})[0][0]

    got = read(*repeated)
    assert got == read(*merged)
    assert got == pytest.approx(rollups.quantiles(*merged, levels), rel=1e-12)


def test_choosing_the_step() -> None:
    assert ts.choose_step(900) == 10
    assert ts.choose_step(3600) == 30
    assert ts.choose_step(6 * 3600) == 300
    assert ts.choose_step(86_400) == 3600  # a day or more: whole hours, from the rollup
    assert ts.choose_step(7 * 86_400) == 7200
    assert ts.choose_step(90 * 86_400) == 86_400


def test_bad_questions_say_what_to_write(store: Store) -> None:
    with pytest.raises(ts.TimeseriesError, match="at most 2000"):
        ts.timeseries(store, since_ns=T0, until_ns=T0 + 24 * H, step_s=10).model_dump()
    with pytest.raises(ts.TimeseriesError, match="group_by 'colour'"):
        ts.timeseries(store, since_ns=T0, until_ns=T0 + H, group_by="colour").model_dump()
    with pytest.raises(ts.TimeseriesError, match="metric 'latency'"):
        ts.heatmap(store, since_ns=T0, until_ns=T0 + H, metric="latency").model_dump()
    with pytest.raises(ts.TimeseriesError, match="empty window"):
        ts.heatmap(store, since_ns=T0, until_ns=T0).model_dump()
    with pytest.raises(ts.TimeseriesError, match="bins_per_decade"):
        ts.heatmap(store, since_ns=T0, until_ns=T0 + H, bins_per_decade=7).model_dump()
