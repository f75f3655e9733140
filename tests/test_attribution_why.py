"""What is different, cold starts and the SLO's budget by bucket, against the embedded store with
planted causes (a pod slow in queue, a tenant with long prompts, a scale-up): the ranking names
each cause first, every bucket split adds up, and polars recomputes every figure from the rows."""

from __future__ import annotations

import uuid

import numpy as np
import polars as pl
import pytest

from latscope.attribution import aggregates as ag
from latscope.attribution import rollups
from latscope.attribution.answers import coldstart as cs
from latscope.attribution.answers import dimensions as dm
from latscope.attribution.answers import window
from latscope.attribution.rollups import HOUR_NS, Rollups
from latscope.attribution.table import BUCKET_COLUMNS
from latscope.semconv import BUCKETS
from latscope.storage import Store
from tests import planted

H = HOUR_NS
S = 10**9
MS = 1e6
#: Hours of this module's data, apart from the other modules' in the shared store.
T0 = 1_703_000_000 * S // H * H


def _service(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def chat(store: Store) -> tuple[pl.DataFrame, str]:
    service = _service("chat")
    df = planted.slow_pod(T0, service=service, slow_from=T0 + 90 * 60 * S)
    planted.insert(store, df)
    return df, service


@pytest.fixture(scope="module")
def rag(store: Store) -> tuple[pl.DataFrame, str, list[str]]:
    service = _service("rag")
    df, tenants = planted.long_prompts(T0, service=service)
    planted.insert(store, df)
    planted.insert_tenant_spans(store, df, tenants)
    return df, service, tenants


@pytest.fixture(scope="module")
def gen(store: Store) -> tuple[pl.DataFrame, str, np.ndarray]:
    service = _service("gen")
    df, cold = planted.scale_up(T0, service=service, scale_at=T0 + 90 * 60 * S)
    planted.insert(store, df)
    return df, service, cold


def _pod(df: pl.DataFrame) -> pl.Series:
    return df["ResourceAttributes"].list.first().struct.field("value")


def _means(df: pl.DataFrame) -> dict[str, float]:
    """Mean e2e and buckets (ns), network 0 where unknown."""
    out = {"e2e": float(df["E2eNs"].mean())}
    for b in BUCKETS:
        out[b] = float(df[BUCKET_COLUMNS[b]].fill_null(0).mean())
    return out


def approx(x: float) -> object:
    return pytest.approx(x, rel=1e-9, abs=1e-6)


def check_value(value: dict, inside: pl.DataFrame, outside: pl.DataFrame, has: pl.Series) -> None:
    """One ranked value against polars: counts, shares, and its extra time split into buckets.
    ``has`` marks the requests with the value, over ``inside`` then ``outside``."""
    has_in, has_out = has.head(inside.height), has.tail(outside.height)
    mine = inside.filter(has_in)
    assert value["in_count"] == mine.height
    assert value["out_count"] == int(has_out.sum())
    assert value["in_share"] == approx(mine.height / inside.height)
    assert value["out_share"] == approx(int(has_out.sum()) / outside.height)
    base, sel = _means(outside), _means(mine)
    assert value["extra_ms"] == approx((sel["e2e"] - base["e2e"]) / MS)
    for b in BUCKETS:
        assert value["buckets_ms"][b] == approx((sel[b] - base[b]) / MS), b
    # The seven extras add up to the extra e2e, exactly (means are additive).
    assert sum(value["buckets_ms"].values()) == approx(value["extra_ms"])


def split(df: pl.DataFrame, inside: pl.Series) -> tuple[pl.DataFrame, pl.DataFrame]:
    tagged = df.with_columns(__in=inside)
    return tagged.filter(pl.col("__in")), tagged.filter(~pl.col("__in"))


def test_a_pod_slow_in_queue_is_named_first(store: Store, chat) -> None:
    df, service = chat
    got = dm.why(store, since_ns=T0, until_ns=T0 + 3 * H, service=service).model_dump()
    threshold = got["selection"]["threshold_ms"] * MS
    exact = df["E2eNs"].quantile(0.99, "lower")
    # The selection starts at the lower edge of the 1 % bin holding the p99 request.
    assert exact * (1 - 2 * rollups.ALPHA) <= threshold <= exact
    inside, outside = split(df, df["E2eNs"] >= threshold)
    assert got["selection"]["count"] == inside.height
    assert got["baseline"]["count"] == outside.height
    first = got["dimensions"][0]
    assert first["dimension"] in ("resource.k8s.pod.name", "resource.service.instance.id")
    assert first["values"][0]["value"] == f"{service}-5"
    top = got["top"]
    assert (top["dimension"], top["value"], top["dominant"]) == (
        first["dimension"], f"{service}-5", "queue",
    )  # fmt: skip
    # Polars: the pod's share inside and outside, and the score is their difference.
    pods_in, pods_out = _pod(inside), _pod(outside)
    want_in = float((pods_in == f"{service}-5").mean())
    want_out = float((pods_out == f"{service}-5").mean())
    value = first["values"][0]
    assert value["in_share"] == approx(want_in) and value["out_share"] == approx(want_out)
    assert first["score"] == approx(want_in - want_out)
    assert value["out_count"] == int((pods_out == f"{service}-5").sum())
    check_value(value, inside, outside, pl.concat([pods_in, pods_out]) == f"{service}-5")
    # Every value listed of every dimension adds up the same way.
    for dim in got["dimensions"]:
        for v in dim["values"]:
            assert sum(v["buckets_ms"].values()) == approx(v["extra_ms"]), dim["dimension"]
    # Values of one dimension, weighted by their counts, carry the selection's whole extra.
    pods = next(d for d in got["dimensions"] if d["dimension"] == "resource.k8s.pod.name")
    everything = dm.why(
        store, since_ns=T0, until_ns=T0 + 3 * H, service=service, limit_values=50,
        dimensions=[], resources=["k8s.pod.name"],
    ).model_dump()  # fmt: skip
    assert pods["values_seen"] == 8
    carried = sum(v["extra_share"] for v in everything["dimensions"][0]["values"])
    assert carried == approx(1.0)
    base, sel = _means(outside), _means(inside)
    assert got["extra_e2e_ms"] == approx((sel["e2e"] - base["e2e"]) / MS)
    assert sum(got["extra_buckets_ms"].values()) == approx(got["extra_e2e_ms"])
    # Since when: the step in which the pod's slow requests began.
    assert abs(top["since_ns"] - (T0 + 90 * 60 * S)) <= 120 * S
    assert len(got["examples"]) == 5
    assert got["examples"][0]["e2e_ms"] == approx(float(df["E2eNs"].max()) / MS)


def test_a_tenant_with_long_prompts_is_named_first(store: Store, rag) -> None:
    df, service, tenants = rag
    got = dm.why(
        store, since_ns=T0, until_ns=T0 + 3 * H, service=service,
        selection=dm.Selection("percentile", metric="ttft", percentile=95),
        attributes=["tenant.id"],
    ).model_dump()  # fmt: skip
    top = got["top"]
    assert (top["dimension"], top["value"], top["dominant"]) == (
        "attribute.tenant.id", planted.TENANT, "prefill",
    )  # fmt: skip
    tagged = df.with_columns(tenant=pl.Series(tenants))
    ttft = df["TtftClientNs"].fill_null(df["TtftServerNs"])
    inside, outside = split(tagged, ttft >= got["selection"]["threshold_ms"] * MS)
    value = got["dimensions"][0]["values"][0]
    check_value(value, inside, outside, pl.concat([inside["tenant"], outside["tenant"]]) == "acme")
    # The prompt-length band is the symptom: it ranks, below the tenant that sends them.
    names = [d["dimension"] for d in got["dimensions"]]
    assert names.index("input_tokens") > names.index("attribute.tenant.id")


def test_the_scale_up_is_flagged_as_warm_up(store: Store, gen) -> None:
    df, service, cold = gen
    since, until = T0 + 30 * 60 * S, T0 + 3 * H
    rule = cs.WarmupRule(warmup_requests=0, warmup_s=planted.COLD_S)
    got = cs.coldstart(
        store, since_ns=since, until_ns=until, service=service, rule=rule
    ).model_dump()
    in_window = (df["Timestamp"] >= since) & (df["Timestamp"] < until)
    cold_s = pl.Series(cold)
    warm_up, warm = df.filter(in_window & cold_s), df.filter(in_window & ~cold_s)
    assert got["warmup"]["count"] == warm_up.height == int(cold.sum()) > 5
    assert got["warm"]["count"] == warm.height
    assert got["appeared"] == 2
    assert got["dominant"] == "prefill"
    up, down = _means(warm_up), _means(warm)
    assert got["extra_e2e_ms"] == approx((up["e2e"] - down["e2e"]) / MS)
    for b in BUCKETS:
        assert got["extra_buckets_ms"][b] == approx((up[b] - down[b]) / MS), b
    assert sum(got["extra_buckets_ms"].values()) == approx(got["extra_e2e_ms"])
    [event] = got["scale_ups"]
    assert sorted(event["replicas"]) == [f"{service}/{r}" for r in planted.NEW_REPLICAS]
    firsts = {r: int(df.filter(_pod(df) == r)["Timestamp"].min()) for r in planted.NEW_REPLICAS}
    assert event["at_ns"] == min(firsts.values())
    new = {r["replica"]: r for r in got["replicas"] if r["appeared"] and r["warmup_requests"]}
    assert set(new) == set(planted.NEW_REPLICAS)
    for name, first in firsts.items():
        assert new[name]["first_seen_ns"] == first
        assert new[name]["warm_from_ns"] == first + planted.COLD_S * S

    # The first-N rule: each new replica's first 3 requests, whatever their time.
    by_count = cs.coldstart(
        store, since_ns=since, until_ns=until, service=service,
        rule=cs.WarmupRule(warmup_requests=3, warmup_s=0),
    ).model_dump()  # fmt: skip
    assert by_count["warmup"]["count"] == 3 * len(planted.NEW_REPLICAS)

    # Diagnose names it, with the usual fixes and the replicas.
    verdicts = ag.diagnose(
        store, since_ns=since, until_ns=until, service=service, warmup=rule
    ).model_dump()
    cold_start = next(v for v in verdicts["verdicts"] if v["id"] == "cold_start")
    assert cold_start["bucket"] == "prefill"
    assert any("pre-warm" in fix for fix in cold_start["fixes"])
    assert sorted(cold_start["evidence"]["replicas"]) == sorted(
        f"{service}/{r}" for r in planted.NEW_REPLICAS
    )


def test_the_fleet_present_when_the_data_begins_is_not_a_cold_start(store: Store) -> None:
    # Three replicas serving from the first request of the service's data (latscope just
    # started): none appeared, so no request is warm-up; a replica added an hour later is.
    service = _service("fleet")
    start = T0 + H
    df, _ = planted.scale_up(start, service=service, span_ns=2 * H, scale_at=start + H)
    planted.insert(store, df)
    rule = cs.WarmupRule(warmup_requests=5, warmup_s=0)
    answer = cs.coldstart(
        store, since_ns=start - 10 * 60 * S, until_ns=start + 30 * 60 * S, service=service,
        rule=rule,
    )  # fmt: skip
    before = answer.model_dump()
    assert before["appeared"] == 0 and before["warmup"]["count"] == 0
    assert not any(r["appeared"] for r in before["replicas"])
    assert before["warm"]["count"] == df.filter(pl.col("Timestamp") < start + 30 * 60 * S).height
    assert cs.verdict(answer) is None
    after = cs.coldstart(
        store, since_ns=start, until_ns=start + 2 * H, service=service, rule=rule
    ).model_dump()
    assert sorted(r["replica"] for r in after["replicas"] if r["appeared"]) == sorted(
        planted.NEW_REPLICAS
    )
    assert after["warmup"]["count"] == 5 * len(planted.NEW_REPLICAS)


def test_diagnose_names_where_and_since_when(store: Store, chat) -> None:
    _, service = chat
    got = ag.diagnose(store, since_ns=T0, until_ns=T0 + 3 * H, service=service).model_dump()
    queue = next(v for v in got["verdicts"] if v["bucket"] == "queue")
    where = queue["where"]
    assert where["dimension"] in ("resource.k8s.pod.name", "resource.service.instance.id")
    assert where["value"] == f"{service}-5"
    assert abs(where["since_ns"] - (T0 + 90 * 60 * S)) <= 120 * S
    # The buckets' shares come from the rules' own read: exactly the summary's.
    summary = ag.summary(store, since_ns=T0, until_ns=T0 + 3 * H, service=service).model_dump()
    assert got["shares"] == {b: v["share"] or 0.0 for b, v in summary["buckets_ms"].items()}
    assert got["dominant"] == max(got["shares"], key=lambda b: got["shares"][b])


def test_selection_kinds_match_polars(store: Store, chat) -> None:
    df, service = chat
    common = {"since_ns": T0, "until_ns": T0 + 3 * H, "service": service, "examples": 0}
    # An SLO's bad requests: strictly above the threshold.
    slo = dm.why(store, **common, selection=dm.Selection("slo", threshold_ms=3000)).model_dump()
    assert slo["selection"]["count"] == int((df["E2eNs"] > 3000 * MS).sum())
    # A heatmap rectangle: a time range by a latency range.
    region = dm.Selection("region", since_ns=T0 + H, until_ns=T0 + 2 * H, min_ms=2500,
                          max_ms=7000)  # fmt: skip
    got = dm.why(store, **common, selection=region).model_dump()
    mask = (
        (df["Timestamp"] >= T0 + H) & (df["Timestamp"] < T0 + 2 * H)
        & (df["E2eNs"] >= 2500 * MS) & (df["E2eNs"] < 7000 * MS)
    )  # fmt: skip
    assert got["selection"]["count"] == int(mask.sum())
    assert got["baseline"]["count"] == df.height - int(mask.sum())
    # The last hour against the hour before.
    before = dm.why(
        store, since_ns=T0 + 2 * H, until_ns=T0 + 3 * H, service=service, examples=0,
        selection=dm.Selection("before"),
    ).model_dump()  # fmt: skip
    assert before["selection"]["count"] == int((df["Timestamp"] >= T0 + 2 * H).sum())
    hour = (df["Timestamp"] >= T0 + H) & (df["Timestamp"] < T0 + 2 * H)
    assert before["baseline"]["count"] == int(hour.sum())
    recent = df.filter(df["Timestamp"] >= T0 + H)
    inside, outside = split(recent, recent["Timestamp"] >= T0 + 2 * H)
    a, b = _means(inside), _means(outside)
    assert before["extra_e2e_ms"] == approx((a["e2e"] - b["e2e"]) / MS)


def test_slo_budget_goes_to_the_buckets_of_the_bad_requests(store: Store, chat) -> None:
    df, service = chat
    now = T0 + 3 * H
    got = ag.slo(
        store, objectives=[ag.Objective("e2e", threshold_ms=5500, target=0.99, window_days=1)],
        now_ns=now, service=service,
    ).model_dump()["objectives"][0]  # fmt: skip
    split_by = got["budget_by_bucket"]
    assert set(split_by) == {"window", "5m", "30m", "1h", "6h", "3d"}
    for name, start in (("window", now - 24 * H), ("1h", now - H), ("30m", now - H // 2)):
        part = df.filter(df["Timestamp"] >= start)
        bad, good = split(part, part["E2eNs"] > 5500 * MS)
        figures = split_by[name]
        assert (figures["bad"], figures["good"]) == (bad.height, good.height), name
        a, b = _means(bad), _means(good)
        for bucket in BUCKETS:
            assert figures["extra_buckets_ms"][bucket] == approx((a[bucket] - b[bucket]) / MS)
        assert sum(figures["extra_buckets_ms"].values()) == approx(figures["extra_e2e_ms"])
        extras = {k: a[k] - b[k] for k in BUCKETS}
        assert figures["dominant"] == max(extras, key=lambda k: extras[k])
    # In the last hour the pod's queue is where most of the budget went.
    assert split_by["1h"]["dominant"] == "queue"
    assert split_by["window"]["bad"] == got["bad"]
    # The burn rates come from the same read: the same as without the explanation.
    plain = ag.slo(
        store, objectives=[ag.Objective("e2e", threshold_ms=5500, target=0.99, window_days=1)],
        now_ns=now, service=service, explain=False,
    ).model_dump()["objectives"][0]  # fmt: skip
    assert plain.pop("budget_by_bucket") is None
    assert {k: v for k, v in got.items() if k != "budget_by_bucket"} == plain


def test_clean_hours_are_read_as_stored_and_others_with_final(store: Store) -> None:
    service = _service("clean")
    t0 = T0 + 10 * H
    df = planted.slow_pod(t0, service=service, span_ns=2 * H, n=1000)
    # Stale versions of ten requests of the first hour, with other numbers: FINAL must hide
    # them, so that hour is read with FINAL although its rollup is built.
    stale = (
        df.filter(df["Timestamp"] < t0 + H)
        .head(10)
        .with_columns(Version=pl.lit(3, pl.UInt64), E2eNs=pl.lit(10**12, pl.UInt64))
    )
    planted.insert(store, stale)
    planted.insert(store, df)
    Rollups(store, settle_s=0, margin_s=0).run_until_idle()
    ranges = window.raw_ranges(store, [(t0 + 10 * 60 * S, t0 + 2 * H)])
    assert ranges.final == [(t0 + 10 * 60 * S, t0 + H)]
    assert ranges.clean == [(t0 + H, t0 + 2 * H)]
    got = dm.why(store, since_ns=t0, until_ns=t0 + 2 * H, service=service,
                 selection=dm.Selection("slo", threshold_ms=3000)).model_dump()  # fmt: skip
    assert got["selection"]["count"] == int((df["E2eNs"] > 3000 * MS).sum())
    assert got["baseline"]["count"] == df.height - got["selection"]["count"]
    # A request written after the build: its hour is no longer read as stored.
    later = planted.slow_pod(t0 + H, service=service, span_ns=H, n=1, seed=9)
    planted.insert(store, later)
    assert window.raw_ranges(store, [(t0 + H, t0 + 2 * H)]).clean == []


class _CountingStore:
    """The store, counting the queries made through it."""

    def __init__(self, store: Store) -> None:
        self.store, self.queries = store, 0

    def query_rows(self, sql: str, parameters: dict | None = None) -> list[tuple]:
        self.queries += 1
        return self.store.query_rows(sql, parameters)


def test_one_view_looks_the_hours_up_once(store: Store, chat) -> None:
    _, service = chat
    counting = _CountingStore(store)
    ranges = [(T0 + 10 * 60 * S, T0 + 3 * H)]
    alone = window.raw_ranges(counting, ranges)  # type: ignore[arg-type]
    per_call = counting.queries
    assert per_call > 0
    with rollups.one_view():
        first = window.raw_ranges(counting, ranges)  # type: ignore[arg-type]
        again = window.raw_ranges(counting, ranges)  # type: ignore[arg-type]
    assert first == again == alone
    assert counting.queries == 2 * per_call
    # Outside the view every call looks again.
    window.raw_ranges(counting, ranges)  # type: ignore[arg-type]
    assert counting.queries == 3 * per_call
    # The diagnosis (one view over its reads) says the same as its parts read alone.
    got = ag.diagnose(store, since_ns=T0, until_ns=T0 + 3 * H, service=service)
    queue = next(v for v in got.verdicts if v.bucket == "queue")
    alone_where = dm.concentration(
        store, since_ns=T0, until_ns=T0 + 3 * H, bucket="queue", service=service
    )
    assert queue.where == alone_where


def test_selections_read_together_answer_as_each_alone(store: Store, chat) -> None:
    _, service = chat
    window_ = {"since_ns": T0, "until_ns": T0 + 3 * H}
    selections = [
        dm.Selection("percentile", metric="queue", percentile=95),
        dm.Selection("slo", metric="network", threshold_ms=20),
        dm.Selection("region", since_ns=T0 + H, until_ns=T0 + 2 * H, min_ms=2500),
    ]
    together = dm._why_many(
        store, window_["since_ns"], window_["until_ns"], selections, service=service,
        model=None, resources=(), attributes=(), dimensions=None, limit_values=5, examples=2,
        use_rollups=True,
    )  # fmt: skip
    for selection, got in zip(selections, together, strict=True):
        alone = dm.why(store, **window_, selection=selection, service=service, examples=2)
        assert got == alone, selection
    # The diagnosis' places: several buckets in one read, each as it is alone.
    both = dm.concentrations(store, **window_, buckets=["queue", "prefill", "network/queue"],
                             service=service)  # fmt: skip
    assert both["network/queue"] is None
    for bucket in ("queue", "prefill"):
        assert both[bucket] == dm.concentration(store, **window_, bucket=bucket, service=service)
    assert both["queue"] is not None and both["queue"].value == f"{service}-5"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"selection": dm.Selection("sideways")}, "selection 'sideways'"),
        ({"selection": dm.Selection(metric="latency")}, "metric 'latency'"),
        ({"selection": dm.Selection(percentile=100)}, "percentile must be"),
        ({"selection": dm.Selection("slo")}, "threshold_ms"),
        ({"attributes": ["tenant id"]}, "attribute key"),
        ({"dimensions": ["colour"]}, "dimension 'colour'"),
    ],
)
def test_bad_questions_say_what_to_write(store: Store, kwargs: dict, message: str) -> None:
    with pytest.raises(dm.DimensionError, match=message):
        dm.why(store, since_ns=T0, until_ns=T0 + H, **kwargs).model_dump()
    with pytest.raises(cs.ColdStartError, match="both 0"):
        cs.coldstart(store, since_ns=T0, until_ns=T0 + H,
                     rule=cs.WarmupRule(warmup_requests=0, warmup_s=0)).model_dump()  # fmt: skip
