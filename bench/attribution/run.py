"""Attribution benchmark: `latscope serve` with the attributor off, then on, and the SQL
attributor and the rollup builder alone.

    .venv/bin/python -m bench.attribution.run [--requests 200000] [--quick]

1. **serve, off then on.** The same unique LLM request traces (7 spans each, from
   bench/attribution/traces.py, 64 requests per Export) sent from 4 threads on loopback to a
   `latscope serve` started for the run, each run into a fresh embedded store. Printed: spans/s
   from the first send until every span is stored (attributor off) or every request attributed
   (on), serve's CPU seconds over that time (from /proc: every thread, chDB's included), and the
   ratios. "Until attributed" includes the settle window (`--settle-s`, serve's own default), a
   wait every trace makes by design; the rate up to the last span stored is printed beside it.
   `--complete-s S` turns on serve's early attribution (`--attribution-complete-s`, off by
   default): complete traces are attributed S seconds after their last span instead. The pair
   of runs (off, then on) is made `--serve-pairs` times (3), alternating, and the median ratio
   printed beside each pair's: the machine's load moves a single pair's ratio by +-0.1.
   `--normal-priority` adds a third run to each pair: on, with serve started without the
   CAP_SYS_NICE capability (dropped from its bounding set before it starts, as a container
   without it runs), where the attributor's statements run at ingest's priority instead of as
   background work (`latscope.storage.Store.background`). For each "on" run, the tail: serve's
   CPU from the last span stored to done, in cores and by thread name (from /proc: the embedded
   engine names its query and merge threads; Python's are all "python"); and before it, serve's
   CPU from the first send to the last span stored against the "off" run's, in all and split
   into Python's threads and the engine's (the passes made during the burst, and what they cost
   ingest).
2. **The attributor alone**, in this process (chDB runs in-process, so `time.process_time()` is
   its CPU): the "off" run's store, filled once, with the spans table's merges stopped (the
   process that opens a store serve wrote may merge what serve left, in the middle of a timed
   run: ingest's work, not the attributor's; `spans_merges_stopped`), then
   `Attributor.run_until_idle()` from the stored spans to attribution rows: requests per
   CPU second; then again `--alone-runs` - 1 times over the same spans (the attribution table
   emptied first), the best and median printed beside. Its baselines: after each run, the bare
   read of the columns it reads, of every stored span, into a Null table (the least any
   attributor inside ClickHouse pays), then the same columns grouped by trace (each trace's
   spans carried whole through a GROUP BY, nothing worked out: the attributor carries less of
   them, the arrays of a few spans only), and the attributor's CPU as a multiple of each (the
   machine's speed moves them all). Then the statement's costs: ClickHouse's
   analysis of it (`EXPLAIN QUERY TREE`), one trace (the fixed cost of a pass with work) and
   the marginal cost per request (a batch of N traces minus one trace, over N - 1); and the
   single-call statement's marginal cost up to the end of each of its steps (reading the spans,
   the GROUP BY by trace, each trace's row, the final SELECT: each read out to `FORMAT Null`),
   then writing its rows.
   Last, the pass that makes serve's tail, alone (`quiet_pass`): the same requests, with the
   attributor's clock 1 s after the newest span, so ingest has paused and the last 4 s of the
   burst are taken in the early window: its CPU, and by statement. And the budget: while serve's
   CPU bounds it, on / off to done is at best the "off" runs' CPU over the "on" runs', so 0.9
   leaves the attributor a ninth of what serve costs a request with it off; the attributor
   alone, the quiet pass and the two baselines are printed in us a request and as a share of
   that budget.
3. **Checks**: every request attributed (in both stores), and for a sample the rows equal what the
   reference engine (`attribute_requests`) gives for the stored spans.
4. **The rollup builder**: every hour of those rows built (`Rollups.run_until_idle()`), CPU seconds
   per hour built and beside serve's CPU for the same requests.
5. **With stored history** (`--history-spans N`, 0 skips it): the attributor alone again, in passes
   of about `HISTORY_BATCH` traces (the size of serve's passes), each a slice of ingest time as
   serve's are (random trace ids, not a range of them), first over the store as it is, then
   with N spans of earlier traffic stored in the `HISTORY_HOURS` hours before the requests (7-span
   traces with random ids, ingested before them), with the default reach
   (`--attribution-reach-s`) and with a day of reach: what stored history costs each pass.
   Before the history, also `SMALL_PASSES` passes of one insert's traces each (serve's passes
   at about one insert a second): their random trace ids touch most granules of the hours they
   are in, so a small pass reads about what a big one reads.

6. **Low traffic** (`--trickle-s S`, 0 skips it): serve with the attributor off, then on, fresh
   stores, sent one Export of 64 requests a second for S seconds (then a settle window, so the
   last are attributed): serve's CPU over that time in cores, and the attributor's share (on
   minus off). At this rate each pass has a few dozen traces, so what it costs is the fixed cost
   of a pass (its statements' analysis and planning, the insert, the polls), paid every second.
7. **Live passes** (`--live-passes N`, 0 skips it; bench/attribution/live.py): in a fresh store,
   1,000 of the requests inserted, then one pass over them, N times a set: with no earlier
   traffic, then with copies of every request stored earlier in the same hours (one merged part),
   under the trace id index the schema gives and under the one before it, alternating: what the
   parts merged before cost a live pass, and how much of them each index lets it skip. Then N
   passes at serve's cadence with the spans' merges running (1,000 requests a second in 5
   inserts, settle window 5 s): what the merges between a pass's inserts and the pass change.

Everything the run creates is removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from bench.attribution.live import (
    insertable_spans,
    live_passes,
    passes_possible,
    print_live,
    requests_needed,
    stored_resources,
)
from bench.attribution.traces import SPANS, Traces
from bench.sqlids import hex_trace_id, hex_word
from latscope.config import DEFAULT_REACH_S

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
#: Requests start here (a fixed past time, so every run stores the same rows) and are spread
#: over HOURS hours, as traffic would be (the rollup builder builds those hours).
T0 = 1_763_000_000_000_000_000
HOURS = 4
HOUR_NS = 3600 * 10**9
PER_EXPORT = 64
SENDERS = 4
#: Traces whose rows are compared with the reference engine's.
SAMPLE = 300
#: Traces of the batch the marginal cost is measured on.
MARGINAL_TRACES = 20_000
#: Stored history: how many hours before the requests it covers, and the traces per pass.
HISTORY_HOURS = 20
HISTORY_BATCH = 10_000
#: Passes of one insert's traces each (serve's smallest), before the history is stored.
SMALL_PASSES = 40
#: Rows per INSERT of history (each well inside the store's query time limit).
HISTORY_CHUNK = 2_000_000
#: Low traffic: after the last Export, serve's default settle window (5 s) and a poll to spare.
TRICKLE_TAIL_S = 7.0
BARE_SINK = "latscope_bench_bare_read"
#: Passes of each set of the live passes (part 7), unless --live-passes says otherwise.
LIVE_PASSES = 10
_METRIC = re.compile(r"^(latscope_[a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$", re.M)


# -- the load ------------------------------------------------------------------------------------


def _by_statement(spent: dict[str, list[float]]) -> str:
    """CPU seconds and calls of each statement, the costliest first."""
    ranked = sorted(spent.items(), key=lambda kv: -kv[1][0])
    return ", ".join(f"{name} {cpu:.2f} s ({int(calls)}x)" for name, (cpu, calls) in ranked)


def _tail_threads(run: ServeRun) -> str:
    """serve's CPU from the last span stored to done, in cores and by thread name."""
    tail_s = max(run.done_s - run.stored_s, 1e-9)
    spent = sorted(((cpu, name) for name, cpu in run.tail_threads.items() if cpu >= 0.05),
                   reverse=True)  # fmt: skip
    return (
        f"{run.tail_cpu_s:.2f} CPU s in {tail_s:.2f} s ({run.tail_cpu_s / tail_s:.2f} cores); "
        "by thread name: " + ", ".join(f"{name} {cpu:.2f}" for cpu, name in spent)
    )


