"""Aggregates (ClickHouse SQL) checked against a polars recomputation on the same rows."""

from __future__ import annotations

import json
import uuid

import polars as pl
import pytest

from latscope.attribution import aggregates as ag
from latscope.attribution import rollups
from latscope.attribution.table import BUCKET_COLUMNS
from latscope.semconv import BUCKETS
from latscope.storage import Store
from tests.rows_support import MS, H, insert, make_rows, q


@pytest.fixture(scope="module")
def data(store: Store) -> tuple[pl.DataFrame, str, int]:
    service = f"agg-{uuid.uuid4().hex[:8]}"
    t0 = 1_700_000_000 * 10**9
    df = make_rows(3000, service=service, t0=t0, seed=11)
    # Stale versions of 200 requests, with wrong numbers: FINAL must hide them.
    stale = df.head(200).with_columns(
        Version=pl.lit(3, pl.UInt64), E2eNs=pl.col("E2eNs") * 50, QueueNs=pl.col("QueueNs") * 50
    )
    insert(store, stale)
    insert(store, df)
    return df, service, t0


def approx(x: float) -> object:
    return pytest.approx(x, rel=1e-9, abs=1e-9)


def test_summary_matches_polars(store: Store, data) -> None:
    df, service, t0 = data
    got = ag.summary(
        store, since_ns=t0, until_ns=t0 + 2 * H, service=service, exact=True
    ).model_dump()
    assert got["count"] == df.height
    for name, p in ag.E2E_LEVELS:
        assert got["e2e_ms"][name] == approx(q(df["E2eNs"], p))
    assert got["e2e_ms"]["mean"] == approx(df["E2eNs"].mean() / MS)
    total = df["E2eNs"].sum()
    for bucket in BUCKETS:
        col = df[BUCKET_COLUMNS[bucket]]
        figures = got["buckets_ms"][bucket]
        for name, p in ag.BUCKET_LEVELS:
            assert figures[name] == approx(q(col, p)), (bucket, name)
        assert figures["mean"] == approx(col.drop_nulls().mean() / MS)
        assert figures["share"] == approx(col.sum() / total)
    assert sum(v["share"] for v in got["buckets_ms"].values()) == approx(1.0)
    ttft = df.select(pl.coalesce("TtftClientNs", "TtftServerNs")).to_series()
    assert got["streaming"]["ttft_ms"]["p99"] == approx(q(ttft, 0.99))
    assert got["streaming"]["tpot_ms"]["p50"] == approx(q(df["TpotNs"], 0.5))
    assert got["streaming"]["stalled_requests"] == int((df["Stalls"] > 0).sum())
    assert got["groups"] == []


def test_default_percentiles_are_within_the_documented_error(store: Store, data) -> None:
    df, service, t0 = data
    got = ag.summary(store, since_ns=t0, until_ns=t0 + 2 * H, service=service).model_dump()
    assert got["count"] == df.height
    within = pytest.approx  # every percentile within ALPHA (0.5 %) of the exact one
    for name, p in ag.E2E_LEVELS:
        assert got["e2e_ms"][name] == within(q(df["E2eNs"], p), rel=rollups.ALPHA + 1e-9)
    for bucket in BUCKETS:
        col = df[BUCKET_COLUMNS[bucket]]
        for name, p in ag.BUCKET_LEVELS:
            want = q(col, p)
            assert got["buckets_ms"][bucket][name] == within(want, rel=rollups.ALPHA + 1e-9)
        assert got["buckets_ms"][bucket]["share"] == approx(col.sum() / df["E2eNs"].sum())
    for figure, column in (("tpot_ms", "TpotNs"), ("itl_p50_ms", "ItlP50Ns")):
        for name, p in ag.STREAM_LEVELS:
            want = q(df[column], p)
            assert got["streaming"][figure][name] == within(want, rel=rollups.ALPHA + 1e-9)


