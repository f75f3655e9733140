"""Aggregate query latency over millions of attributed requests in the embedded ClickHouse.

    .venv/bin/python -m bench.query.run [--rows 10000000] [--store chdb:///tmp/latscope-bench-query]

Loads ``--rows`` synthetic attributed requests over 7 days (generated inside ClickHouse with
INSERT ... SELECT FROM numbers(), once; re-runs reuse the store), then times summary, tail and
compare over the whole week (best of ``--repeat``). Baselines measured in the same run: a plain
scan (count + sum of e2e) and the summary query without FINAL, so the cost of FINAL and of the
quantiles are visible as ratios.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from bench.query.generate import generate
from latscope.attribution import aggregates as ag
from latscope.storage import ATTRIBUTION_TABLE, Store

T0 = 1_763_000_000_000_000_000
DAY = 86_400 * 10**9
SCAN_SQL = f"SELECT count(), sum(E2eNs) FROM {ATTRIBUTION_TABLE}"


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--store", default="chdb:///tmp/latscope-bench-query")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    store = Store.open(args.store)
    store.apply_schema()
    have = int(store.query_rows(f"SELECT count() FROM {ATTRIBUTION_TABLE}")[0][0])
    if have != args.rows:
        store.command(f"TRUNCATE TABLE {ATTRIBUTION_TABLE}")
        t = time.perf_counter()
        step = 2_000_000  # bounded memory per INSERT ... SELECT
        for first in range(0, args.rows, step):
            n = min(step, args.rows - first)
            generate(store, rows=n, t0_ns=T0 + (first * 7 * DAY) // args.rows,
                     span_s=max(1, (n * 7 * 86_400) // args.rows), first=first)  # fmt: skip
        print(f"generated {args.rows:,} rows in {time.perf_counter() - t:.1f} s")
    parts = store.query_rows(
        f"SELECT count() FROM system.parts WHERE table = '{ATTRIBUTION_TABLE}' AND active"
    )[0][0]
    print(f"{args.rows:,} attributed requests, {parts} active parts")

    week = {"since_ns": T0, "until_ns": T0 + 7 * DAY}
    mid = T0 + 4 * DAY
    params = {**week, "service": "", "model": ""}
    results = {
        "scan (count + sum, no FINAL)": best(lambda: store.query_rows(SCAN_SQL), args.repeat),
        "summary SQL without FINAL": best(
            lambda: store.query_arrow(ag.SUMMARY_SQL[False].replace(" FINAL", ""), params),
            args.repeat,
        ),
        "summary": best(lambda: ag.summary(store, **week), args.repeat),
        "summary group_by=model": best(
            lambda: ag.summary(store, **week, group_by="model"), args.repeat
        ),
        "tail p99": best(lambda: ag.tail(store, **week, percentile=99), args.repeat),
        "compare (3 d vs 4 d)": best(
            lambda: ag.compare(store, before=(T0, mid), after=(mid, T0 + 7 * DAY)), args.repeat
        ),
        "summary exact=True": best(lambda: ag.summary(store, **week, exact=True), args.repeat),
        "summary, one service, 1 day": best(
            lambda: ag.summary(store, since_ns=T0, until_ns=T0 + DAY, service="chat-api"),
            args.repeat,
        ),
    }
    base = results["scan (count + sum, no FINAL)"]
    for name, seconds in results.items():
        print(f"{name:<32} {seconds:7.3f} s   {seconds / base:6.1f}x scan")


if __name__ == "__main__":
    main()