def _burst_threads(on: ServeRun, off: ServeRun) -> str:
    """serve's CPU from the first send to the last span stored, the "on" run's against the
    "off" run's: in all, Python's threads (the engine parses, analyses and plans each statement
    on its caller's) and the engine's own (summed: it renames a pool thread for the work it
    takes, so a name's CPU moves between names from one run to the next). The split leaves out
    threads that ended before the last span was stored, so it may add up to less than the
    whole."""

    def python(run: ServeRun) -> float:
        return run.stored_threads.get("python", 0.0)

    def engine(run: ServeRun) -> float:
        return sum(run.stored_threads.values()) - python(run)

    return (
        f"{on.stored_cpu_s - off.stored_cpu_s:+.2f} CPU s against off (Python's threads "
        f"{python(on) - python(off):+.2f}, the engine's {engine(on) - engine(off):+.2f})"
    )


def _threads_since(
    before: dict[str, tuple[str, float]], after: dict[str, tuple[str, float]]
) -> dict[str, float]:
    """Each thread's CPU between two ``Serve.thread_cpu_s`` readings, summed under its name at
    the second (a thread that ended meanwhile is left out; an id with less CPU than before is a
    new thread's)."""
    spent: dict[str, float] = {}
    for tid, (name, now_cpu) in after.items():
        was = before.get(tid, ("", 0.0))[1]
        spent[name] = spent.get(name, 0.0) + (now_cpu - was if now_cpu >= was else now_cpu)
    return spent


def build_exports(requests: int, seed: int = 1, *, pod_resources: bool = False) -> list[bytes]:
    traces = Traces(seed, pod_resources=pod_resources)
    spacing = HOURS * HOUR_NS // requests
    return [
        traces.export(T0 + i * spacing, min(PER_EXPORT, requests - i), spacing)
        for i in range(0, requests, PER_EXPORT)
    ]


def send_all(addr: str, exports: list[bytes], senders: int) -> None:
    """Each Export once, from ``senders`` threads; a refused one (memory bound) is sent again."""
    channel = grpc.insecure_channel(addr)
    call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
    it = iter(exports)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            while True:
                with lock:
                    payload = next(it, None)
                if payload is None:
                    return
                while True:
                    try:
                        call(payload, timeout=60)
                        break
                    except grpc.RpcError as exc:
                        if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                            raise
                        time.sleep(0.05)
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(senders)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    channel.close()
    if errors:
        raise errors[0]


# -- serve ---------------------------------------------------------------------------------------


#: Linux: prctl's PR_CAPBSET_DROP.
_PR_CAPBSET_DROP = 24


def _drop_cap_sys_nice() -> None:
    """In the child before it starts serve: CAP_SYS_NICE out of the bounding set, so serve runs
    without it (as root: an exec grants the bounding set, less it)."""
    from latscope.storage import CAP_SYS_NICE

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_CAPBSET_DROP, CAP_SYS_NICE, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP, CAP_SYS_NICE)")


def _proc_cpu(stat_path: str) -> tuple[str, float]:
    """The name and user + system CPU seconds in a /proc stat file (a process's or a thread's)."""
    with open(stat_path) as f:
        stat = f.read()
    fields = stat.rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return stat[stat.index("(") + 1 : stat.rindex(")")], cpu


class Serve:
    """``latscope serve`` on loopback ports over a fresh store in ``workdir``; ``nice``: with
    CAP_SYS_NICE where this process has it (False: without, ``_drop_cap_sys_nice``)."""

    def __init__(self, workdir: Path, *args: str, nice: bool = True) -> None:
        self.store_dir = workdir / "store"
        cmd = [
            sys.executable, "-m", "latscope.cli", "serve",
            "--store", f"chdb://{self.store_dir}",
            "--otlp-grpc", "127.0.0.1:0", "--http", "127.0.0.1:0",
            "--max-span-age-s", "0", "--max-span-future-s", "0",
            "--spool-dir", str(workdir / "spool"),
            *args,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=None if nice else _drop_cap_sys_nice,
        )
        assert self.proc.stdout is not None
        self.lines: list[str] = []
        grpc_addr = http_addr = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (grpc_addr and http_addr):
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line.rstrip())
            if m := re.search(r"OTLP/gRPC\s+(\S+)", line):
                grpc_addr = m.group(1)
            if m := re.search(r"HTTP\s+(http://\S+)", line):
                http_addr = m.group(1)
        if not (grpc_addr and http_addr):
            self.stop()
            raise RuntimeError("latscope serve did not start:\n" + "\n".join(self.lines))
        self.grpc, self.http = grpc_addr, http_addr
        # Keep draining its output so a chatty server never blocks on a full pipe.
        threading.Thread(
            target=lambda: self.lines.extend(x.rstrip() for x in self.proc.stdout or ()),
            daemon=True,
        ).start()

    def cpu_s(self) -> float:
        """User + system CPU seconds of the whole process (every thread, ended ones too)."""
        return _proc_cpu(f"/proc/{self.proc.pid}/stat")[1]

    def thread_cpu_s(self) -> dict[str, tuple[str, float]]:
        """Each live thread of serve by id: its name (Python's threads are all "python"; the
        embedded engine names its own, and renames a pool thread for the work it takes) and its
        user + system CPU seconds."""
        out: dict[str, tuple[str, float]] = {}
        task = f"/proc/{self.proc.pid}/task"
        for tid in os.listdir(task):
            try:
                out[tid] = _proc_cpu(f"{task}/{tid}/stat")
            except OSError:  # the thread ended meanwhile
                continue
        return out

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"{self.http}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        return {m.group(1) + (m.group(2) or ""): float(m.group(3)) for m in _METRIC.finditer(text)}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_STORED = 'latscope_collector_accepted_total{signal="traces"}'
_QUEUED = 'latscope_collector_queue_depth{signal="traces"}'
_ATTRIBUTED = "latscope_attributed_requests_total"


