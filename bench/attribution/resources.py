"""The single-call statement by resource id against with the resources' attributes
(deploy/clickhouse/012_resource_ids.sql), side by side.

    .venv/bin/python -m bench.attribution.resources [--requests 200000] [--rounds 15]

For each resource shape, the benchmark's own (2-4 attributes a resource) and a Kubernetes pod's
(``traces.POD_RESOURCE``: 24 attributes): ``latscope serve`` with the attributor off stores the
requests in a fresh embedded store (its collector writes each span's resource id and each
resource once), then in this process, with the spans' merges stopped, the two single-call
statements over the trace ids below '8' (half of the requests: the size of one of the
attributor's batches), into a Null table of the attribution table's columns, alternating
``--rounds`` times. Printed: the requests, the rows' equality (their count and a hash of every
column), each statement's CPU seconds (median and spread) and the paired differences' median.
Everything it creates is removed at the end.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.attribution.run import (
    SENDERS,
    _cpu_of,
    build_exports,
    serve_run,
    spans_merges_stopped,
)

#: The batch: the trace ids below this (random hex ids: about half of them).
LAST_ID = "8"
NULL_SINK = "latscope_bench_resources_null"


def compare(store_dir: Path, rounds: int) -> dict[str, Any]:
    from latscope.attribution.sql import simple_select
    from latscope.attribution.table import ATTRIBUTION_SCHEMA
    from latscope.storage import ATTRIBUTION_TABLE, RESOURCES_TABLE, SPANS_TABLE, Store
    from latscope.tokens import DEFAULT_STALL_NS

    store = Store.open(f"chdb://{store_dir}")
    try:
        store.apply_schema()
        with spans_merges_stopped(store):
            store.command(f"CREATE TABLE {NULL_SINK} AS {ATTRIBUTION_TABLE} ENGINE = Null")
            batch = (
                f"SELECT DISTINCT TraceId AS trace_id FROM {SPANS_TABLE} "
                "WHERE TraceId < {last:String}"
            )
            into = f"INSERT INTO {NULL_SINK} ({', '.join(ATTRIBUTION_SCHEMA.names)}) "
            statements = {
                "with the attributes": simple_select(batch, SPANS_TABLE, "1"),
                "by resource id": simple_select(batch, SPANS_TABLE, "1", True, True),
            }
            params = {"last": LAST_ID, "stall_ns": DEFAULT_STALL_NS, "through_us": 0, "after_us": 0}
            rows = {
                name: store.query_rows(f"SELECT count(), sum(cityHash64(*)) FROM ({sql})", params)[
                    0
                ]
                for name, sql in statements.items()
            }
            cpu: dict[str, list[float]] = {name: [] for name in statements}
            for _ in range(rounds):
                for name, sql in statements.items():
                    cpu[name].append(_cpu_of(lambda sql=sql: store.command(into + sql, params))[0])
            resource_bytes = store.query_rows(
                "SELECT avg(length(toString(ResourceAttributes))), "
                f"avg(length(ResourceAttributes)) FROM {RESOURCES_TABLE} "
                "WHERE ResourceAttributes['service.name'] = 'llm-server'"
            )[0]
    finally:
        store.close()
    return {"rows": rows, "cpu": cpu, "resource": resource_bytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    serve_args = argparse.Namespace(
        settle_s=5.0, complete_s=0.0, early_when_quiet="off", senders=SENDERS, timeout_s=900.0
    )
    workdir = Path(tempfile.mkdtemp(prefix="latscope-bench-resources-"))
    try:
        shapes = (("own", "the benchmark's resources", False), ("pod", "a Kubernetes pod's", True))
        for key, shape, pod in shapes:
            exports = build_exports(args.requests, pod_resources=pod)
            run = serve_run("off", exports, args.requests, serve_args, workdir / key)
            del exports
            result = compare(run.store_dir, args.rounds)
            shutil.rmtree(workdir / key, ignore_errors=True)
            size, count = result["resource"]
            print(f"\n{shape} (the server's: {count:.0f} attributes, {size:.0f} bytes as text):")
            (n, a), (m, b) = result["rows"].values()
            print(f"  rows: {n:,} and {m:,} requests, equal: {n == m and a == b}")
            cpu = result["cpu"]
            for name, runs in cpu.items():
                print(
                    f"  {name}: median {statistics.median(runs):.3f} CPU s "
                    f"({min(runs):.3f}-{max(runs):.3f}, {len(runs)} rounds)"
                )
            base, other = cpu.values()
            diffs = [o - b for b, o in zip(base, other, strict=True)]
            print(
                f"  by resource id minus with the attributes, paired: median "
                f"{statistics.median(diffs):+.3f} CPU s "
                f"({statistics.median(diffs) / statistics.median(base):+.0%})"
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
