"""Ingest benchmark: OTLP/gRPC load on loopback into the collector and the embedded ClickHouse.

    .venv/bin/python -m bench.ingest.run [--exports 1500] [--streams 16] [--requests 64]
        [--rate SPANS_PER_S]

A load generator (a separate process, so its CPU is not the collector's) sends pre-built
Exports of realistic LLM request traces (7 spans per request, ~15 attributes each) over N
concurrent gRPC streams, each as soon as the one before on its stream is acknowledged, or with
``--rate`` at that many spans a second (a steady load below what the collector can take). The
same run measures the decode paths alone on one thread, a parse-only receiver (gRPC decodes the
protobuf and answers) as the baseline, then the real collector end to end: every span
acknowledged and queryable in ClickHouse. Each receiver takes one Export before the measured
run: what a collector pays once, at its first Export, is not a cost per span (in a collector's
own process, pyarrow importing pandas on its first compute call is 0.4 CPU s; here the decode
paths, measured first, import it). Printed: spans/s (wall clock, from the first Export sent to
the last span queryable), collector CPU seconds per 100k spans and spans per collector
CPU-second (whole process: every thread, chDB's included), that CPU by thread (from
/proc/self/task), the spans table's active parts at the run's end, the background merges that
follow the run until the table settles, p99 Export latency, the ratio to the baseline and bytes
per span on disk after OPTIMIZE FINAL.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from bench.ingest.traces import make_batch
from bench.parts import active_parts

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
T0 = 1_763_000_000_000_000_000


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _timed_cpu(fn: object) -> float:
    cpu0 = _cpu()
    fn()  # type: ignore[operator]
    return _cpu() - cpu0


def _threads() -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) of every live thread of this process, by thread id."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue  # the thread ended meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(tid)] = (comm, (int(fields[11]) + int(fields[12])) / tick)
    return out


#: Thread groups of the breakdown, in print order.
GROUPS = (
    ("gRPC + decode (Python handler threads, gRPC core)", "latscope"),
    ("journal thread (append + fsync, acknowledge)", "latscope"),
    ("insert thread, Python side (concat, Arrow IPC)", "latscope"),
    ("insert thread, inside chDB's insert call", "chDB"),
    ("chDB pipeline threads (parse, sort, compress, write)", "chDB"),
    ("chDB merges (MergeMutate threads)", "chDB"),
    ("threads that ended during the run (chDB's pools)", "chDB"),
    ("other", "other"),
)


def _group(comm: str, python_name: str | None) -> str:
    if python_name is not None:
        if python_name.startswith(("grpc", "Thread-")) or "_serve" in python_name:
            return GROUPS[0][0]
        if python_name.endswith("-journal"):
            return GROUPS[1][0]
        if python_name.endswith("-insert"):
            return GROUPS[2][0]
        return GROUPS[7][0]
    if comm.startswith(("grpc", "event_engine", "default-execut", "resolver")):
        return GROUPS[0][0]
    if comm.startswith("MergeMutate"):
        return GROUPS[5][0]
    return GROUPS[4][0]


def cpu_by_group(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], total: float
) -> Counter[str]:
    """CPU seconds per group between two ``_threads()`` snapshots; ``total`` is the process's."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    groups: Counter[str] = Counter()
    for tid, (comm, cpu) in after.items():
        groups[_group(comm, names.get(tid))] += cpu - before.get(tid, (comm, 0.0))[1]
    groups[GROUPS[6][0]] += max(0.0, total - sum(groups.values()))
    return groups