@dataclass
class ServeRun:
    attributor: str
    spans: int
    stored_s: float  # first send -> every span stored
    done_s: float  # first send -> every span stored (off) / every request attributed (on)
    cpu_s: float  # serve's CPU over done_s
    store_dir: Path
    passes: int  # attributor passes that wrote rows (seen as steps of its counter)
    background: bool  # serve had CAP_SYS_NICE: the attributor's statements at background priority
    #: serve's CPU seconds from the last span stored to done (the tail), all of them and those of
    #: its threads still running at done, by their names at done
    tail_cpu_s: float
    tail_threads: dict[str, float]
    #: serve's CPU seconds from the first send to the last span stored, all of them and by
    #: thread name (as the tail's)
    stored_cpu_s: float
    stored_threads: dict[str, float]


def serve_run(
    attributor: str,
    exports: list[bytes],
    requests: int,
    args: argparse.Namespace,
    workdir: Path,
    *,
    nice: bool = True,
) -> ServeRun:
    from latscope.storage import has_cap_sys_nice

    serve = Serve(
        workdir,
        *("--attributor", attributor, "--attribution-settle-s", str(args.settle_s)),
        *("--attribution-complete-s", str(args.complete_s)),
        *("--attribution-early-when-quiet", args.early_when_quiet),
        nice=nice,
    )
    background = has_cap_sys_nice(serve.proc.pid)  # as the store tells (Store.background)
    spans = requests * SPANS
    try:
        at_start, cpu0 = serve.thread_cpu_s(), serve.cpu_s()
        started = time.perf_counter()
        sender = threading.Thread(target=send_all, args=(serve.grpc, exports, args.senders))
        sender.start()
        stored_s = None
        at_stored: dict[str, tuple[str, float]] = {}
        cpu_stored = 0.0
        deadline = started + args.timeout_s
        passes, attributed = 0, 0.0
        while True:
            m = serve.metrics()
            now = time.perf_counter()
            # A pass writes all its rows in one statement: each step of the counter is one pass
            # (polled every 50 ms, shorter than any pass).
            passes += m.get(_ATTRIBUTED, 0) > attributed
            attributed = m.get(_ATTRIBUTED, 0)
            if stored_s is None and m.get(_STORED, 0) >= spans and m.get(_QUEUED, 1) == 0:
                stored_s = now - started
                at_stored, cpu_stored = serve.thread_cpu_s(), serve.cpu_s()
            if stored_s is not None and (attributor == "off" or m.get(_ATTRIBUTED, 0) >= requests):
                break
            if now > deadline:
                raise RuntimeError(f"serve ({attributor}) not done after {args.timeout_s} s: {m}")
            time.sleep(0.05)
        done_s = now - started
        at_done, cpu_done = serve.thread_cpu_s(), serve.cpu_s()
        cpu = cpu_done - cpu0
        sender.join()
    finally:
        serve.stop()
    return ServeRun(
        attributor, spans, stored_s, done_s, cpu, serve.store_dir, passes, background,
        cpu_done - cpu_stored, _threads_since(at_stored, at_done), cpu_stored - cpu0,
        _threads_since(at_start, at_stored),
    )  # fmt: skip


@dataclass
class Trickle:
    attributor: str
    requests: int
    wall_s: float
    cpu_s: float
    attributed: float


def trickle_run(attributor: str, seconds: float, workdir: Path) -> Trickle:
    """serve fed one Export of PER_EXPORT requests a second for ``seconds``, then left for a
    settle window and a poll (so every request is attributed): its CPU over that time."""
    exports = build_exports(PER_EXPORT * max(1, int(seconds)), seed=7)
    serve = Serve(workdir, "--attributor", attributor)
    channel = grpc.insecure_channel(serve.grpc)
    try:
        call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        time.sleep(2.0)  # serve's start-up work (schema, first polls) is not the traffic's
        cpu0, started = serve.cpu_s(), time.perf_counter()
        for i, payload in enumerate(exports):
            call(payload, timeout=60)
            time.sleep(max(0.0, started + i + 1 - time.perf_counter()))
        time.sleep(TRICKLE_TAIL_S)
        wall, cpu = time.perf_counter() - started, serve.cpu_s() - cpu0
        attributed = serve.metrics().get(_ATTRIBUTED, 0.0)
    finally:
        channel.close()
        serve.stop()
    return Trickle(attributor, PER_EXPORT * len(exports), wall, cpu, attributed)


# -- the attributor and the rollups alone, in this process ---------------------------------------


def _cpu_of(fn: Any) -> tuple[float, Any]:
    cpu0 = time.process_time()
    out = fn()
    return time.process_time() - cpu0, out


def _first_traces(store: Any) -> tuple[str, list[str]]:
    """The batch of the statements' marginal costs: a sub-query of the first traces by id up to
    the ``last`` parameter, as the attributor's own batch is a sub-query (an array parameter of
    thousands of ids is pasted into the statement's text, and ClickHouse's analysis of that text
    then costs more than attributing them); and the first ``MARGINAL_TRACES`` trace ids."""
    from latscope.storage import SPANS_TABLE

    first_ids = (
        f"SELECT TraceId AS trace_id FROM {SPANS_TABLE} "
        "WHERE TraceId <= {last:String} GROUP BY TraceId"
    )
    ids = [
        r[0]
        for r in store.query_rows(
            f"SELECT DISTINCT TraceId FROM {SPANS_TABLE} ORDER BY TraceId LIMIT {MARGINAL_TRACES}"
        )
    ]
    return first_ids, ids


def _batch_params(last: str) -> dict[str, Any]:
    """The statements' parameters over ``_first_traces``' batch up to the trace id ``last``."""
    from latscope.tokens import DEFAULT_STALL_NS

    return {"last": last, "stall_ns": DEFAULT_STALL_NS, "through_us": 0, "after_us": 0}


def _one_and_marginal(ask: Any, ids: list[str], rounds: int) -> tuple[float, float]:
    """CPU seconds of ``ask(params)`` over the batch of the first trace alone, and per trace
    beyond one over the batch of all of ``ids`` (best of ``rounds`` each)."""

    def best(last: str) -> float:
        return min(_cpu_of(lambda: ask(_batch_params(last)))[0] for _ in range(rounds))

    one = best(ids[0])
    return one, (best(ids[-1]) - one) / (len(ids) - 1)


def statement_costs(store: Any) -> dict[str, dict[str, float]]:
    """CPU seconds of each attribution SELECT (the single-call path's and the general one's):
    its analysis alone, one trace, and per request beyond one (best of 3 each)."""
    from latscope.attribution.sql import attribution_select, simple_select
    from latscope.storage import SPANS_TABLE

    first_ids, ids = _first_traces(store)
    out = {}
    statements = (
        ("single-call", simple_select(first_ids, SPANS_TABLE, "1")),
        # The same by resource id (the statement the collector's spans take).
        ("single-call by id", simple_select(first_ids, SPANS_TABLE, "1", True, True)),
        ("general", attribution_select(first_ids, SPANS_TABLE, "1")),
    )
    for name, sql in statements:
        params = _batch_params(ids[0])
        store.query_arrow(sql, params)  # warm-up
        explain = "EXPLAIN QUERY TREE " + sql
        analysis = min(_cpu_of(lambda: store.query_rows(explain, params))[0] for _ in range(3))  # noqa: B023
        one, marginal = _one_and_marginal(lambda p: store.query_arrow(sql, p), ids, rounds=3)  # noqa: B023
        out[name] = {"analysis": analysis, "one": one, "marginal": marginal, "traces": len(ids)}
    return out


