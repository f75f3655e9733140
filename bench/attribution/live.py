"""Live passes, part 7 of the attribution benchmark (bench/attribution/run.py): what a pass of
serve's attributor costs when the hours it reads already hold earlier traffic.

A live pass's traces are new: their spans are in the parts of the last inserts, and the parts
merged before, in the same hours, hold none of them. The spans table is sorted by hour then trace
id, so the primary key cannot skip those parts' granules (a pass's random ids fall in most of an
hour's trace id ranges); the trace id's bloom filter decides what the pass reads of them.

In a fresh store, ``LIVE_REQUESTS`` of the benchmark's requests are inserted (one insert, as
serve's writer makes them), then one attributor pass attributes them (settle window 0), and again,
``passes`` times a set; the CPU of each pass is taken. The sets:

1. no earlier traffic;
2. after ``HISTORY_COPIES`` copies of every request's spans, with new ids, stored as earlier
   traffic (ingested an hour before) in the hours of the live requests, attributed, and merged
   (spans and rows) into one part each, first with the trace id indexes the schema gives, then
   with ``OLD_INDEX`` (the indexes before deploy/clickhouse/009_trace_id_bloom.sql), then each
   once more, alternating (the machine's load moves a set's median);
3. serve's cadence, with the merges running (the sets above stop them, so each pass's traces
   are still in their insert's part): every second ``LIVE_REQUESTS`` new requests in
   ``INSERTS_A_SECOND`` inserts, as serve's writer makes them at that rate, then a pass of an
   attributor with serve's settle window (``SERVE_SETTLE_S``), which takes the requests of the
   second that settled. Between passes the spans' merges run and may fold a pass's traces into
   bigger parts before it reads them; they stop only while a pass is timed (chDB merges in
   this process, and its CPU would count them).

Printed: each set's median CPU a pass, and, for one pass's trace ids, how many granules of the
store each index lets through after the primary key; for the serve-cadence set, its requests per
CPU s against the merges-stopped sets' at the same index, and the granules of each pass.
"""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from bench.attribution.traces import SPANS
from bench.parts import active_parts
from bench.sqlids import hex_trace_id, hex_word

#: Requests a live pass attributes (one insert): serve's pass at about 1,000 requests a second.
LIVE_REQUESTS = 1_000
#: Copies of the benchmark's requests stored as earlier traffic (7 M spans for 200,000).
HISTORY_COPIES = 5
#: The trace id index of deploy/clickhouse/001_spans.sql, before 009 made it finer.
OLD_INDEX = "bloom_filter(0.001)"
TRACE_INDEX = "idx_trace_id"
#: The sets after the first (no earlier traffic): the schema's index, then the old, alternating.
INDEXED_SETS = 4
#: The serve-cadence set: serve's default settle window, and the inserts a second serve's writer
#: makes at LIVE_REQUESTS requests a second (it flushes a batch every 0.2 s,
#: WriterConfig.batch_timeout_s, well before a batch's 20,000 rows).
SERVE_SETTLE_S = 5
INSERTS_A_SECOND = 5
HOUR_NS = 3600 * 10**9
_GRANULES = re.compile(r"Granules: (\d+)/(\d+)")


def _serve_seconds(passes: int) -> int:
    """Seconds of traffic the serve-cadence set inserts: the settle window, the first pass with
    requests (not counted: it takes the part of a second that settled first), ``passes``
    passes, and a second to spare (a pass may take a second's requests in two)."""
    return SERVE_SETTLE_S + 1 + passes + 1


def requests_needed(passes: int) -> int:
    """Requests the live passes insert (each one once)."""
    return ((1 + INDEXED_SETS) * passes + _serve_seconds(passes)) * LIVE_REQUESTS


def passes_possible(requests: int) -> int:
    """The most passes a set the live passes can make with ``requests`` requests (0: none)."""
    passes = 0
    while requests_needed(passes + 1) <= requests:
        passes += 1
    return passes