def loadgen(
    addr: str, exports: int, streams: int, requests: int, seed: int, rate: float = 0.0
) -> None:
    """Child process: build unique Exports, then send each once over ``streams`` threads; at
    ``rate`` spans a second when set (each Export sent no sooner than its turn), else as fast
    as the acknowledgements come."""
    rng = random.Random(seed)
    payloads = [
        make_batch(rng, T0 + i * 10**9, requests).SerializeToString() for i in range(exports)
    ]
    spans = exports * requests * 7
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.readline()  # go
    channel = grpc.insecure_channel(addr, options=[("grpc.max_send_message_length", 64 << 20)])
    call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
    latencies: list[float] = []
    lock = threading.Lock()
    it = enumerate(payloads)
    started = time.perf_counter()

    def worker() -> None:
        while True:
            with lock:
                turn, payload = next(it, (0, None))
            if payload is None:
                return
            if rate:
                time.sleep(max(0.0, started + turn * requests * 7 / rate - time.perf_counter()))
            while True:
                t = time.perf_counter()
                try:
                    call(payload, timeout=60)
                    break
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                        raise
                    time.sleep(0.05)
            with lock:
                latencies.append(time.perf_counter() - t)

    threads = [threading.Thread(target=worker) for _ in range(streams)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - started
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99) - 1]
    print(json.dumps({"spans": spans, "seconds": elapsed, "p99_ms": p99 * 1000}), flush=True)


class ParseOnly(trace_service_pb2_grpc.TraceServiceServicer):
    """The baseline: gRPC decodes the request into protobuf objects; nothing else happens."""

    def Export(self, request, context):  # type: ignore[no-untyped-def]
        return trace_service_pb2.ExportTraceServiceResponse()