#: The single-call statement's steps ``stage_costs`` parts it into: each is every common table
#: expression up to the one named (``None``: the final SELECT), read out to ``FORMAT Null``.
STEPS = (
    ("reading the batch's spans", "simple_spans"),
    ("the GROUP BY by trace", "simple_traces"),
    ("each trace's request and row", "rows"),
    ("the final SELECT", None),
)


def stage_costs(store: Any) -> list[tuple[str, float]]:
    """Where the single-call statement by resource id (the one the collector's spans take) spends
    its marginal CPU per request: its steps (``STEPS``), then the whole statement inserting into a
    copy of the attribution table (merges stopped), best of 5 each. Seconds per request beyond
    one, up to the end of each step (every step before it included)."""
    from latscope.attribution.sql import simple_select
    from latscope.attribution.statements import INSERT_SETTINGS
    from latscope.attribution.table import ATTRIBUTION_SCHEMA
    from latscope.storage import SPANS_TABLE

    first_ids, ids = _first_traces(store)
    sql = simple_select(first_ids, SPANS_TABLE, "1", True, True)
    body, settings = sql.rsplit("\nSETTINGS", 1)
    ctes = body[: body.rindex("\nSELECT")]

    def marginal(text: str) -> float:
        return _one_and_marginal(lambda p: store.command(text, p), ids, rounds=5)[1]

    out = []
    for what, name in STEPS:
        select = f"{ctes}\nSELECT * FROM {name}" if name else body
        out.append((what, marginal(f"{select}\nSETTINGS{settings}\nFORMAT Null")))
    columns = ", ".join(ATTRIBUTION_SCHEMA.names)
    store.command("CREATE TABLE latscope_bench_rows AS latscope_attribution")
    try:
        store.command("SYSTEM STOP MERGES latscope_bench_rows")
        into = f"INSERT INTO latscope_bench_rows ({columns}) {INSERT_SETTINGS}\n"
        out.append(("writing the rows (a copy of the attribution table)", marginal(into + sql)))
    finally:
        store.command("DROP TABLE latscope_bench_rows SYNC")
    return out


def check_rows(store: Any, requests: int, seed: int = 5) -> tuple[int, int]:
    """(requests attributed, sample compared): every request has one live row, and for a sample
    of traces the rows equal the reference engine's over the stored spans."""
    from latscope.attribution.engine import attribute_requests
    from latscope.attribution.spans import load_trace
    from latscope.attribution.table import ATTRIBUTION_SCHEMA, attribution_row
    from latscope.storage import ATTRIBUTION_TABLE

    live = store.query_rows(
        f"SELECT count(), uniqExact(TraceId, RequestSpanId) FROM {ATTRIBUTION_TABLE} FINAL "
        "WHERE IsDeleted = 0"
    )[0]
    assert live[0] == live[1] == requests, (live, requests)
    traces = [r[0] for r in store.query_rows(f"SELECT DISTINCT TraceId FROM {ATTRIBUTION_TABLE}")]
    sample = random.Random(seed).sample(traces, min(SAMPLE, len(traces)))
    columns = ", ".join(ATTRIBUTION_SCHEMA.names)
    got = store.query_arrow(
        f"SELECT {columns} FROM {ATTRIBUTION_TABLE} FINAL "
        "WHERE TraceId IN {ids:Array(String)} AND IsDeleted = 0",
        {"ids": sample},
    )
    ts = got.schema.get_field_index("Timestamp")
    got = got.set_column(ts, "Timestamp", got.column(ts).cast("int64")).to_pylist()
    by_key = {(r["TraceId"], r["RequestSpanId"]): r for r in got}
    compared = 0
    for trace_id in sample:
        spans = load_trace(store, trace_id)
        for a in attribute_requests(trace_id, spans):
            want = attribution_row(a, span_count=len(spans), ingested_us=0)
            row = by_key[(trace_id, a.request_span_id)]
            for key, w in want.items():
                if key == "SpansIngestedAt":  # the pass's watermark
                    continue
                g = row[key]
                if key in ("Gpu", "ResourceAttributes"):
                    w, g = dict(w), dict(g or [])
                assert _same(w, g), (trace_id, key, w, g)
            compared += 1
    return int(live[0]), compared


def _same(w: Any, g: Any) -> bool:
    if isinstance(w, dict):
        return w.keys() == g.keys() and all(_same(w[k], g[k]) for k in w)
    if w is None or g is None:
        return w is None and g is None
    if isinstance(w, float) or isinstance(g, float):
        return math.isclose(float(w), float(g), rel_tol=1e-9, abs_tol=1e-6)
    return w == g


@dataclass
class Alone:
    written: int
    attributor_cpu: float
    passes: int
    costs: dict[str, dict[str, float]]
    hours: int
    rollup_cpu: float
    #: CPU seconds and calls per statement of the attributor (its ``_Statements`` names).
    statements: dict[str, list[float]]
    #: CPU seconds of each further run over the same spans (the attribution table emptied first).
    repeats: list[float]
    #: CPU seconds of the bare read after each run (the first run's first), and of the grouped
    #: read (``bare_read``'s ``grouped``) after it.
    bare: list[float]
    grouped: list[float]
    #: The single-call statement's marginal CPU seconds per request by step (``stage_costs``).
    stages: list[tuple[str, float]]
    #: A quiet pass over the same requests (``quiet_pass``): CPU seconds, and by statement.
    quiet_cpu: float
    quiet_statements: dict[str, list[float]]


def statement_names(attributor: Any) -> dict[str, str]:
    """``attributor``'s statements' text, each to its name (its attribute's), those with early
    attribution marked so."""
    out = {}
    for versioned, sql in attributor._early_sql.items():
        mark = "early, versioned" if versioned else "early"
        out.update({v: f"{k} ({mark})" for k, v in vars(sql).items() if isinstance(v, str)})
    out.update({v: k for k, v in vars(attributor._sql).items() if isinstance(v, str)})
    return out


@contextlib.contextmanager
def statements_through(
    store: Any, through: Callable[[str, Callable[[str], Any]], Any]
) -> Iterator[None]:
    """While inside, each statement ``store`` runs (``command``, ``query_rows``) goes through
    ``through(sql, run)``, where ``run(text)`` makes the call with ``text`` for the statement.
    Inside another, it wraps that one's calls, which it gives back on leaving."""

    def wrapped(call: Any) -> Any:
        def wrapped_call(sql: str, *args: Any, **kwargs: Any) -> Any:
            return through(sql, lambda text: call(text, *args, **kwargs))

        return wrapped_call

    methods = ("command", "query_rows")
    before = {method: vars(store).get(method) for method in methods}
    for method in methods:
        setattr(store, method, wrapped(getattr(store, method)))
    try:
        yield
    finally:
        for method, call in before.items():
            if call is None:
                delattr(store, method)
            else:
                setattr(store, method, call)