def _indexed() -> tuple[str, str]:
    """The tables with the trace id index: the spans, and the attribution rows a pass looks its
    traces up in."""
    from latscope.storage import ATTRIBUTION_TABLE, SPANS_TABLE

    return SPANS_TABLE, ATTRIBUTION_TABLE


@dataclass
class Serve:
    """The serve-cadence set, by pass: its CPU seconds, requests, the spans' active parts before
    it, and the granules its trace ids keep (after the bloom filter, after the key); and its
    statements' CPU a pass, by name."""

    cpus: list[float] = field(default_factory=list)
    written: list[int] = field(default_factory=list)
    parts: list[int] = field(default_factory=list)
    granules: list[tuple[int, int]] = field(default_factory=list)
    statements: dict[str, float] = field(default_factory=dict)


@dataclass
class Live:
    history_spans: int = 0
    #: by set ("none", then the indexes of each set in turn): the CPU seconds of each pass, and
    #: the CPU seconds a pass of its statements (by name)
    sets: list[tuple[str, list[float], dict[str, float]]] = field(default_factory=list)
    #: for one pass's trace ids, by index: (granules after the bloom filter, after the key)
    granules: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: the serve-cadence set (_serve_passes)
    serve: Serve | None = None


def insertable_spans(store: Any) -> pa.Table:
    """Every stored span, in ingest order, with the columns an insert gives (not the computed
    ones, nor LatscopeIngestedAt: a new insert takes its own)."""
    from latscope.storage import SPANS_TABLE

    columns = [
        name
        for name, kind in store.query_rows(
            "SELECT name, default_kind FROM system.columns WHERE database = currentDatabase() "
            "AND table = {t:String} ORDER BY position",
            {"t": SPANS_TABLE},
        )
        if kind not in ("MATERIALIZED", "ALIAS") and name != "LatscopeIngestedAt"
    ]
    return store.query_arrow(
        f"SELECT {', '.join(columns)} FROM {SPANS_TABLE} "
        "ORDER BY LatscopeIngestedAt, TraceId, Timestamp"
    )


def stored_resources(store: Any) -> pa.Table:
    """The resources by id the collector wrote with those spans (their ids are among the spans'
    columns), to be written again with them elsewhere."""
    from latscope.storage import RESOURCES_TABLE

    return store.query_arrow(
        f"SELECT ResourceId, any(ResourceAttributes) AS ResourceAttributes FROM {RESOURCES_TABLE} "
        "GROUP BY ResourceId"
    )


def _store_history(store: Any, spans: pa.Table, t0_ns: int) -> int:
    """HISTORY_COPIES copies of ``spans`` with new trace and span ids, their 4 h of timestamps
    folded onto the 2 h around ``t0_ns``, ingested an hour ago, attributed, and the spans and
    the rows each merged into one part."""
    from latscope.attribution.attributor import Attributor
    from latscope.storage import SPANS_TABLE

    columns = spans.column_names
    store.command(f"CREATE TABLE latscope_bench_live_src AS {SPANS_TABLE} ENGINE = Memory")
    try:
        store.insert_arrow("latscope_bench_live_src", spans)
        for k in range(HISTORY_COPIES):
            exprs = {c: c for c in columns}
            exprs["TraceId"] = hex_trace_id("TraceId", k)
            exprs["SpanId"] = hex_word("SpanId", k)
            exprs["ParentSpanId"] = f"if(ParentSpanId = '', '', {hex_word('ParentSpanId', k)})"
            exprs["Timestamp"] = (
                f"fromUnixTimestamp64Nano(toInt64({t0_ns - HOUR_NS} + "
                f"intDiv(toUnixTimestamp64Nano(Timestamp) - {t0_ns}, 2) + {k}))"
            )
            store.command(
                f"INSERT INTO {SPANS_TABLE} ({', '.join(columns)}, LatscopeIngestedAt) "
                f"SELECT {', '.join(exprs[c] for c in columns)}, now64(6) - INTERVAL 1 HOUR "
                "FROM latscope_bench_live_src"
            )
    finally:
        store.command("DROP TABLE IF EXISTS latscope_bench_live_src")
    attributor = Attributor(store, settle_s=0.0)
    attributor.watermark_us = int(
        store.query_rows("SELECT toUnixTimestamp64Micro(now64(6) - INTERVAL 2 HOUR)")[0][0]
    )
    attributor.run_until_idle(max_batches=10**6)
    for table in _indexed():
        store.command(f"OPTIMIZE TABLE {table} FINAL")
    return HISTORY_COPIES * spans.num_rows


