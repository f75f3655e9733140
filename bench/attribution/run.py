"""Attribution throughput: requests per second per core, batch engine vs the per-request engine.

    POLARS_MAX_THREADS=1 .venv/bin/python -m bench.attribution.run [--requests 200000]

Each request is a client span, a server span and five phase spans (decode with 64 token offsets),
with random durations and a server clock skewed on some. Polars is pinned to one thread and the
figures are requests per CPU-second of the whole process (the wall-clock rate is printed beside
it; on a shared machine it swings with the load). The baseline is the per-request engine on the
same requests, in the same run. Last, the continuous attributor end to end: the same kind of
traces stored in an embedded ClickHouse by the collector's mapping, then found, loaded,
attributed and written back as attribution rows.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("POLARS_MAX_THREADS", "1")

import numpy as np
import polars as pl

from latscope.attribution.batch import SPAN_COLUMNS, attribute_frame, finish_rows, to_arrow
from latscope.attribution.engine import attribute_trace
from latscope.attribution.model import SpanRecord

MS = 1_000_000
T0 = 1_763_000_000_000_000_000
PHASES = ("queue", "preprocess", "prefill", "decode", "postprocess")
TOKENS = 64


def make_spans(n: int, seed: int = 7) -> pl.DataFrame:
    """``n`` requests, 7 spans each, in the batch engine's input columns."""
    rng = np.random.default_rng(seed)
    tid = np.array([f"{i:032x}" for i in range(n)], dtype=object)
    durs = {p: rng.integers(1, 300, n) * MS for p in PHASES}
    net = rng.integers(2, 50, n) * MS
    skew = np.where(rng.random(n) < 0.1, rng.integers(-5000, 5000, n) * MS, 0)
    start_c = T0 + np.arange(n, dtype=np.int64) * 10 * MS
    start_s = start_c + net // 2 + skew
    server_dur = sum(durs.values()) + 2 * MS
    rows = []
    base = {
        "trace_id": tid,
        "service": np.full(n, "llm-server", dtype=object),
        "status": np.full(n, "Ok", dtype=object),
    }
    rows.append(
        {
            **base,
            "span_id": np.full(n, "00000000000000c1", dtype=object),
            "parent_id": np.full(n, "", dtype=object),
            "kind": np.full(n, "Client", dtype=object),
            "start": start_c,
            "dur": server_dur + net,
            "model": np.full(n, "", dtype=object),
        }
    )
    rows.append(
        {
            **base,
            "span_id": np.full(n, "00000000000000a1", dtype=object),
            "parent_id": np.full(n, "00000000000000c1", dtype=object),
            "kind": np.full(n, "Server", dtype=object),
            "start": start_s,
            "dur": server_dur,
            "model": np.full(n, "llama-3-8b", dtype=object),
            "input_tokens": rng.integers(10, 4000, n).astype(str).astype(object),
        }
    )
    t = start_s + MS
    offsets = ",".join(str(i * 15_000) for i in range(TOKENS))
    for i, p in enumerate(PHASES):
        rows.append(
            {
                **base,
                "span_id": np.full(n, f"{i + 1:016x}", dtype=object),
                "parent_id": np.full(n, "00000000000000a1", dtype=object),
                "kind": np.full(n, "Internal", dtype=object),
                "start": t,
                "dur": durs[p],
                "phase": np.full(n, p, dtype=object),
                "token_offsets": np.full(n, f"[{offsets}]" if p == "decode" else "", dtype=object),
            }
        )
        t = t + durs[p]
    frames = [pl.DataFrame({k: pl.Series(k, v) for k, v in r.items()}) for r in rows]
    df = pl.concat(frames, how="diagonal_relaxed")
    df = df.with_columns(
        [pl.lit(None, dtype=d).alias(c) for c, d in SPAN_COLUMNS.items() if c not in df.columns]
    ).select(list(SPAN_COLUMNS))
    # A trace's spans together, as the store returns a batch of trace ids.
    return df.sort("trace_id", maintain_order=True)