def statements_timed(
    store: Any, attributor: Any, into: dict[str, list[float]]
) -> contextlib.AbstractContextManager[None]:
    """While inside, each statement ``store`` runs (``command``, ``query_rows``) adds its CPU
    seconds and a call to ``into``, under its name among ``attributor``'s statements
    (``statement_names``; else "other")."""

    def timed(sql: str, run: Callable[[str], Any]) -> Any:
        cpu, out = _cpu_of(lambda: run(sql))
        spent = into.setdefault(statement_names(attributor).get(sql, "other"), [0.0, 0])
        spent[0] += cpu
        spent[1] += 1
        return out

    return statements_through(store, timed)


def read_columns(store: Any, insert_simple: str) -> list[str]:
    """The spans' columns the single-call statement ``insert_simple`` reads (the statement these
    requests take), as ClickHouse plans its read of the batch's spans: the header of that step of
    its plan."""
    from latscope.storage import SPANS_TABLE

    insert, select = insert_simple.split("\n", 1)
    assert insert.startswith("INSERT INTO") and select.startswith("WITH"), insert
    # Any value of each of its parameters: the plan's columns do not depend on them.
    params = {
        name: "" if type_ == "String" else 0
        for name, type_ in re.findall(r"\{(\w+):(\w+)\}", select)
    }
    plan = "\n".join(row[0] for row in store.query_rows(f"EXPLAIN header = 1 {select}", params))
    reads = re.findall(
        rf"ReadFromMergeTree \((?:\w+\.)?{SPANS_TABLE}\)\s*\n\s*Header: (.*?)\n\s*Read type",
        plan,
        re.S,
    )
    if not reads:
        # The plan of a statement over an empty table reads nothing: no columns to copy.
        raise RuntimeError(
            f"the single-call statement's plan reads no {SPANS_TABLE}: its columns are "
            "planned on a store that holds spans"
        )
    # The widest read of the spans is the batch's spans; the others are its trace ids.
    columns = [line.split()[0] for line in max(reads, key=len).splitlines()]
    assert "TraceId" in columns and "Duration" in columns, columns
    return columns


def bare_read(store: Any, columns: str, *, grouped: bool = False) -> float:
    """CPU seconds of reading ``columns`` (those the attributor reads, ``read_columns``), of every
    stored span, into a Null table: what any attributor inside ClickHouse pays at least for these
    requests, and a baseline measured after each of its runs (this machine's speed swings between
    runs: the ratio of the two moves less than either). ``grouped``: each trace's spans grouped
    into one row (``TraceId`` and an array of its spans' other columns): a GROUP BY by trace that
    carries every column read, with nothing worked out."""
    from latscope.storage import SPANS_TABLE

    select = f"SELECT {columns} FROM {SPANS_TABLE}"
    if grouped:
        others = ", ".join(c for c in columns.split(", ") if c != "TraceId")
        select = f"SELECT TraceId, groupArray(({others})) FROM {SPANS_TABLE} GROUP BY TraceId"
    store.command(f"CREATE TABLE IF NOT EXISTS {BARE_SINK} ENGINE = Null AS {select} LIMIT 0")
    try:
        cpu, _ = _cpu_of(lambda: store.command(f"INSERT INTO {BARE_SINK} {select}"))
    finally:
        store.command(f"DROP TABLE IF EXISTS {BARE_SINK}")
    return cpu


def _attribute_again(
    store: Any, requests: int, *, after_us: int | None = None, **kwargs: Any
) -> float:
    """CPU seconds of a new attributor (``kwargs``) that attributes every request of the store
    again: the attribution table emptied first, it starts from ``after_us`` (ingest time; None:
    where a new attributor resumes, the first span)."""
    from latscope.attribution.attributor import Attributor
    from latscope.storage import ATTRIBUTION_TABLE

    store.command(f"TRUNCATE TABLE {ATTRIBUTION_TABLE}")
    attributor = Attributor(store, settle_s=0.0, **kwargs)
    attributor.watermark_us = after_us
    cpu, written = _cpu_of(lambda: attributor.run_until_idle(max_batches=10**6))
    assert written == requests, (written, requests)
    return cpu


@contextlib.contextmanager
def spans_merges_stopped(store: Any) -> Iterator[None]:
    """The spans table's background merges stopped while the attributor is timed.

    chDB merges in background threads of the process that opened the store, so
    ``process_time`` counts them. A store serve wrote and closed has parts still to merge, and
    the process that opens it next may merge them (8 parts of the 1.4 M spans of part 1 into 2
    in the first 5 s: 2.4 CPU s; another time, none in 12 s), in the middle of a timed run.
    Merging spans is ingest's work; the attributor reads the parts serve left. The attribution
    table's merges (of the attributor's own inserts) keep running: they are its work."""
    from latscope.storage import SPANS_TABLE

    store.command(f"SYSTEM STOP MERGES {SPANS_TABLE}")
    try:
        yield
    finally:
        store.command(f"SYSTEM START MERGES {SPANS_TABLE}")


def stored_burst(requests: int, workdir: Path, *, senders: int = SENDERS) -> ServeRun:
    """``requests`` unique requests (``build_exports``) stored through ``latscope serve`` with the
    attributor off, in ``workdir``, by ``senders`` at once: a store for the attributor's parts
    that run in this process."""
    args = argparse.Namespace(
        settle_s=5.0, complete_s=0.0, early_when_quiet="on", senders=senders, timeout_s=600.0
    )
    return serve_run("off", build_exports(requests), requests, args, workdir)


def quiet_attributor(store: Any) -> Any:
    """An attributor whose next pass is the one serve makes once a burst has stopped (the tail
    of part 1): serve's settle window (5 s), its clock 1 s after the newest stored span, so
    ingest has paused, and its watermark before the first. That pass takes the traces stored up
    to 4 s before the newest span as settled, and the rest in the early window."""
    from latscope.attribution.attributor import Attributor
    from latscope.storage import SPANS_TABLE

    oldest, newest = (
        int(v)
        for v in store.query_rows(
            "SELECT toUnixTimestamp64Micro(min(LatscopeIngestedAt)), "
            f"toUnixTimestamp64Micro(max(LatscopeIngestedAt)) FROM {SPANS_TABLE}"
        )[0]
    )
    attributor = Attributor(store, settle_s=5.0)
    attributor._now_us = lambda: newest + 1_000_000
    attributor.watermark_us = oldest - 2_000_000
    return attributor