def _set_index(store: Any, type_: str) -> None:
    """The trace id indexes as ``type_``, built for every stored part (merges must run)."""
    for table in _indexed():
        store.command(f"ALTER TABLE {table} DROP INDEX IF EXISTS {TRACE_INDEX}")
        store.command(
            f"ALTER TABLE {table} ADD INDEX {TRACE_INDEX} TraceId TYPE {type_} GRANULARITY 1"
        )
        store.command(
            f"ALTER TABLE {table} MATERIALIZE INDEX {TRACE_INDEX} SETTINGS mutations_sync = 2"
        )


def _index(store: Any) -> str:
    from latscope.storage import SPANS_TABLE

    return str(
        store.query_rows(
            "SELECT type_full FROM system.data_skipping_indices WHERE database = "
            "currentDatabase() AND table = {t:String} AND name = {n:String}",
            {"t": SPANS_TABLE, "n": TRACE_INDEX},
        )[0][0]
    )


def _granules(store: Any, ids: list[str]) -> tuple[int, int]:
    """Granules a read of ``ids`` keeps after the primary key, then after the bloom filter."""
    from latscope.storage import SPANS_TABLE

    plan = "\n".join(
        row[0]
        for row in store.query_rows(
            f"EXPLAIN indexes = 1 SELECT count() FROM {SPANS_TABLE} "
            "WHERE TraceId IN (SELECT arrayJoin({ids:Array(String)}))",
            {"ids": ids},
        )
    )
    skip = plan[plan.index(f"Name: {TRACE_INDEX}") :]
    kept, considered = (int(v) for v in _GRANULES.search(skip).groups())  # type: ignore[union-attr]
    return kept, considered


class _Feed:
    """The benchmark's requests, LIVE_REQUESTS at a time, in the order serve stored them (a
    request's 7 spans share one insert, so the ingest order keeps them together)."""

    def __init__(self, spans: pa.Table) -> None:
        self.spans = spans
        self.at = 0

    def next(self) -> pa.Table:
        rows = LIVE_REQUESTS * SPANS
        if self.at + rows > self.spans.num_rows:
            raise ValueError("not enough requests for the live passes: raise --requests")
        chunk = self.spans.slice(self.at, rows)
        self.at += rows
        return chunk


def _passes(
    store: Any, feed: _Feed, passes: int
) -> tuple[list[float], dict[str, float], list[str]]:
    """``passes`` times: insert the next requests, then one pass over them; the CPU of each
    pass, its statements' CPU a pass by name, and the last pass's trace ids."""
    from bench.attribution.run import _cpu_of, spans_merges_stopped, statements_timed
    from latscope.attribution.attributor import Attributor
    from latscope.storage import SPANS_TABLE

    attributor = Attributor(store, settle_s=0.0)
    attributor.watermark_us = attributor._now_us()  # the store's clock, as its passes read it
    statements: dict[str, list[float]] = {}
    cpus: list[float] = []
    # The spans' inserts go through insert_arrow, which is not timed.
    with spans_merges_stopped(store), statements_timed(store, attributor, statements):
        for _ in range(passes):
            chunk = feed.next()
            store.insert_arrow(SPANS_TABLE, chunk)
            time.sleep(0.002)  # past the insert's LatscopeIngestedAt
            cpu, written = _cpu_of(lambda: attributor.run_until_idle(max_batches=1000))
            assert written == LIVE_REQUESTS, (written, LIVE_REQUESTS)
            cpus.append(cpu)
    ids = sorted(set(chunk.column("TraceId").to_pylist()))
    return cpus, {name: cpu / passes for name, (cpu, _) in statements.items()}, ids