def test_default_tail_is_binned_and_exact_over_its_bins(store: Store, data) -> None:
    df, service, t0 = data
    got = ag.tail(
        store, since_ns=t0, until_ns=t0 + 2 * H, service=service, percentile=95
    ).model_dump()
    exact = ag.tail(
        store, since_ns=t0, until_ns=t0 + 2 * H, service=service, percentile=95, exact=True
    ).model_dump()
    # The threshold is the lower edge of the 1 %-wide bin holding the p95 request.
    assert exact["threshold_ms"] * (1 - 2 * rollups.ALPHA) <= got["threshold_ms"]
    assert got["threshold_ms"] <= exact["threshold_ms"]
    tail_rows = df.filter(pl.col("E2eNs") >= got["threshold_ms"] * MS)
    assert got["tail_count"] == tail_rows.height
    assert got["tail_e2e_ms"] == approx(tail_rows["E2eNs"].mean() / MS)
    assert got["dominant"] == exact["dominant"]


@pytest.mark.parametrize("group_by", ["model", "route", "resource.k8s.pod.name"])
def test_summary_groups_match_polars(store: Store, data, group_by: str) -> None:
    df, service, t0 = data
    got = ag.summary(
        store, since_ns=t0, until_ns=t0 + 2 * H, service=service, group_by=group_by, exact=True
    ).model_dump()
    if group_by == "resource.k8s.pod.name":
        key = df["ResourceAttributes"].list.first().struct.field("value")
    else:
        key = df["Model" if group_by == "model" else "Route"]
    want = df.with_columns(key=key).group_by("key").agg(
        n=pl.len(), p99=pl.col("E2eNs").quantile(0.99, "linear"), queue=pl.col("QueueNs").sum(),
        e2e=pl.col("E2eNs").sum(),
    )  # fmt: skip
    assert {g["key"] for g in got["groups"]} == set(want["key"])
    for g in got["groups"]:
        row = want.filter(pl.col("key") == g["key"]).row(0, named=True)
        assert g["count"] == row["n"]
        assert g["e2e_ms"]["p99"] == approx(row["p99"] / MS)
        assert g["buckets_ms"]["queue"]["share"] == approx(row["queue"] / row["e2e"])


def test_filters_and_window_bounds(store: Store, data) -> None:
    df, service, t0 = data
    got = ag.summary(
        store, since_ns=t0, until_ns=t0 + H, service=service, model="m-large", exact=True
    ).model_dump()
    want = df.filter((pl.col("Timestamp") < t0 + H) & (pl.col("Model") == "m-large"))
    assert got["count"] == want.height
    assert got["e2e_ms"]["p50"] == approx(q(want["E2eNs"], 0.5))
    empty = ag.summary(store, since_ns=t0 - H, until_ns=t0, service=service).model_dump()
    assert empty["count"] == 0 and empty["e2e_ms"]["p50"] is None
    with pytest.raises(ag.AggregateError):
        ag.summary(store, since_ns=t0, until_ns=t0, service=service).model_dump()
    with pytest.raises(ag.AggregateError, match="group_by"):
        ag.summary(store, since_ns=t0, until_ns=t0 + H, group_by="nope; DROP TABLE x").model_dump()


def test_tail_matches_polars(store: Store, data) -> None:
    df, service, t0 = data
    got = ag.tail(
        store, since_ns=t0, until_ns=t0 + 2 * H, service=service, percentile=95, exact=True
    ).model_dump()
    e2e = df["E2eNs"].cast(pl.Float64)
    thr, lo, hi = (e2e.quantile(p, "linear") for p in (0.95, 0.45, 0.55))
    tail_rows = df.filter(pl.col("E2eNs") >= thr)
    mid_rows = df.filter(pl.col("E2eNs").is_between(lo, hi))
    assert got["threshold_ms"] == approx(thr / MS)
    assert got["tail_count"] == tail_rows.height
    extras = {}
    for bucket in BUCKETS:
        col = BUCKET_COLUMNS[bucket]
        extra = tail_rows[col].fill_null(0).mean() - mid_rows[col].fill_null(0).mean()
        extras[bucket] = extra / MS
        assert got["buckets_ms"][bucket]["extra"] == approx(extra / MS)
    assert sum(extras.values()) == pytest.approx(got["extra_e2e_ms"])
    assert got["dominant"] == max(extras, key=extras.__getitem__)