def quiet_pass(
    store: Any,
    requests: int,
    through: Callable[[Any], Callable[[str, Callable[[str], Any]], Any]] | None = None,
) -> tuple[float, dict[str, list[float]]]:
    """CPU seconds of the pass serve makes once a burst has stopped, over every stored request
    (the attribution table emptied first; ``quiet_attributor``), and its CPU by statement
    (``statements_timed``). ``through``: given the pass's attributor, what each of its statements
    goes through as well (``statements_through``), inside the timing."""
    from latscope.storage import ATTRIBUTION_TABLE

    store.command(f"TRUNCATE TABLE {ATTRIBUTION_TABLE}")
    attributor = quiet_attributor(store)
    spent: dict[str, list[float]] = {}
    with contextlib.ExitStack() as watching:
        if through is not None:
            watching.enter_context(statements_through(store, through(attributor)))
        watching.enter_context(statements_timed(store, attributor, spent))
        cpu, written = _cpu_of(lambda: attributor.run_until_idle(max_batches=10**6))
    assert written == requests, (written, requests)
    assert any("early" in name for name in spent), spent  # it took the early window
    return cpu, spent


def alone(store_dir: Path, requests: int, runs: int) -> Alone:
    from latscope.attribution.attributor import Attributor
    from latscope.attribution.rollups import Rollups
    from latscope.storage import SPANS_TABLE, Store

    store = Store.open(f"chdb://{store_dir}")
    try:
        with spans_merges_stopped(store):
            attributor = Attributor(store, settle_s=0.0)
            # The bare read's columns, planned once before the runs.
            # The statement these requests take: by resource id when the collector stored every
            # span's (deploy/clickhouse/012_resource_ids.sql), else with the attributes.
            unnamed = store.query_rows(
                f"SELECT countIf(LatscopeResourceId = 0) FROM {SPANS_TABLE}"
            )[0][0]
            simple = attributor._sql.insert_simple_ids
            if int(unnamed):
                simple = attributor._sql.insert_simple
            columns = ", ".join(read_columns(store, simple))
            passes = [0]
            slice_ = attributor.attribute_slice

            def counted(*a: Any, **kw: Any) -> int:
                passes[0] += 1
                return slice_(*a, **kw)

            attributor.attribute_slice = counted  # type: ignore[method-assign]
            statements: dict[str, list[float]] = {}
            with statements_timed(store, attributor, statements):
                cpu, written = _cpu_of(lambda: attributor.run_until_idle(max_batches=10**6))
            assert written == requests, (written, requests)
            rollups = Rollups(store, settle_s=0.0, margin_s=0.0)
            rollup_cpu, hours = _cpu_of(rollups.run_until_idle)
            costs = statement_costs(store)
            stages = stage_costs(store)
            bare = [bare_read(store, columns)]
            grouped = [bare_read(store, columns, grouped=True)]
            # The same work again (the machine's load swings between runs): a new attributor starts
            # from an empty attribution table, so it attributes every request again.
            repeats = []
            for _ in range(runs - 1):
                repeats.append(_attribute_again(store, requests))
                bare.append(bare_read(store, columns))
                grouped.append(bare_read(store, columns, grouped=True))
            quiet_cpu, quiet_statements = quiet_pass(store, requests)
            return Alone(
                written, cpu, passes[0], costs, hours, rollup_cpu, statements, repeats, bare,
                grouped, stages, quiet_cpu, quiet_statements,
            )  # fmt: skip
    finally:
        store.close()


@dataclass
class History:
    spans: int
    #: requests per CPU second: before the history was stored; with it, at the default reach
    #: and at a day of reach
    before: float
    default_reach: float
    day_reach: float
    #: passes of one insert each, before the history: requests per CPU second, requests and
    #: CPU seconds a pass
    small: tuple[float, float, float]


def _history_rate(store: Any, requests: int, after_us: int, step_s: float, **kwargs: Any) -> float:
    """Requests per CPU second of an attributor that starts at ``after_us`` (ingest time), in
    slices of ``step_s`` of ingest (each its own pass, as serve's are) of at most HISTORY_BATCH
    traces."""
    cpu = _attribute_again(
        store, requests, after_us=after_us, batch_traces=HISTORY_BATCH, step_s=step_s, **kwargs
    )
    return requests / cpu


def _small_pass_rate(store: Any, after_us: int) -> tuple[float, float, float]:
    """SMALL_PASSES passes of one insert's traces each, from ``after_us`` (ingest time): what a
    pass costs when its traces are few beside the spans stored in its reach. Each pass's random
    trace ids touch most granules of the hours they are in, so a pass reads about what a big one
    reads. Returns requests per CPU second, requests a pass and CPU seconds a pass."""
    from latscope.attribution.attributor import Attributor
    from latscope.storage import ATTRIBUTION_TABLE

    store.command(f"TRUNCATE TABLE {ATTRIBUTION_TABLE}")
    # A slice of 1 us holds one insert (its spans share their LatscopeIngestedAt), and an empty
    # one skips to the next span.
    attributor = Attributor(store, settle_s=0.0, step_s=1e-6)
    attributor.watermark_us = after_us
    written, passes, cpu = 0, 0, 0.0
    for _ in range(100 * SMALL_PASSES):
        spent, n = _cpu_of(lambda: attributor.run_until_idle(max_batches=1))
        written, passes, cpu = written + n, passes + (n > 0), cpu + spent
        if passes == SMALL_PASSES:
            break
    return written / cpu, written / max(passes, 1), cpu / max(passes, 1)


def with_history(store_dir: Path, requests: int, spans: int) -> History:
    """The attributor alone before and after ``spans`` spans of earlier traffic are stored in
    the HISTORY_HOURS hours before the requests, ingested before them."""
    from latscope.storage import SPANS_TABLE, Store

    store = Store.open(f"chdb://{store_dir}")
    try:
        first_us, last_us = (
            int(v)
            for v in store.query_rows(
                "SELECT toUnixTimestamp64Micro(min(LatscopeIngestedAt)), "
                f"toUnixTimestamp64Micro(max(LatscopeIngestedAt)) FROM {SPANS_TABLE}"
            )[0]
        )
        # Passes of about HISTORY_BATCH traces as serve makes them: slices of ingest time, each
        # a batch of random trace ids (one slice cut into batches would be cut by trace id, and
        # each batch would read only its range's granules: a backlog, not serve's passes).
        step_s = (last_us - first_us) / 1e6 * HISTORY_BATCH / requests
        with spans_merges_stopped(store):
            small = _small_pass_rate(store, first_us - 1)
            before = _history_rate(store, requests, first_us - 1, step_s)
        span_ns = HISTORY_HOURS * HOUR_NS // spans
        for lo in range(0, spans, HISTORY_CHUNK):
            store.command(
                f"""
INSERT INTO {SPANS_TABLE} (Timestamp, TraceId, SpanId, ParentSpanId, ServiceName, SpanName,
    SpanKind, Duration, SpanAttributes, LatscopeIngestedAt)
SELECT fromUnixTimestamp64Nano(toInt64({{t0:Int64}} + n * {{step:Int64}})),
       {hex_trace_id("intDiv(n, 7)")},
       {hex_word("n", 3)}, '', 'history', 'step', 'Internal', 1000000,
       map('history.step', toString(n % 7)), fromUnixTimestamp64Micro({{ingested_us:Int64}})
FROM (SELECT number + {{lo:UInt64}} AS n FROM numbers({{count:UInt64}}))""",
                {
                    "t0": T0 - HISTORY_HOURS * HOUR_NS,
                    "step": span_ns,
                    "ingested_us": first_us - 3_600_000_000,
                    "lo": lo,
                    "count": min(HISTORY_CHUNK, spans - lo),
                },
            )
        with spans_merges_stopped(store):  # the history's merges are its ingest's work
            default_reach = _history_rate(store, requests, first_us - 1, step_s)
            day_reach = _history_rate(store, requests, first_us - 1, step_s, reach_s=24 * 3600.0)
        return History(spans, before, default_reach, day_reach, small)
    finally:
        store.close()