def _slice_ids(store: Any, after_us: int, hi_us: int) -> list[str]:
    """The trace ids with spans ingested in ``(after_us, hi_us]`` (a pass's slice), sorted."""
    from latscope.storage import SPANS_TABLE

    return sorted(
        row[0]
        for row in store.query_rows(
            f"SELECT DISTINCT TraceId FROM {SPANS_TABLE} "
            "WHERE LatscopeIngestedAt > fromUnixTimestamp64Micro({lo:Int64}) "
            "AND LatscopeIngestedAt <= fromUnixTimestamp64Micro({hi:Int64})",
            {"lo": after_us, "hi": hi_us},
        )
    )


def _serve_passes(store: Any, feed: _Feed, passes: int) -> Serve:
    """Serve's cadence with the merges running (set 3 of the module's doc): ``passes`` passes
    that attributed requests, after the first (the part of a second that settled first)."""
    from bench.attribution.run import _cpu_of, spans_merges_stopped, statements_timed
    from latscope.attribution.attributor import Attributor
    from latscope.storage import SPANS_TABLE

    attributor = Attributor(store, settle_s=SERVE_SETTLE_S)
    attributor.watermark_us = attributor._now_us()  # the store's clock, as its passes read it
    out = Serve()
    spent: dict[str, list[float]] = {}
    first = True
    step = 1.0 / INSERTS_A_SECOND
    second = time.monotonic()
    for _ in range(_serve_seconds(passes)):
        chunk = feed.next()
        rows = chunk.num_rows // INSERTS_A_SECOND  # whole requests: LIVE_REQUESTS / 5 each
        for i in range(INSERTS_A_SECOND):
            time.sleep(max(0.0, second + i * step - time.monotonic()))
            store.insert_arrow(SPANS_TABLE, chunk.slice(i * rows, rows))
        second += 1.0
        time.sleep(max(0.0, second - time.monotonic()))
        counted = not first and len(out.cpus) < passes
        parts, after_us = active_parts(store, SPANS_TABLE), attributor.watermark_us
        with spans_merges_stopped(store):
            statements: dict[str, list[float]] = {}
            with statements_timed(store, attributor, statements):
                cpu, n = _cpu_of(lambda: attributor.run_until_idle(max_batches=1000))
            if n and counted:
                out.cpus.append(cpu)
                out.written.append(n)
                out.parts.append(parts)
                # What the pass's ids kept, in the parts the pass read (merges still stopped).
                ids = _slice_ids(store, after_us, attributor.watermark_us)
                out.granules.append(_granules(store, ids))
                for name, (c, k) in statements.items():
                    total = spent.setdefault(name, [0.0, 0])
                    total[0] += c
                    total[1] += k
        first = first and not n
        # A pass's own time is not taken from the cadence: serve's passes run beside ingest.
        second = time.monotonic()
    if len(out.cpus) < passes:
        raise RuntimeError(f"{len(out.cpus)} passes at serve's cadence had requests, not {passes}")
    out.statements = {name: cpu / passes for name, (cpu, _) in spent.items()}
    return out