def records(df: pl.DataFrame) -> dict[str, list[SpanRecord]]:
    from latscope.attribution.batch import ATTRIBUTE_COLUMNS

    out: dict[str, list[SpanRecord]] = {}
    for r in df.iter_rows(named=True):
        out.setdefault(r["trace_id"], []).append(
            SpanRecord(
                span_id=r["span_id"],
                parent_span_id=r["parent_id"],
                name="",
                kind=r["kind"],
                service=r["service"],
                start_ns=r["start"],
                duration_ns=r["dur"],
                attributes={k: r[c] for c, k in ATTRIBUTE_COLUMNS.items() if r[c]},
                status=r["status"],
            )
        )
    return out


def _clocks() -> tuple[float, float]:
    """(wall, CPU of this process: every thread, polars' and chDB's included)."""
    return time.perf_counter(), time.process_time()


def _rate(n: int, since: tuple[float, float]) -> tuple[float, float]:
    """Requests per wall second and per CPU second since ``since``."""
    wall, cpu = _clocks()
    return n / (wall - since[0]), n / max(cpu - since[1], 1e-9)


def attributor_end_to_end(requests: int, batch: int) -> tuple[int, float, float]:
    """The continuous attributor's whole cycle over spans already in an embedded store: find
    settled traces, load their spans, attribute, check for moved keys, write the rows."""
    import random
    import shutil
    import tempfile

    from bench.ingest.traces import make_batch
    from latscope.attribution.attributor import Attributor
    from latscope.collector.mapping import spans_table
    from latscope.storage import ATTRIBUTION_TABLE, SPANS_TABLE, Store

    workdir = tempfile.mkdtemp(prefix="latscope-attrbench-")
    try:
        store = Store.open(f"chdb://{workdir}")
        store.apply_schema()
        rng = random.Random(3)
        per_export = 64
        for i in range(0, requests, per_export):
            export = make_batch(rng, T0 + i * 10 * MS, min(per_export, requests - i))
            store.insert_arrow(SPANS_TABLE, spans_table(export.resource_spans))
        attributor = Attributor(store, settle_s=0.0, batch_traces=batch, step_s=3600.0)
        since = _clocks()
        written = attributor.run_until_idle(max_batches=10**6)
        wall_rps, cpu_rps = _rate(written, since)
        rows = store.query_rows(f"SELECT count() FROM {ATTRIBUTION_TABLE} FINAL")[0][0]
        assert rows == requests, (rows, requests)
        store.close()
        return written, wall_rps, cpu_rps
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=50_000, help="traces per batch")
    parser.add_argument("--baseline", type=int, default=5_000, help="requests for the baseline")
    parser.add_argument(
        "--store-requests",
        type=int,
        default=50_000,
        help="requests for the end-to-end attributor over the embedded store (0: skip)",
    )
    args = parser.parse_args()
    df = make_spans(args.requests)
    print(f"polars threads: {pl.thread_pool_size()}; {args.requests} requests, {df.height} spans")

    attribute_frame(df.head(7 * 1000))  # warm-up
    batches = [df.slice(i * 7, args.batch * 7) for i in range(0, args.requests, args.batch)]
    since = _clocks()
    n = 0
    for b in batches:
        n += attribute_frame(b).height
    batch = _rate(n, since)
    since = _clocks()
    for b in batches:
        to_arrow(finish_rows(attribute_frame(b)))
    with_arrow = _rate(n, since)

    recs = records(df.head(7 * args.baseline))
    since = _clocks()
    for trace_id, spans in recs.items():
        attribute_trace(trace_id, spans)
    oracle = _rate(len(recs), since)

    print(f"{'requests/s':<34}{'per CPU-second':>16}{'wall clock':>14}")
    for label, (wall_rps, cpu_rps) in (
        ("batch engine", batch),
        ("batch engine + Arrow rows", with_arrow),
        ("per-request engine (baseline)", oracle),
    ):
        print(f"{label:<34}{cpu_rps:>16,.0f}{wall_rps:>14,.0f}")
    if args.store_requests:
        written, wall_rps, cpu_rps = attributor_end_to_end(args.store_requests, args.batch // 10)
        label = f"attributor, store to store ({written:,})"
        print(f"{label:<34}{cpu_rps:>16,.0f}{wall_rps:>14,.0f}")
    print(f"ratio batch / baseline (CPU):     {batch[1] / oracle[1]:>10.1f}x")


if __name__ == "__main__":
    main()