def check_store(store_dir: Path, requests: int) -> tuple[int, int]:
    from latscope.storage import Store

    store = Store.open(f"chdb://{store_dir}")
    try:
        return check_rows(store, requests)
    finally:
        store.close()


# -- the run -------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--requests", type=int, default=200_000, help="unique requests (x7 spans) per serve run"
    )
    parser.add_argument("--quick", action="store_true", help="50,000 requests")
    parser.add_argument("--senders", type=int, default=SENDERS)
    parser.add_argument(
        "--settle-s", type=float, default=5.0, help="serve's --attribution-settle-s (its default)"
    )
    parser.add_argument(
        "--complete-s",
        type=float,
        default=0.0,
        help="serve's --attribution-complete-s (early attribution; 0: off, its default)",
    )
    parser.add_argument(
        "--early-when-quiet",
        choices=("on", "off"),
        default="on",
        help="serve's --attribution-early-when-quiet (its default: on)",
    )
    parser.add_argument(
        "--normal-priority",
        action="store_true",
        help="a third serve run in each pair: on, without CAP_SYS_NICE (the attributor's "
        "statements at ingest's priority)",
    )
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument(
        "--serve-pairs",
        type=int,
        default=3,
        help="serve runs off then on, alternating (the load moves one run's ratio a lot)",
    )
    parser.add_argument(
        "--history-spans",
        type=int,
        default=14_000_000,
        help=f"spans of earlier traffic stored in the {HISTORY_HOURS} h before the requests for "
        "the last part (0: skip it)",
    )
    parser.add_argument(
        "--alone-runs", type=int, default=3, help="runs of the attributor alone (all printed)"
    )
    parser.add_argument(
        "--live-passes",
        type=int,
        default=None,
        help=f"passes of 1,000 new requests per set for the live passes (0: skip them; default "
        f"{LIVE_PASSES}, or as many as the run's requests allow)",
    )
    parser.add_argument(
        "--trickle-s",
        type=float,
        default=30.0,
        help=f"seconds of low traffic ({PER_EXPORT} requests a second) for the last part (0: skip)",
    )
    args = parser.parse_args()
    requests = 50_000 if args.quick else args.requests
    if args.live_passes is None:
        args.live_passes = min(LIVE_PASSES, passes_possible(requests))
    if args.live_passes > 0 and requests_needed(args.live_passes) > requests:
        parser.error(
            f"--live-passes {args.live_passes} inserts {requests_needed(args.live_passes):,} "
            f"requests, more than the {requests:,} of the run: fewer passes, or --live-passes 0"
        )

    t = time.perf_counter()
    exports = build_exports(requests)
    print(f"{requests:,} requests ({requests * SPANS:,} spans) in {len(exports)} Exports over "
          f"{HOURS} h of timestamps, built in {time.perf_counter() - t:.1f} s; "
          f"{args.senders} senders; settle window {args.settle_s} s; early attribution "
          f"{f'after {args.complete_s} s' if args.complete_s else 'off'} "
          f"({args.early_when_quiet} when ingest pauses)")  # fmt: skip
    workdir = Path(tempfile.mkdtemp(prefix="latscope-attrbench-"))
    try:
        pairs: list[tuple[ServeRun, ServeRun, ServeRun | None, float, tuple[int, int]]] = []
        for i in range(max(1, args.serve_pairs)):
            off = serve_run("off", exports, requests, args, workdir / f"off-{i}")
            on = serve_run("on", exports, requests, args, workdir / f"on-{i}")
            normal = None
            if args.normal_priority:
                normal = serve_run(
                    "on", exports, requests, args, workdir / f"normal-{i}", nice=False
                )
                shutil.rmtree(workdir / f"normal-{i}", ignore_errors=True)
            load1 = os.getloadavg()[0]
            pairs.append((off, on, normal, load1, check_store(on.store_dir, requests)))
            shutil.rmtree(workdir / f"on-{i}", ignore_errors=True)
            if i:  # the first "off" store serves the parts below
                shutil.rmtree(workdir / f"off-{i}", ignore_errors=True)
        off = pairs[0][0]
        solo = alone(off.store_dir, requests, max(1, args.alone_runs))
        live = None
        if args.live_passes > 0:
            from latscope.storage import Store

            store = Store.open(f"chdb://{off.store_dir}")
            try:
                spans, resources = insertable_spans(store), stored_resources(store)
            finally:
                store.close()
            live = live_passes(spans, resources, workdir / "live" / "store", T0, args.live_passes)
            del spans
            shutil.rmtree(workdir / "live", ignore_errors=True)
        history = (
            with_history(off.store_dir, requests, args.history_spans)
            if args.history_spans > 0
            else None
        )
        trickle = (
            [trickle_run(a, args.trickle_s, workdir / f"trickle-{a}") for a in ("off", "on")]
            if args.trickle_s > 0
            else None
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    runs = "off, on, on at normal priority" if args.normal_priority else "off, on"
    print(f"\nlatscope serve, {requests * SPANS:,} spans, {len(pairs)} sets of runs ({runs}):")
    print(f"{'':30s}{'spans/s to done':>17s}{'to stored':>12s}{'serve CPU s':>13s}"
          f"{'spans per CPU s':>17s}")  # fmt: skip
    for i, (off, on, normal, load1, _) in enumerate(pairs, 1):
        for run in (off, on, normal):
            if run is None:
                continue
            label = f"{i}: attributor {run.attributor}"
            if run.attributor == "on":
                label += " (background)" if run.background else " (normal)"
            print(f"{label:30s}{run.spans / run.done_s:>17,.0f}{run.spans / run.stored_s:>12,.0f}"
                  f"{run.cpu_s:>13.1f}{run.spans / run.cpu_s:>17,.0f}")  # fmt: skip
        for name, run in (("on", on), ("on at normal priority", normal)):
            if run is None:
                continue
            print(
                f"{'':3s}ratio {name} / off: spans/s to done {off.done_s / run.done_s:.2f}, to "
                f"stored {off.stored_s / run.stored_s:.2f}; CPU {run.cpu_s / off.cpu_s:.2f}x; "
                f"attributed {run.done_s - run.stored_s:.1f} s after the last span was stored, "
                f"{run.passes} attributor passes with work"
            )
            print(f"{'':5s}the tail: {_tail_threads(run)}")
            print(f"{'':5s}to the last span stored: {_burst_threads(run, off)}")
        print(f"{'':3s}load average {load1:.2f}")
    on_sets = [(off, on) for off, on, _, _, _ in pairs]
    normal_sets = [(off, normal) for off, _, normal, _, _ in pairs if normal is not None]
    for name, chosen in (("on", on_sets), ("on at normal priority", normal_sets)):
        if not chosen:
            continue
        ratio = statistics.median(off.done_s / run.done_s for off, run in chosen)
        stored = statistics.median(off.stored_s / run.stored_s for off, run in chosen)
        print(
            f"ratio {name} / off, median of {len(chosen)}: spans/s to done {ratio:.2f} (target "
            f">= 0.9), to stored {stored:.2f} (settle window {args.settle_s} s)"
        )
    if not all(on.background for _, on, _, _, _ in pairs):
        print("note: serve had no CAP_SYS_NICE: no run had the attributor at background priority")
    for _, _, _, _, (attributed, compared) in pairs:
        print(
            f"checks: {attributed:,} requests attributed, each once (of {requests:,}); "
            f"{compared} requests of {SAMPLE} traces equal to the reference engine's"
        )
    on = pairs[0][1]

    c = solo.costs
    print(f"\nthe attributor alone, stored spans -> attribution rows ({solo.passes} passes):")
    cpus = (solo.attributor_cpu, *solo.repeats)
    rates = [solo.written / cpu for cpu in cpus]
    print(
        f"  {solo.written:,} requests in {solo.attributor_cpu:.2f} CPU s: "
        f"{rates[0]:,.0f} requests per CPU s (target >= 100,000)"
    )
    if solo.repeats:
        median = sorted(rates)[len(rates) // 2]
        print(
            f"  {len(rates)} runs: best {max(rates):,.0f}, median {median:,.0f} requests per CPU s "
            f"({', '.join(f'{r:,.0f}' for r in rates)})"
        )
    times = [cpu / bare for cpu, bare in zip(cpus, solo.bare, strict=True)]
    print(
        f"  baseline, the bare read of the columns it reads (all {solo.written * SPANS:,} spans "
        f"into a Null table) after each run: {', '.join(f'{b:.2f}' for b in solo.bare)} CPU s; "
        f"the attributor {', '.join(f'{t:.1f}' for t in times)}x it (median "
        f"{statistics.median(times):.1f}x)"
    )
    grouped = [cpu / g for cpu, g in zip(cpus, solo.grouped, strict=True)]
    print(
        f"  baseline, the grouped read (the same columns, each trace's spans into one row: a "
        f"GROUP BY by trace carrying them all, nothing worked out) after each run: "
        f"{', '.join(f'{g:.2f}' for g in solo.grouped)} CPU s, "
        f"{solo.written / statistics.median(solo.grouped):,.0f} requests per CPU s (median); the "
        f"attributor {', '.join(f'{t:.1f}' for t in grouped)}x it"
    )
    print(f"  by statement: {_by_statement(solo.statements)}")
    print(
        f"  a quiet pass (serve's tail after the burst: the last 4 s of it in the early "
        f"window): {solo.written / solo.quiet_cpu:,.0f} requests per CPU s "
        f"({solo.quiet_cpu:.2f} CPU s); by statement: {_by_statement(solo.quiet_statements)}"
    )
    for name, cost in c.items():
        print(
            f"  {name} SELECT: analysis (EXPLAIN QUERY TREE) {cost['analysis'] * 1e3:.0f} ms CPU; "
            f"one trace {cost['one'] * 1e3:.0f} ms CPU; marginal {cost['marginal'] * 1e6:.1f} us "
            f"CPU per request (batch of {cost['traces']:,})"
        )
    print(
        f"  single-call by id, marginal us CPU per request up to the end of each step (batch of "
        f"{MARGINAL_TRACES:,}, each step's rows read out to FORMAT Null): "
        + ", ".join(f"{name} {cost * 1e6:.1f}" for name, cost in solo.stages)
    )
    print(
        f"rollup builder: {solo.hours} hours of {requests // HOURS:,} requests in "
        f"{solo.rollup_cpu:.2f} CPU s: {solo.rollup_cpu / max(solo.hours, 1):.2f} CPU s per hour "
        f"built; {solo.rollup_cpu / on.cpu_s:.1%} of serve's CPU (on) for the same requests"
    )

    # While serve's CPU bounds it, on / off to done is at best off's CPU over on's: at least 0.9
    # leaves the attributor a ninth of what ingest costs.
    ingest_us = statistics.median(off.cpu_s for off, _, _, _, _ in pairs) / requests * 1e6
    budget_us = ingest_us / 9
    us = {
        name: cpu / requests * 1e6
        for name, cpu in (
            ("the attributor alone (median run)", statistics.median(cpus)),
            ("a quiet pass", solo.quiet_cpu),
            ("the grouped read", statistics.median(solo.grouped)),
            ("the bare read", statistics.median(solo.bare)),
        )
    }
    print(
        f"budget: serve with the attributor off, {ingest_us:.0f} us CPU per request (median); "
        f"on / off >= 0.9 while the CPU bounds serve leaves the attributor {budget_us:.1f} us a "
        "request; against it: "
        + ", ".join(f"{name} {u:.1f} us ({u / budget_us:.2f})" for name, u in us.items())
    )

    if history is not None:
        h = history
        print(
            f"\nwith stored history ({h.spans:,} spans in the {HISTORY_HOURS} h before the "
            f"requests), the attributor alone in passes of {HISTORY_BATCH:,} traces:"
        )
        print(f"  before the history was stored: {h.before:,.0f} requests per CPU s")
        rate, per_pass, cpu = h.small
        print(
            f"  before it, in {SMALL_PASSES} passes of one insert's traces ({per_pass:,.0f} a "
            f"pass): {rate:,.0f} requests per CPU s, {cpu * 1e3:.0f} ms CPU a pass"
        )
        print(
            f"  with it, default reach ({DEFAULT_REACH_S / 3600:g} h): {h.default_reach:,.0f} "
            f"({h.default_reach / h.before:.2f} of before); a day of reach: {h.day_reach:,.0f} "
            f"({h.day_reach / h.before:.2f} of before)"
        )

    if live is not None:
        print_live(live)

    if trickle is not None:
        t_off, t_on = trickle
        print(
            f"\nlow traffic: {PER_EXPORT} requests a second for {args.trickle_s:g} s "
            f"({t_on.requests:,} requests), serve's CPU over {t_on.wall_s:.0f} s:"
        )
        for t in trickle:
            print(f"  attributor {t.attributor:3s}: {t.cpu_s / t.wall_s:.3f} cores")
        print(
            f"  the attributor: {(t_on.cpu_s - t_off.cpu_s) / t_on.wall_s:.3f} cores, "
            f"{t_on.attributed:,.0f} of {t_on.requests:,} requests attributed"
        )


if __name__ == "__main__":
    main()