def live_passes(
    spans: pa.Table, resources: pa.Table, store_dir: Any, t0_ns: int, passes: int
) -> Live:
    """The live passes over a fresh store in ``store_dir`` (removed by the caller), which holds
    the spans' ``resources`` (``stored_resources``), as the collector would have written them."""
    from latscope.storage import RESOURCES_TABLE, Store

    store = Store.open(f"chdb://{store_dir}")
    try:
        store.apply_schema()
        if resources.num_rows:
            store.insert_arrow(RESOURCES_TABLE, resources)
        feed = _Feed(spans)
        index = _index(store)
        live = Live()
        cpus, statements, _ = _passes(store, feed, passes)
        live.sets.append(("none", cpus, statements))
        live.history_spans = _store_history(store, spans, t0_ns)
        for i in range(INDEXED_SETS):
            type_ = OLD_INDEX if i % 2 else index
            if _index(store) != type_:
                _set_index(store, type_)
            cpus, statements, ids = _passes(store, feed, passes)
            live.sets.append((type_, cpus, statements))
            live.granules.setdefault(type_, _granules(store, ids))
        if _index(store) != index:
            _set_index(store, index)
        live.serve = _serve_passes(store, feed, passes)
        return live
    finally:
        store.close()


def print_live(live: Live) -> None:
    print(
        f"\nlive passes: {LIVE_REQUESTS:,} requests inserted, then one pass over them "
        f"(serve's pass at ~{LIVE_REQUESTS:,} requests/s); CPU a pass, median of "
        f"{len(live.sets[0][1])} (each set in turn):"
    )
    base = statistics.median(live.sets[0][1])
    for name, cpus, statements in live.sets:
        median = statistics.median(cpus)
        label = (
            "no earlier traffic"
            if name == "none"
            else f"{live.history_spans:,} spans earlier, trace id indexes {name}"
        )
        spent = sorted(statements.items(), key=lambda kv: -kv[1])[:3]
        print(
            f"  {label:63s} {median * 1e3:4.0f} ms ({min(cpus) * 1e3:.0f}-{max(cpus) * 1e3:.0f}); "
            f"{LIVE_REQUESTS / median:,.0f} requests per CPU s; {median / base:.2f}x no history; "
            f"mean a pass: {', '.join(f'{n} {c * 1e3:.0f} ms' for n, c in spent)}"
        )
    for name, (kept, considered) in live.granules.items():
        print(
            f"  one pass's {LIVE_REQUESTS:,} trace ids, index {name}: {kept} of the {considered} "
            "granules the primary key kept"
        )
    if live.serve is not None:
        serve = live.serve
        rate = sum(serve.written) / sum(serve.cpus)
        # The sets at the schema's index (the serve-cadence set's) with the merges stopped.
        stopped = [
            cpu
            for name, set_cpus, _ in live.sets
            if name not in ("none", OLD_INDEX)
            for cpu in set_cpus
        ]
        stopped_rate = LIVE_REQUESTS * len(stopped) / sum(stopped)
        spent = sorted(serve.statements.items(), key=lambda kv: -kv[1])[:3]
        kept = [k for k, _ in serve.granules]
        considered = [c for _, c in serve.granules]
        print(
            f"  serve's cadence, merges running ({live.history_spans:,} spans earlier, the "
            f"schema's index; {LIVE_REQUESTS:,} requests a second in {INSERTS_A_SECOND} inserts, "
            f"settle window {SERVE_SETTLE_S} s): {rate:,.0f} requests per CPU s against "
            f"{stopped_rate:,.0f} with the merges stopped ({stopped_rate / rate:.2f}x the CPU a "
            f"request); {len(serve.cpus)} passes of {min(serve.written):,}-"
            f"{max(serve.written):,} requests, {statistics.median(serve.cpus) * 1e3:.0f} ms a "
            f"pass ({min(serve.cpus) * 1e3:.0f}-{max(serve.cpus) * 1e3:.0f}); the spans' parts "
            f"before a pass: {min(serve.parts)}-{max(serve.parts)}; a pass's trace ids kept "
            f"{min(kept)}-{max(kept)} of the {min(considered)}-{max(considered)} granules the "
            f"primary key kept; mean a pass: "
            f"{', '.join(f'{n} {c * 1e3:.0f} ms' for n, c in spent)}"
        )