def test_compare_names_the_mover(store: Store) -> None:
    service = f"cmp-{uuid.uuid4().hex[:8]}"
    t0 = 1_700_100_000 * 10**9
    before = make_rows(800, service=service, t0=t0, seed=1, span_ns=H)
    after = make_rows(800, service=service, t0=t0 + H, seed=2, span_ns=H).with_columns(
        PrefillNs=pl.col("PrefillNs") + 150_000_000, E2eNs=pl.col("E2eNs") + 150_000_000
    )
    insert(store, pl.concat([before, after]))
    got = ag.compare(
        store, before=(t0, t0 + H), after=(t0 + H, t0 + 2 * H), service=service, exact=True
    ).model_dump()
    assert got["mover"] == "prefill"
    assert got["before"]["count"] == got["after"]["count"] == 800
    for bucket in BUCKETS:
        col = BUCKET_COLUMNS[bucket]
        d = after[col].cast(pl.Float64).quantile(0.99, "linear") - before[col].cast(
            pl.Float64
        ).quantile(0.99, "linear")
        assert got["buckets_ms"][bucket]["p99"]["delta"] == approx(d / MS)
    assert got["e2e_ms"]["mean"]["delta"] == approx(
        (after["E2eNs"].mean() - before["E2eNs"].mean()) / MS
    )


def test_diagnose_names_queue_when_the_tail_waits(store: Store) -> None:
    service = f"diag-{uuid.uuid4().hex[:8]}"
    t0 = 1_700_200_000 * 10**9
    df = make_rows(1000, service=service, t0=t0, seed=5).with_columns(
        # The slowest 2 % wait 20 s in the queue.
        QueueNs=pl.when(pl.int_range(pl.len()) % 50 == 0)
        .then(20_000_000_000)
        .otherwise(pl.col("QueueNs"))
    )
    df = df.with_columns(
        E2eNs=pl.sum_horizontal(*(pl.col(c).fill_null(0) for c in BUCKET_COLUMNS.values()))
    )
    insert(store, df)
    got = ag.diagnose(store, since_ns=t0, until_ns=t0 + 2 * H, service=service).model_dump()
    assert got["count"] == 1000
    assert got["tail_dominant"] == "queue"
    ids = [v["id"] for v in got["verdicts"]]
    assert "queue_tail" in ids
    verdict = got["verdicts"][ids.index("queue_tail")]
    assert verdict["evidence"]["queue_extra_ms"] > 10_000
    assert verdict["fixes"]


def test_slo_budget_and_burn_rates(store: Store) -> None:
    service = f"slo-{uuid.uuid4().hex[:8]}"
    now = 1_700_300_000 * 10**9
    df = make_rows(2000, service=service, t0=now - 24 * H, seed=9, span_ns=24 * H)
    insert(store, df)
    objective = ag.Objective("e2e", threshold_ms=3000, target=0.99, window_days=30)
    got = ag.slo(store, objectives=[objective], now_ns=now, service=service).model_dump()[
        "objectives"
    ][0]
    bad = df.filter(pl.col("E2eNs") > 3000 * MS)
    assert got["total"] == df.height and got["bad"] == bad.height
    assert got["budget_left"] == approx(1 - (bad.height / df.height) / 0.01)
    last_hour = df.filter(pl.col("Timestamp") >= now - H)
    bad_hour = last_hour.filter(pl.col("E2eNs") > 3000 * MS)
    assert got["burn_rates"]["1h"] == approx((bad_hour.height / last_hour.height) / 0.01)
    assert got["alerts"]["fast_burn"] == (
        got["burn_rates"]["1h"] > 14.4 and (got["burn_rates"]["5m"] or 0) > 14.4
    )
    with pytest.raises(ag.AggregateError):
        ag.slo(
            store, objectives=[{"metric": "latency", "threshold_ms": 1}], now_ns=now
        ).model_dump()


