"""Aggregate query latency over millions of attributed requests in the embedded ClickHouse.

    .venv/bin/python -m bench.query.run [--rows 10000000] [--store chdb:///tmp/latscope-bench-query]
                                        [--repeat 3] [--fresh]

Loads ``--rows`` synthetic attributed requests over 7 days (generated inside ClickHouse with
INSERT ... SELECT FROM numbers(); a store that already holds that many rows is reused, ``--fresh``
generates them again), builds the hourly rollups as the background component would (timed on its
own), then times summary, tail and compare over the whole week and over on-call windows (best
and worst of ``--repeat``), and the answers over time, across dimensions and about cold starts
(the generator plants a slow pod and a scale-up; the run first says whether they are found).
The baseline, measured in the same run, is a plain scan (count + sum
of e2e, no FINAL); the same questions read raw (``use_rollups=False``) are timed too, for the
before/after.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

from bench.parts import active_parts
from bench.query.generate import NEW_PODS, SCALE_UP_S, SLOW_POD, SLOW_POD_S, generate
from latscope.api.burn import BurnRates, parse_objectives
from latscope.attribution import aggregates as ag
from latscope.attribution.answers import coldstart as cs
from latscope.attribution.answers import dimensions as dm
from latscope.attribution.answers import timeseries as ts
from latscope.attribution.rollups import ROLLUP_TABLE, Rollups
from latscope.storage import ATTRIBUTION_TABLE, Store

#: 2025-11-13 02:13:20 UTC: not on an hour, so every window has partial edge hours.
T0 = 1_763_000_000_000_000_000
HOUR = 3600 * 10**9
DAY = 24 * HOUR
SCAN_SQL = f"SELECT count(), sum(E2eNs) FROM {ATTRIBUTION_TABLE}"
SIZE_SQL = """
SELECT sum(rows), sum(data_compressed_bytes) FROM system.parts
WHERE active AND database = currentDatabase() AND table = {table:String}
"""


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Best and worst of ``repeat`` runs (s)."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times), max(times)


def load(store: Store, rows: int, fresh: bool) -> None:
    """Make the store hold exactly ``rows`` generated requests (reusing them when it does)."""
    have = int(store.query_rows(f"SELECT count() FROM {ATTRIBUTION_TABLE}")[0][0])
    # Rows from before the planted causes lack the replica attributes: generate them again.
    planted = store.query_rows(
        f"SELECT count() FROM {ATTRIBUTION_TABLE} WHERE "
        "mapContains(ResourceAttributes, 'service.instance.id') LIMIT 1"
    )[0][0]
    if have == rows and planted and not fresh:
        return
    for table in (ATTRIBUTION_TABLE, ROLLUP_TABLE):
        store.command(f"TRUNCATE TABLE {table}")
    t = time.perf_counter()
    step = 2_000_000  # bounded memory per INSERT ... SELECT
    for first in range(0, rows, step):
        n = min(step, rows - first)
        generate(store, rows=n, t0_ns=T0 + (first * 7 * DAY) // rows,
                 span_s=max(1, (n * 7 * 86_400) // rows), first=first, plant_t0_ns=T0)  # fmt: skip
    print(f"generated {rows:,} rows in {time.perf_counter() - t:.1f} s")


def planted(store: Store, slow_pod: dict[str, int], scale_day: dict[str, int]) -> None:
    """Say whether the answers find the generator's planted causes (a sanity check of the data
    the figures are measured on)."""
    found = dm.why(store, **slow_pod).top
    assert found is not None, "why found no top value around the slow pod"
    print(
        f"why p99 around the slow pod: {found.dimension} = {found.value}, "
        f"mostly {found.dominant} (planted: {SLOW_POD}, queue)"
    )
    cold = cs.coldstart(store, **scale_day)
    print(
        f"cold starts around the scale-up: {cold.appeared} replicas appeared, "
        f"{cold.warmup.count} warm-up requests, +{cold.extra_e2e_ms or 0:.0f} ms, mostly "
        f"{cold.dominant} (planted: {len(NEW_PODS)} pods x 3 services, prefill)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--store", default="chdb:///tmp/latscope-bench-query")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--fresh", action="store_true", help="generate the rows again")
    args = parser.parse_args()

    # Generating millions of rows on a busy machine can outlast serve's query time limit.
    store = Store.open(args.store, query_timeout_s=3600)
    store.apply_schema()
    load(store, args.rows, args.fresh)
    t = time.perf_counter()
    # Nothing else writes to this store: build at once, with no settle time or margin.
    hours = Rollups(store, settle_s=0, margin_s=0).run_until_idle()
    print(f"rollup: built {hours} hours in {time.perf_counter() - t:.1f} s")
    parts = active_parts(store, ATTRIBUTION_TABLE)
    print(f"{args.rows:,} attributed requests, {parts} active parts")
    for table in (ATTRIBUTION_TABLE, ROLLUP_TABLE):
        n, size = store.query_rows(SIZE_SQL, {"table": table})[0]
        print(f"{table}: {int(n or 0):,} rows, {int(size or 0) / 1e6:.1f} MB on disk")

    end = T0 + 7 * DAY
    week = {"since_ns": T0, "until_ns": end}
    mid = T0 + 4 * DAY
    last_hour = {"since_ns": end - HOUR, "until_ns": end}
    day = {"since_ns": T0, "until_ns": T0 + DAY, "service": "chat-api"}
    six_hours = {"since_ns": end - 6 * HOUR, "until_ns": end}
    slow_at = T0 + SLOW_POD_S[0] * 10**9
    slow_pod = {"since_ns": slow_at - 3 * HOUR, "until_ns": slow_at + 3 * HOUR}
    one_day = {"since_ns": T0 + 4 * DAY, "until_ns": T0 + 5 * DAY}
    scale_at = T0 + SCALE_UP_S * 10**9
    scale_day = {"since_ns": scale_at - 12 * HOUR, "until_ns": scale_at + 12 * HOUR}
    slo_e2e = ag.Objective("e2e", threshold_ms=5000, target=0.99, window_days=30)
    planted(store, slow_pod, scale_day)
    r = args.repeat
    questions: dict[str, Callable[[], object]] = {
        "scan (count + sum, no FINAL)": lambda: store.query_rows(SCAN_SQL),
        "week: summary": lambda: ag.summary(store, **week),
        "week: summary group_by=model": lambda: ag.summary(store, **week, group_by="model"),
        "week: summary group_by=route": lambda: ag.summary(store, **week, group_by="route"),
        "week: tail p99": lambda: ag.tail(store, **week, percentile=99),
        "week: compare 3 d vs 4 d": lambda: ag.compare(store, before=(T0, mid), after=(mid, end)),
        "last hour: summary": lambda: ag.summary(store, **last_hour),
        "last hour: tail p99": lambda: ag.tail(store, **last_hour),
        "last hour: compare with the one before": lambda: ag.compare(
            store, before=(end - 2 * HOUR, end - HOUR), after=(end - HOUR, end)
        ),
        "1 service, 1 day: summary": lambda: ag.summary(store, **day),
        "1 service, 1 day: tail p99": lambda: ag.tail(store, **day),
        "raw, week: summary": lambda: ag.summary(store, **week, use_rollups=False),
        "raw, week: summary group_by=model": lambda: ag.summary(
            store, **week, group_by="model", use_rollups=False
        ),
        "raw, week: tail p99": lambda: ag.tail(store, **week, use_rollups=False),
        "raw, week: compare 3 d vs 4 d": lambda: ag.compare(
            store, before=(T0, mid), after=(mid, end), use_rollups=False
        ),
        "raw, week: summary exact=True": lambda: ag.summary(store, **week, exact=True),
        # Since when, what is different, cold starts (attribution/timeseries.py, dimensions.py,
        # coldstart.py). Week-long steps come from the rollup; what is different and cold
        # starts read every request of their window (no rollup has resource attributes).
        "week: timeseries (2 h steps)": lambda: ts.timeseries(store, **week),
        "week: timeseries group_by=model": lambda: ts.timeseries(store, **week, group_by="model"),
        "raw, week: timeseries (2 h steps)": lambda: ts.timeseries(
            store, **week, use_rollups=False
        ),
        "6 hours: timeseries (5 min steps)": lambda: ts.timeseries(store, **six_hours),
        "last hour: timeseries (30 s steps)": lambda: ts.timeseries(store, **last_hour),
        "week: heatmap": lambda: ts.heatmap(store, **week),
        "6 hours: heatmap": lambda: ts.heatmap(store, **six_hours),
        "last hour: why p99": lambda: dm.why(store, **last_hour),
        "last hour: why, against the hour before": lambda: dm.why(
            store, **last_hour, selection=dm.Selection("before")
        ),
        "6 hours (slow pod): why p99": lambda: dm.why(store, **slow_pod),
        "6 hours (slow pod): diagnose": lambda: ag.diagnose(store, **slow_pod),
        "1 day: why p99": lambda: dm.why(store, **one_day),
        "raw, week: why p99": lambda: dm.why(store, **week),
        "1 day (scale-up): coldstart": lambda: cs.coldstart(store, **scale_day),
        "raw, week: coldstart": lambda: cs.coldstart(store, **week),
        "slo e2e, 30 days: burn rates only": lambda: ag.slo(
            store, objectives=[slo_e2e], now_ns=end, explain=False
        ),
        "slo e2e, 30 days: with budget by bucket": lambda: ag.slo(
            store, objectives=[slo_e2e], now_ns=end
        ),
        # What serve does every --slo-interval-s for /metrics: the default objectives (e2e and
        # TTFT), each over the four burn windows with the budget by bucket.
        "/metrics burn rates: one evaluation": BurnRates(
            store, parse_objectives(""), clock=lambda: end
        ).run_until_idle,
    }
    # The machine is shared: the load around the figures says how far to trust them.
    load_before = os.getloadavg()[0]
    results = {name: timed(fn, r) for name, fn in questions.items()}
    base = results["scan (count + sum, no FINAL)"][0]
    print(f"load average (1 min): {load_before:.2f} before the questions, "
          f"{os.getloadavg()[0]:.2f} after")  # fmt: skip
    print(f"{'':<44} {'best':>7}   {'worst':>7}   best / scan")
    for name, (low, high) in results.items():
        print(f"{name:<44} {low:7.3f} s {high:7.3f} s {low / base:7.1f}x")


if __name__ == "__main__":
    main()
