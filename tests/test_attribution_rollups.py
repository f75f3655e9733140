"""Hourly rollups: answers from rollup hours equal the raw answers and polars' recomputation,
including after re-attribution (new versions, tombstones) of hours already built, a build cut
short, and hours where nothing survives FINAL."""

from __future__ import annotations

import random
import uuid

import polars as pl
import pytest

from latscope.attribution import aggregates as ag
from latscope.attribution import rollups
from latscope.attribution.attributor import Attributor, attributor_parts
from latscope.attribution.rollups import HOUR_NS, ROLLUP_TABLE, Rollups
from latscope.attribution.table import BUCKET_COLUMNS
from latscope.config import Settings
from latscope.semconv import BUCKETS
from latscope.storage import SPANS_TABLE, Store
from tests.attribution_support import MS as MS_NS
from tests.attribution_support import T0 as T1
from tests.attribution_support import server_spans, span_rows
from tests.rows_support import check_against, close, insert, make_rows

H = HOUR_NS
MS = 1e6
#: Hour-aligned, and hours apart from the other modules' data in the shared store.
T0 = 1_701_000_000 * 10**9 // H * H
#: Not on an hour at either end: partial edge hours, four whole hours in between.
WINDOW = {"since_ns": T0 + 17 * 60 * 10**9, "until_ns": T0 + 5 * H + 41 * 60 * 10**9}


def build(store: Store) -> Rollups:
    builder = Rollups(store, settle_s=0, margin_s=0)
    builder.run_until_idle()
    return builder


@pytest.fixture(scope="module")
def data(store: Store) -> tuple[pl.DataFrame, list[str]]:
    services = [f"roll-{uuid.uuid4().hex[:6]}", f"roll-{uuid.uuid4().hex[:6]}"]
    frames = [
        make_rows(2500, service=s, t0=T0, seed=21 + i, span_ns=6 * H)
        for i, s in enumerate(services)
    ]
    df = pl.concat(frames)
    # Older versions of 300 requests, with other numbers: FINAL must hide them in the rollup too.
    insert(store, df.sample(300, seed=3).with_columns(Version=pl.lit(2, pl.UInt64), E2eNs=1))
    insert(store, df)
    build(store)
    return df, services


def in_window(df: pl.DataFrame, since_ns: int, until_ns: int) -> pl.DataFrame:
    return df.filter((pl.col("Timestamp") >= since_ns) & (pl.col("Timestamp") < until_ns))