def test_helpers(store: Store, data) -> None:
    df, service, t0 = data
    top = ag.slowest(store, since_ns=t0, until_ns=t0 + 2 * H, service=service, limit=3).requests
    assert [r.e2e_ms for r in top] == [v / MS for v in df["E2eNs"].sort(descending=True)[:3]]
    seen = ag.services(store, since_ns=t0, until_ns=t0 + 2 * H).services
    mine = next(s for s in seen if s.service == service)
    assert mine.count == df.height
    gpu = ag.gpu_by_phase(store, since_ns=t0, until_ns=t0 + 2 * H, service=service)
    assert gpu.phases["decode"]["energy_mj"].total == approx(float(sum(range(df.height))))


@pytest.mark.slow
@pytest.mark.parametrize("offset", [0, -10 * H])  # the data's window, and an empty one
def test_answers_are_strict_json(store: Store, data, offset: int) -> None:
    _, service, t0 = data
    w = {"since_ns": t0 + offset, "until_ns": t0 + offset + 2 * H}
    mid = t0 + offset + H
    answers = [
        ag.summary(store, **w, service=service, group_by="model"),
        ag.tail(store, **w, service=service),
        ag.compare(store, before=(w["since_ns"], mid), after=(mid, w["until_ns"])),
        ag.diagnose(store, **w, service=service),
        ag.slo(store, objectives=[ag.Objective("ttft", 500)], now_ns=mid, service=service),
        ag.slowest(store, **w, service=service, limit=2),
        ag.services(store, **w),
        ag.gpu_by_phase(store, **w, service=service),
    ]
    json.dumps([answer.json_dict() for answer in answers], allow_nan=False)


def test_diagnose_prefill_and_stalls_and_peak(store: Store) -> None:
    service = f"diag2-{uuid.uuid4().hex[:8]}"
    t0 = 1_700_400_000 * 10**9
    n = 1200
    df = make_rows(n, service=service, t0=t0, seed=8, span_ns=H).with_columns(
        # prefill (and so TTFT) grows with the prompt; a quarter of the streams stall.
        PrefillNs=pl.col("InputTokens").cast(pl.UInt64) * 200_000,
        Stalls=(pl.int_range(pl.len()) % 4 == 0).cast(pl.UInt32),
        DecodeNs=pl.col("DecodeNs") // 10,
        QueueNs=pl.col("QueueNs") % 200_000_000,  # no random queue outliers: only the peaks
    )
    # Busy minutes (every 6th gets 10x the requests) queue for much longer.
    minute = (pl.col("Timestamp") - t0) // (60 * 10**9)
    df = df.with_columns(
        Timestamp=pl.when(pl.int_range(pl.len()) % 3 == 0)
        .then(t0 + (minute // 6 * 6) * 60 * 10**9 + pl.col("Timestamp") % (60 * 10**9))
        .otherwise(pl.col("Timestamp"))
        .cast(pl.Int64)
    )
    busy = ((pl.col("Timestamp") - t0) // (60 * 10**9)) % 6 == 0
    df = df.with_columns(
        QueueNs=pl.when(busy).then(pl.col("QueueNs") + 1_500_000_000).otherwise(pl.col("QueueNs"))
    )
    total = pl.sum_horizontal(*(pl.col(c).fill_null(0) for c in BUCKET_COLUMNS.values()))
    df = df.with_columns(
        E2eNs=total.cast(pl.UInt64),
        TtftServerNs=(pl.col("QueueNs") + pl.col("PrefillNs")).cast(pl.Int64),
    ).with_columns(TtftClientNs=pl.lit(None, pl.Int64))
    insert(store, df)
    got = ag.diagnose(store, since_ns=t0, until_ns=t0 + 2 * H, service=service).model_dump()
    verdicts = {v["id"]: v for v in got["verdicts"]}
    assert {"prefill_prompt_length", "decode_stalls", "peak_only"} <= verdicts.keys(), verdicts
    assert verdicts["decode_stalls"]["evidence"]["stalled_requests"] == n // 4
    assert verdicts["prefill_prompt_length"]["evidence"]["prefill_ms_per_1k_tokens"] == (
        pytest.approx(200, rel=1e-6)
    )
    assert verdicts["peak_only"]["evidence"]["load_vs_p95_corr"] > 0.6