class _Load:
    """The load generator, started and holding its payloads until ``go``."""

    def __init__(self, addr: str, args: argparse.Namespace, seed: int | None = None) -> None:
        self.child = subprocess.Popen(
            [sys.executable, "-m", "bench.ingest.run", "--loadgen", addr,
             "--exports", str(args.exports), "--streams", str(args.streams),
             "--requests", str(args.requests), "--seed", str(args.seed if seed is None else seed),
             "--rate", str(args.rate)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.child.stdin and self.child.stdout
        json.loads(self.child.stdout.readline())  # ready: payloads are built

    def go(self) -> float:
        assert self.child.stdin
        started = time.perf_counter()
        self.child.stdin.write("go\n")
        self.child.stdin.flush()
        return started

    def result(self) -> dict[str, Any]:
        assert self.child.stdout
        result = json.loads(self.child.stdout.readline())
        self.child.wait()
        return result


def _hot_paths(args: argparse.Namespace) -> dict[str, float]:
    """Spans per CPU-second on one thread, best of 3: protobuf decode, the Python mapping (the
    reference) and the C decoder, each from serialized Exports to what it produces."""
    from latscope.collector.mapping import NATIVE, decode_spans

    rng = random.Random(args.seed + 1)
    sample = [make_batch(rng, T0 + i * 10**9, args.requests).SerializeToString() for i in range(20)]
    n = len(sample) * args.requests * 7
    request_type = trace_service_pb2.ExportTraceServiceRequest
    paths = {
        "protobuf decode (upb), no mapping": lambda: [request_type.FromString(p) for p in sample],
        "Python mapping (protobuf + SpanColumns -> Arrow)": lambda: [
            decode_spans(p, native=False) for p in sample
        ],
    }
    if NATIVE:
        paths["C decoder (wire format -> Arrow table)"] = lambda: [decode_spans(p) for p in sample]
    out = {}
    for name, fn in paths.items():
        fn()  # warm-up
        out[name] = n / min(_timed_cpu(fn) for _ in range(3))
    return out


def _baseline(args: argparse.Namespace) -> tuple[dict[str, Any], float]:
    server = grpc.server(futures.ThreadPoolExecutor(args.streams * 2), options=[
        ("grpc.max_receive_message_length", 64 << 20)])  # fmt: skip
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(ParseOnly(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    load = _Load(f"127.0.0.1:{port}", args)
    _warm(f"127.0.0.1:{port}", args.seed - 1)
    cpu0 = _cpu()
    started = load.go()
    result = load.result()
    result["wall"] = time.perf_counter() - started
    cpu = _cpu() - cpu0
    server.stop(0)
    return result, cpu


def _merges_settle(store: Any, table: str, timeout: float = 120.0) -> float:
    """Wait until no merge of ``table`` has run for 2 s; returns the wait in seconds."""
    started = time.monotonic()
    quiet_since = started
    while time.monotonic() - started < timeout:
        running = store.query_rows(
            "SELECT count() FROM system.merges WHERE table = {t:String}", {"t": table}
        )[0][0]
        now = time.monotonic()
        if running:
            quiet_since = now
        elif now - quiet_since >= 2.0:
            break
        time.sleep(0.1)
    return time.monotonic() - started


@dataclasses.dataclass
class Round:
    """One end-to-end run of the collector: its figures."""

    variant: str
    spans: int
    wall_s: float
    cpu_s: float
    p99_ms: float
    groups: Counter[str]
    settle_s: float
    settle_cpu_s: float
    parts_at_end: int  # active parts of the spans table once the last span is stored
    parts_left: int  # ... and once the merges after the run have settled

    @property
    def per_cpu_s(self) -> float:
        return self.spans / self.cpu_s

    @property
    def with_merges(self) -> float:
        return self.spans / (self.cpu_s + self.settle_cpu_s)


def _warm(addr: str, seed: int) -> int:
    """Send one Export of 64 requests, before the run's time range; returns its spans."""
    channel = grpc.insecure_channel(addr, options=[("grpc.max_send_message_length", 64 << 20)])
    try:
        call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        call(make_batch(random.Random(seed), T0 - 10**12, 64).SerializeToString(), timeout=60)
    finally:
        channel.close()
    return 64 * 7


def _expanded_bytes_by_chunk(table: Any) -> int:
    """``expanded_bytes`` as the collector computed it before: every chunk of a dictionary
    column on its own (variant ``before``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from latscope.collector.mapping import _entry_sizes

    total = 0
    for column in table.columns:
        for chunk in column.chunks:
            if not isinstance(chunk, pa.DictionaryArray):
                total += chunk.nbytes
                continue
            counts = pc.value_counts(chunk.indices)
            sizes = pc.take(_entry_sizes(chunk.dictionary), counts.field("values"))
            total += pc.sum(pc.multiply(sizes, counts.field("counts"))).as_py() or 0
            total += chunk.indices.nbytes
    return total


#: The variants ``--compare`` alternates, by name: what each changes in the collector's writer.
VARIANTS = {
    # Inserted journal segments kept until ClickHouse has synced them (the default).
    "synced": {},
    # Inserted journal segments dropped at once, with no sync first (the journal without its
    # promise across a power failure): what that promise costs.
    "unsynced": {"sync": False},
    # Synced, with the embedded store's inserts through clickhouse-connect's insert_arrow (an
    # Arrow IPC file in the temporary directory, parsed back by INSERT ... FROM INFILE) instead
    # of chDB reading the Arrow table in place: what the in-place insert saves.
    "via-file": {"in_place": False},
    # Synced, each insert on the engine's default threads (``_EmbeddedInserts.settings``) and
    # its slices sized chunk by chunk: the insert path before both savings.
    "before": {"insert_settings": {}, "expanded_bytes": _expanded_bytes_by_chunk},
    # Synced, without the engine's allocator purged after each segment's inserts: what the
    # purge that keeps serve's memory bound costs.
    "unpurged": {"purge": False},
    # Synced, with gRPC's BDP probing on (its default; serve turns it off so that an Export
    # waiting for a handler is not received whole): what the fixed window of a waiting stream
    # costs.
    "bdp-probe": {"grpc": {"grpc.http2.bdp_probe": 1}},
    # Synced, with gRPC's own initial stream window (64 KiB) instead of serve's 256 KiB: what
    # the window updates within an Export cost.
    "small-window": {"grpc": {"grpc.http2.lookahead_bytes": 64 * 1024}},
    # Synced, each segment closed at 20,000 spans instead of 40,000 (``--batch-max-spans``):
    # what inserting (and then merging) parts half the size costs.
    "batch-20k": {"batch_rows": 20_000},
    # Synced, the spans table merging five parts at a time (ClickHouse's default) instead of ten
    # (deploy/clickhouse/018_spans_merge_width.sql): what the wider merges save.
    "merge-base-5": {"table": {"merge_selector_base": 5}},
}


def collector_round(
    args: argparse.Namespace, store: Any, workdir: Path, variant: str, number: int
) -> Round:
    """The collector end to end into ``store`` (emptied first): every span acknowledged, then
    stored, then the merges it leaves run until the table settles."""
    from latscope import serve
    from latscope.collector import mapping
    from latscope.collector.mapping import expanded_bytes
    from latscope.collector.service import collector_parts
    from latscope.serve import start_grpc, stop_components
    from latscope.storage import SPANS_TABLE

    store.command(f"TRUNCATE TABLE {SPANS_TABLE}")
    table = VARIANTS[variant].get("table", {})
    table_before = _table_settings(store, SPANS_TABLE, table)
    _set_table(store, SPANS_TABLE, table)
    settings = _settings(args, store.dsn, workdir / f"spool-{number}")
    # CPU the insert thread spends inside chDB's insert (the rest of that thread is Python).
    insert_cpu = [0.0]
    insert_arrow = type(store).insert_arrow

    def timed_insert(table: str, data: Any, **kwargs: Any) -> None:
        started = time.thread_time()
        try:
            insert_arrow(store, table, data, **kwargs)
        finally:
            insert_cpu[0] += time.thread_time() - started

    store.insert_arrow = timed_insert
    parts = collector_parts(settings, store)
    writer = parts.components[0].spans
    if args.sync_every_s is not None:
        writer.config = dataclasses.replace(writer.config, sync_every_s=args.sync_every_s)
    if VARIANTS[variant].get("sync") is False:
        writer._sync_works = False
    if VARIANTS[variant].get("purge") is False:
        writer.config = dataclasses.replace(writer.config, purge_after_insert=False)
    if "batch_rows" in VARIANTS[variant]:
        rows = VARIANTS[variant]["batch_rows"]
        writer.config = dataclasses.replace(writer.config, batch_rows=rows)
    in_place = store._inserts
    if VARIANTS[variant].get("in_place") is False:
        store._inserts = None
    insert_settings = in_place.settings
    if "insert_settings" in VARIANTS[variant]:
        in_place.settings = VARIANTS[variant]["insert_settings"]
    if "expanded_bytes" in VARIANTS[variant]:
        mapping.expanded_bytes = VARIANTS[variant]["expanded_bytes"]
    for component in parts.components:
        component.start()
    grpc_options = serve.grpc_options
    options = VARIANTS[variant].get("grpc", {})
    if options:
        serve.grpc_options = lambda s: [
            *(o for o in grpc_options(s) if o[0] not in options),
            *options.items(),
        ]
    try:
        grpc_server, addr = start_grpc(settings, parts)
    finally:
        serve.grpc_options = grpc_options
    load = _Load(addr, args, seed=args.seed + number)
    warm = _warm(addr, args.seed - 1)
    while not writer.drained():
        time.sleep(0.002)
    threads0, cpu0 = _threads(), _cpu()
    started = load.go()
    run = load.result()
    # Acknowledged means journaled (fsync'd); the last inserts follow within the batch timeout.
    while not writer.drained():
        time.sleep(0.002)
    elapsed = time.perf_counter() - started
    cpu = _cpu() - cpu0
    parts_at_end = active_parts(store, SPANS_TABLE)
    groups = cpu_by_group(threads0, _threads(), cpu)
    groups[GROUPS[2][0]] -= insert_cpu[0]
    groups[GROUPS[3][0]] += insert_cpu[0]
    del store.insert_arrow
    store._inserts = in_place
    in_place.settings = insert_settings
    mapping.expanded_bytes = expanded_bytes
    stored = store.query_rows(f"SELECT count() FROM {SPANS_TABLE}")[0][0]
    assert stored == warm + run["spans"], (stored, warm, run["spans"])
    # The merges ClickHouse still owes for this run's parts: CPU until the table settles.
    cpu1 = _cpu()
    settle_s = _merges_settle(store, SPANS_TABLE)
    settle_cpu = _cpu() - cpu1
    grpc_server.stop(5).wait()
    stop_components(parts, time.monotonic() + 30)
    _set_table(store, SPANS_TABLE, table_before)
    return Round(
        variant, run["spans"], elapsed, cpu, run["p99_ms"], groups, settle_s, settle_cpu,
        parts_at_end, active_parts(store, SPANS_TABLE),
    )  # fmt: skip


def _table_settings(store: Any, table: str, names: Iterable[str]) -> dict[str, str]:
    """The table's own values of the MergeTree settings ``names`` (as its DDL set them)."""
    engine = store.query_rows(
        "SELECT engine_full FROM system.tables"
        " WHERE database = currentDatabase() AND name = {t:String}",
        {"t": table},
    )[0][0]
    found = {}
    for name in names:
        match = re.search(rf"\b{name} = ([^,\s]+)", engine)
        if match is None:
            raise SystemExit(f"{table} sets no {name}: a variant would not know what to restore")
        found[name] = match.group(1)
    return found


def _set_table(store: Any, table: str, settings: dict[str, Any]) -> None:
    """Set the table's MergeTree ``settings`` (none: nothing to do)."""
    if settings:
        pairs = ", ".join(f"{k} = {v}" for k, v in settings.items())
        store.command(f"ALTER TABLE {table} MODIFY SETTING {pairs}")


def _settings(args: argparse.Namespace, dsn: str, spool: Path) -> Any:
    from latscope.config import Settings

    return Settings(
        otlp_grpc="127.0.0.1:0", store=dsn, spool_dir=str(spool),
        grpc_max_message_bytes=64 << 20, grpc_workers=args.streams * 2,
        max_span_age_s=0, max_span_future_s=0,  # the generated spans are at fixed times
        **{k: v for k, v in (("batch_max_spans", args.batch_max_spans),
                             ("batch_timeout_s", args.batch_timeout_s)) if v is not None},
    )  # fmt: skip


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def bench(args: argparse.Namespace) -> None:
    from latscope.collector.mapping import NATIVE
    from latscope.serve import give_back_large_blocks
    from latscope.storage import SPANS_TABLE, Store

    # The process as latscope serve sets it up: glibc's threshold, the engine's own limits.
    give_back_large_blocks()
    hot = _hot_paths(args)
    base, base_cpu = _baseline(args)

    workdir = Path(tempfile.mkdtemp(prefix="latscope-bench-"))
    # Removed at exit, also when the run fails half-way (the store holds gigabytes).
    atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    dsn = f"chdb://{workdir / 'store'}"
    defaults = _settings(args, dsn, workdir)
    store = Store.open(dsn, memory_limit_bytes=defaults.memory_limit_bytes)
    store.apply_schema()
    if args.variants:
        variants = args.variants.split(",")
        unknown = sorted(set(variants) - set(VARIANTS))
        if unknown or len(variants) < 2 or variants[0] != "synced":
            raise SystemExit(f"--variants: synced first, then any of {', '.join(VARIANTS)}")
    elif args.compare:
        variants = list(VARIANTS)
    else:
        variants = ["unsynced" if args.no_sync else "synced"]
    rounds = [
        collector_round(args, store, workdir, variant, i * len(variants) + j)
        for i in range(args.rounds)
        for j, variant in enumerate(variants)
    ]
    store.command(f"OPTIMIZE TABLE {SPANS_TABLE} FINAL")
    on_disk = store.query_rows(
        "SELECT sum(bytes_on_disk), sum(rows) FROM system.parts "
        "WHERE active AND database = currentDatabase() AND table = {t:String}",
        {"t": SPANS_TABLE},
    )[0]
    store.close()

    load1 = os.getloadavg()[0]
    pace = f"at {args.rate:,.0f} spans/s" if args.rate else "as fast as acknowledged"
    print(f"exports {args.exports} x {args.requests * 7} spans, {args.streams} streams {pace}; "
          f"C decoder {'on' if NATIVE else 'NOT BUILT'}; batches of {defaults.batch_max_spans} "
          f"spans / {defaults.batch_timeout_s} s; {args.rounds} round(s) of "
          f"{', '.join(variants)}; load average {load1:.2f}")  # fmt: skip
    print("decode paths alone, one thread, best of 3 (spans per CPU-second):")
    for name, value in hot.items():
        print(f"  {name:52s} {value:>12,.0f}")
    base_rate = base["spans"] / base["wall"]
    base_per100k = base_cpu * 1e5 / base["spans"]
    print(f"parse-only baseline : {base_rate:>10,.0f} spans/s   "
          f"{base_per100k:.3f} CPU s/100k spans   p99 {base['p99_ms']:.1f} ms")  # fmt: skip
    for r in rounds:
        per100k = 1e5 / r.spans
        print(f"{r.variant:9s} -> chDB  : {r.spans / r.wall_s:>10,.0f} spans/s   "
              f"{r.cpu_s * per100k:.3f} CPU s/100k spans   p99 {r.p99_ms:.1f} ms   "
              f"{r.per_cpu_s:,.0f} spans per CPU-second ({r.parts_at_end} parts at the end); "
              f"with the merges after it ({r.settle_s:.0f} s, {r.parts_left} parts left) "
              f"{r.with_merges:,.0f}")  # fmt: skip
    print("collector CPU by thread, s per 100k spans, median of each variant's rounds:")
    print(f"  {'':56s} " + " ".join(f"{v:>9s}" for v in variants))
    sides: dict[str, Counter[str]] = {v: Counter() for v in variants}
    for name, side in GROUPS:
        cells = []
        for variant in variants:
            mine = [r.groups[name] * 1e5 / r.spans for r in rounds if r.variant == variant]
            cells.append(_median(mine))
            sides[variant][side] += cells[-1]
        print(f"  {name:56s} " + " ".join(f"{c:9.3f}" for c in cells))
    for side in ("latscope", "chDB", "other"):
        print(f"  {'= ' + side:56s} " + " ".join(f"{sides[v][side]:9.3f}" for v in variants))
    for variant in variants:
        mine = [r for r in rounds if r.variant == variant]
        print(f"{variant:9s} median : {_median([r.per_cpu_s for r in mine]):,.0f} spans per "
              f"CPU-second during the run, {_median([r.with_merges for r in mine]):,.0f} with "
              f"the merges after it; ratio to parse-only (spans/s) "
              f"{_median([r.spans / r.wall_s for r in mine]) / base_rate:.2f}")  # fmt: skip
    if len(variants) > 1:
        n = len(variants)
        for j, variant in enumerate(variants[1:], 1):
            pairs = [
                (a.cpu_s / a.spans) / (b.cpu_s / b.spans)
                for a, b in zip(rounds[0::n], rounds[j::n], strict=True)
            ]
            listed = ", ".join(f"{x:.2f}" for x in pairs)
            print(f"CPU per span, {variants[0]} / {variant}, per round: {listed}; "
                  f"median {_median(pairs):.2f}")  # fmt: skip
    print(f"bytes per span on disk: {on_disk[0] / on_disk[1]:.1f}  ({on_disk[1]} rows)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--exports", type=int, default=1500)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--requests", type=int, default=64, help="requests (x7 spans) per Export")
    parser.add_argument("--loadgen", metavar="ADDR", help=argparse.SUPPRESS)
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        metavar="SPANS_PER_S",
        help="send at this many spans a second (default: as fast as they are acknowledged)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--batch-max-spans", type=int, help="the collector's (default: its own)")
    parser.add_argument("--batch-timeout-s", type=float, help="the collector's (default: its own)")
    parser.add_argument(
        "--sync-every-s", type=float, help="the collector's sync_every_s (default: its own)"
    )
    parser.add_argument(
        "--no-sync",
        action="store_true",
        help="drop inserted journal segments without syncing ClickHouse first (to measure "
        "what keeping them until synced costs)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="collector runs (of each variant)")
    parser.add_argument(
        "--compare",
        action="store_true",
        help=f"alternate the variants ({', '.join(VARIANTS)}) over the same store; print "
        "each one's CPU per span against synced, round by round",
    )
    parser.add_argument(
        "--variants",
        metavar="LIST",
        help="--compare with these variants only, comma-separated, synced first "
        "(e.g. synced,before)",
    )
    args = parser.parse_args()
    if args.loadgen:
        loadgen(args.loadgen, args.exports, args.streams, args.requests, args.seed, args.rate)
    else:
        bench(args)


if __name__ == "__main__":
    main()