def test_plan_takes_whole_settled_hours_from_the_rollup(store: Store, data) -> None:
    p = rollups.plan(store, **WINDOW)
    assert [h for h, _ in p.hours] == [(T0 + i * H) // 10**9 for i in range(1, 5)]
    assert p.raw == [(WINDOW["since_ns"], T0 + H), (T0 + 5 * H, WINDOW["until_ns"])]
    short = rollups.plan(store, since_ns=T0 + H // 2, until_ns=T0 + 3 * H // 2)
    assert short.hours == [] and short.raw == [(T0 + H // 2, T0 + 3 * H // 2)]


@pytest.mark.parametrize(
    "query",
    [
        {},
        {"group_by": "model"},
        {"group_by": "service"},
        {"group_by": "route"},
        {"group_by": "operation"},
        {"group_by": "status"},
        {"group_by": "resource.k8s.pod.name"},
        {"group_by": "route", "limit_groups": 2},
        {"group_by": "resource.k8s.pod.name", "limit_groups": 1},
        {"service": 0},
        {"service": 0, "group_by": "route"},
        {"service": 1, "model": "m-large"},
        {"model": "m-small", "group_by": "service"},
    ],
)
def test_rollup_answers_equal_raw_answers(store: Store, data, query: dict) -> None:
    _, services = data
    if "service" in query:
        query = query | {"service": services[query["service"]]}
    got = ag.summary(store, **WINDOW, **query).model_dump()
    raw = ag.summary(store, **WINDOW, **query, use_rollups=False).model_dump()
    assert got["count"] > 0 and close(got, raw) == []
    if "limit_groups" in query:  # the largest groups, as the exact answer ranks them
        exact = ag.summary(store, **WINDOW, **query, exact=True).model_dump()
        assert [g["key"] for g in got["groups"]] == [g["key"] for g in exact["groups"]]
        assert len(got["groups"]) == query["limit_groups"]


@pytest.mark.parametrize("query", [{}, {"service": 0}, {"model": "m-large"}])
def test_rollup_tail_and_compare_equal_raw(store: Store, data, query: dict) -> None:
    _, services = data
    if "service" in query:
        query = query | {"service": services[query["service"]]}
    for percentile in (99, 90):
        got = ag.tail(store, **WINDOW, percentile=percentile, **query).model_dump()
        raw = ag.tail(
            store, **WINDOW, percentile=percentile, **query, use_rollups=False
        ).model_dump()
        assert got["tail_count"] > 0 and close(got, raw) == []
    windows = {"before": (T0 + 10**9, T0 + 3 * H + 7), "after": (T0 + 3 * H + 7, T0 + 6 * H)}
    got = ag.compare(store, **windows, **query).model_dump()
    assert close(got, ag.compare(store, **windows, **query, use_rollups=False).model_dump()) == []


def test_rollup_answers_match_polars(store: Store, data) -> None:
    df, services = data
    want = in_window(df, **WINDOW)
    check_against(ag.summary(store, **WINDOW).model_dump(), want)
    got = ag.summary(store, **WINDOW, service=services[1], group_by="model").model_dump()
    mine = want.filter(pl.col("ServiceName") == services[1])
    check_against(got, mine)
    for group in got["groups"]:
        check_against(group, mine.filter(pl.col("Model") == group["key"]))


def test_tail_bins_match_polars(store: Store, data) -> None:
    df, _ = data
    want = in_window(df, **WINDOW)
    got = ag.tail(store, **WINDOW, percentile=95).model_dump()
    e2e = want["E2eNs"].cast(pl.Float64)
    threshold = got["threshold_ms"] * MS
    # The threshold is the lower edge of the bin of the p95 request: at most 1 % below it.
    assert e2e.quantile(0.95, "lower") * (1 - 2 * rollups.ALPHA) <= threshold
    assert threshold <= e2e.quantile(0.95, "lower")
    bins = want.with_columns(bin=pl.col("E2eNs").map_elements(rollups.bin_index, pl.Int64))
    lo = rollups.bin_index(e2e.quantile(0.45, "lower"))
    hi = rollups.bin_index(e2e.quantile(0.55, "higher"))
    tail_rows = bins.filter(pl.col("bin") >= rollups.bin_index(threshold * (1 + 1e-12)))
    mid_rows = bins.filter(pl.col("bin").is_between(lo, hi))
    assert got["tail_count"] == tail_rows.height
    for bucket in BUCKETS:
        col = BUCKET_COLUMNS[bucket]
        extra = tail_rows[col].fill_null(0).mean() - mid_rows[col].fill_null(0).mean()
        assert got["buckets_ms"][bucket]["extra"] == pytest.approx(extra / MS, rel=1e-9)


def latest(df: pl.DataFrame, changed: pl.DataFrame) -> pl.DataFrame:
    """``df`` with the rows of ``changed``'s requests replaced by ``changed``."""
    return pl.concat([df.filter(~pl.col("TraceId").is_in(changed["TraceId"])), changed])


def test_reattributed_after_the_build_counts_once(store: Store) -> None:
    service = f"late-{uuid.uuid4().hex[:6]}"
    t0 = T0 + 24 * H
    df = make_rows(1500, service=service, t0=t0, seed=31, span_ns=6 * H)
    insert(store, df)
    build(store)
    window = {"since_ns": t0 + 5 * 60 * 10**9, "until_ns": t0 + 6 * H - 10**9}
    check_against(
        ag.summary(store, **window, service=service).model_dump(), in_window(df, **window)
    )
    hour = (t0 + 2 * H) // 10**9
    assert hour in [h for h, _ in rollups.plan(store, **window).hours]

    # New versions of hour 2's requests (a late span changed their numbers, same key), and
    # requests of hour 3 moved to hour 4 under another model (a late client span): tombstones
    # for their old keys.
    in_hour = pl.col("Timestamp").is_between(t0 + 2 * H, t0 + 3 * H, closed="left")
    redone = (
        df.filter(in_hour)
        .head(200)
        .with_columns(
            Version=pl.lit(9).cast(df.schema["Version"]),
            QueueNs=pl.col("QueueNs") + 2_000_000_000,
            E2eNs=pl.col("E2eNs") + 2_000_000_000,
        )
    )
    old = df.filter(pl.col("Timestamp").is_between(t0 + 3 * H, t0 + 4 * H, closed="left")).head(50)
    moved = old.with_columns(
        Timestamp=pl.col("Timestamp") + H,
        Model=pl.lit("m-moved"),
        Version=pl.lit(9).cast(df.schema["Version"]),
    )
    tombstones = old.with_columns(
        Version=pl.lit(9).cast(df.schema["Version"]),
        IsDeleted=pl.lit(1).cast(df.schema["IsDeleted"]),
    )
    insert(store, pl.concat([redone, moved, tombstones]))
    now = latest(df, pl.concat([redone, moved]))

    stale = {(t0 + i * H) // 10**9 for i in (2, 3, 4)}
    assert not stale & {h for h, _ in rollups.plan(store, **window).hours}
    got = ag.summary(store, **window, service=service, group_by="model").model_dump()
    check_against(got, in_window(now, **window))
    assert {g["key"] for g in got["groups"]} == {"m-small", "m-large", "m-moved"}
    assert close(got, ag.summary(store, **window, service=service, group_by="model",
                                 use_rollups=False).model_dump()) == []  # fmt: skip

    build(store)  # the changed hours are rebuilt from their FINAL rows
    assert stale <= {h for h, _ in rollups.plan(store, **window).hours}
    again = ag.summary(store, **window, service=service, group_by="model").model_dump()
    assert close(again, got) == []
    tail = ag.tail(store, **window, service=service).model_dump()
    assert (
        close(tail, ag.tail(store, **window, service=service, use_rollups=False).model_dump()) == []
    )


def test_a_build_cut_short_is_never_read(store: Store, data) -> None:
    hour = (T0 + 3 * H) // 10**9
    assert rollups.hour_states(store, hour, hour + 3600)[hour].usable
    # One row of the hour's build lost (as if the build's INSERT stopped half way).
    store.command(
        f"DELETE FROM {ROLLUP_TABLE} WHERE Timestamp = toDateTime({{h:UInt32}}, 'UTC') "
        "AND Dims = 8 AND Model = 'm-small'",
        {"h": hour},
    )
    assert not rollups.hour_states(store, hour, hour + 3600)[hour].usable
    assert hour not in [h for h, _ in rollups.plan(store, **WINDOW).hours]
    raw = ag.summary(store, **WINDOW, group_by="model", use_rollups=False).model_dump()
    assert close(ag.summary(store, **WINDOW, group_by="model").model_dump(), raw) == []
    builder = Rollups(store, settle_s=0, margin_s=0)
    assert hour in builder.due()[0]
    builder.run_until_idle()
    assert rollups.hour_states(store, hour, hour + 3600)[hour].usable
    assert close(ag.summary(store, **WINDOW, group_by="model").model_dump(), raw) == []


def test_the_builder_waits_for_settled_hours_and_quiet_ones(store: Store) -> None:
    service = f"wait-{uuid.uuid4().hex[:6]}"
    t0 = T0 + 48 * H
    df = make_rows(300, service=service, t0=t0, seed=41, span_ns=2 * H)
    insert(store, df)
    hours = {t0 // 10**9, (t0 + H) // 10**9}
    # Hours that ended less than settle_s ago wait (here: all of them).
    assert not hours & set(Rollups(store, settle_s=10**10).due()[0])
    # Rows written during the last margin_s: their hours wait for the cutoff to pass them.
    assert not hours & set(Rollups(store, settle_s=0, margin_s=3600).due()[0])
    assert hours <= set(Rollups(store, settle_s=0, margin_s=0).due()[0])
    build(store)
    # Written after the build and within the margin: not rebuilt yet, so read raw meanwhile.
    extra = make_rows(40, service=service, t0=t0, seed=42, span_ns=H)
    insert(store, extra)
    assert t0 // 10**9 not in Rollups(store, settle_s=0, margin_s=3600).due()[0]
    window = {"since_ns": t0, "until_ns": t0 + 2 * H}
    assert [h for h, _ in rollups.plan(store, **window).hours] == [(t0 + H) // 10**9]
    check_against(ag.summary(store, **window, service=service).model_dump(), pl.concat([df, extra]))


def test_an_hour_with_nothing_left_is_built_once(store: Store) -> None:
    service = f"gone-{uuid.uuid4().hex[:6]}"
    t0 = T0 + 72 * H
    row = make_rows(1, service=service, t0=t0, seed=51, span_ns=H)
    insert(store, row)
    insert(store, row.with_columns(Version=pl.lit(9), IsDeleted=pl.lit(1)))
    builder = Rollups(store, settle_s=0, margin_s=0)
    hour = t0 // 10**9
    assert hour in builder.due()[0]
    builder.run_until_idle()
    assert hour not in builder.due()[0]  # nothing survives FINAL: no rows, and no rebuild loop
    got = ag.summary(store, since_ns=t0, until_ns=t0 + H, service=service).model_dump()
    assert got["count"] == 0


def test_quantiles_from_bins_are_within_alpha_of_exact() -> None:
    rng = random.Random(5)
    samples = [
        [rng.lognormvariate(18, 1.5) for _ in range(2000)],
        [float(rng.randrange(0, 3) * 1_000_000) for _ in range(500)],  # ties and zeros
        [5e6],
        [1e6, 9e8],  # interpolation between two far-apart values
        [0.25, 3.0, 7.5, 1e12],
    ]
    for values in samples:
        by_bin: dict[int, int] = {}
        for v in values:
            by_bin[rollups.bin_index(v)] = by_bin.get(rollups.bin_index(v), 0) + 1
        bins = sorted(by_bin)
        levels = [0.0, 0.01, 0.45, 0.5, 0.9, 0.99, 1.0]
        got = rollups.quantiles(bins, [by_bin[b] for b in bins], levels)
        series = pl.Series(values)
        for level, value in zip(levels, got, strict=True):
            exact = series.quantile(level, "linear")
            # Values below 1 ns read as 0.
            assert value == pytest.approx(exact, rel=rollups.ALPHA + 1e-12, abs=1.0)
    for b in (1, 2, 100, 2000):
        assert rollups.bin_index(rollups.bin_value(b)) == b
        assert rollups.bin_index(rollups.bin_floor(b) * (1 + 1e-9)) == b


def test_levels_and_build_runs() -> None:
    assert rollups.level_for([]) == 0
    assert rollups.level_for(["model"]) == 8
    assert rollups.level_for(["service", "model"]) == 24
    assert rollups.level_for(["route"]) == 28
    assert rollups.level_for(["model", "status"]) == 25
    assert rollups.level_for(["route", "status"]) is None
    assert rollups.level_for(["resource.k8s.pod.name"]) is None
    assert rollups.level_for(["service"], tail=True) == 16
    day = 86_400 * 20_000
    hours = [day - 7200, day - 3600, day, day + 3600, day + 3 * 3600]
    assert rollups._runs(hours, 24) == [[day - 7200, day - 3600], [day, day + 3600], [day + 10800]]
    assert rollups._runs([day, day + 3600, day + 7200], 2) == [[day, day + 3600], [day + 7200]]


def test_the_attributor_process_keeps_rollups(store: Store) -> None:
    parts = attributor_parts(Settings(), store)
    assert [c.name for c in parts.components] == ["attributor", "rollups"]


@pytest.mark.slow
def test_a_late_client_span_after_the_build_through_the_attributor(store: Store) -> None:
    """The attributor's own re-attribution (a new row an hour earlier, under another model, and
    a tombstone for the old key) after the old hour's rollup was built: counted once."""
    service = f"e2e-{uuid.uuid4().hex[:6]}"
    trace_id = uuid.uuid4().hex
    s0 = T0 + 96 * H + 13 * 60 * 10**9  # 13 minutes into an hour
    spans = [{**span, "start": span["start"] - T1 + s0, "end": span["end"] - T1 + s0,
              "service": service} for span in server_spans()]  # fmt: skip
    attributor = Attributor(store, settle_s=0)
    store.insert_arrow(SPANS_TABLE, span_rows(trace_id, spans))
    attributor.run_until_idle()
    build(store)
    bounds = {"since_ns": s0 - 2 * H - 10**9, "until_ns": s0 + 2 * H}
    window = bounds | {"service": service}
    hour = s0 // H * H // 10**9
    assert hour in [h for h, _ in rollups.plan(store, **bounds).hours]
    first = ag.summary(store, **window).model_dump()
    assert first["count"] == 1 and first["e2e_ms"]["mean"] == pytest.approx(920)

    client = {"id": "c1" * 8, "kind": "Client", "start": s0 - H + 40 * MS_NS,
              "end": s0 + 1000 * MS_NS, "service": service,
              "attrs": {"gen_ai.request.model": "late-model"}}  # fmt: skip
    store.insert_arrow(SPANS_TABLE, span_rows(trace_id, [client]))
    attributor.run_until_idle()
    assert hour not in [h for h, _ in rollups.plan(store, **bounds).hours]
    e2e_ms = (client["end"] - client["start"]) / MS_NS
    for _ in range(2):  # before the rebuild (raw), then after it (rollup)
        got = ag.summary(store, **window, group_by="model").model_dump()
        assert got["count"] == 1 and got["e2e_ms"]["mean"] == pytest.approx(e2e_ms)
        assert [g["key"] for g in got["groups"]] == ["late-model"]
        assert (
            close(
                got, ag.summary(store, **window, group_by="model", use_rollups=False).model_dump()
            )
            == []
        )
        build(store)
    # The request's new hour is built; its old one holds only the replaced row and the tombstone
    # (nothing after FINAL: no rollup rows, read raw at no cost).
    assert [h for h, _ in rollups.plan(store, **bounds).hours] == [hour - 3600]
