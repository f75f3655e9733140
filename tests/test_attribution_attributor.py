"""The attributor: settled traces -> attribution rows, re-attribution on late spans, idempotence,
and end to end through a real ``latscope serve`` fed by the OTLP exporter."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from opentelemetry.trace import SpanKind, set_span_in_context

from latscope.attribution.attributor import Attributor, attributor_parts
from latscope.attribution.reference import Worker
from latscope.config import ConfigError, Settings
from latscope.storage import ATTRIBUTION_TABLE, SPANS_TABLE, Store, StoreError
from tests.attribution_support import (
    MS,
    T0,
    calls_run,
    server_spans,
    span_rows,
    stalls_call,
    store_traces,
)
from tests.clock_support import StoreClock
from tests.serve_support import Server, start_serve
from tests.skeleton_support import EXPECTED, LAYOUT, provider

FINAL_ROWS = """
SELECT TraceId, toUnixTimestamp64Nano(Timestamp), Model, E2eNs, NetworkNs, QueueNs, DecodeNs,
       OtherNs, HasClient, Version
FROM latscope_attribution FINAL WHERE TraceId = {t:String}
"""
ALL_ROWS = "SELECT count() FROM latscope_attribution WHERE TraceId = {t:String}"


@pytest.mark.slow
def test_late_client_span_replaces_the_row_and_reruns_are_idempotent(store: Store) -> None:
    trace_id = uuid.uuid4().hex
    att = Attributor(store, settle_s=0, poll_s=0.1)
    store.insert_arrow(SPANS_TABLE, span_rows(trace_id, server_spans()))
    att.run_until_idle()
    rows = store.query_rows(FINAL_ROWS, {"t": trace_id})
    assert len(rows) == 1
    _, start, _, e2e, network, queue, decode, other, has_client, version = rows[0]
    assert (start, e2e, network, has_client, version) == (T0 + 40 * MS, 920 * MS, None, False, 3)
    assert (queue, decode, other) == (100 * MS, 520 * MS, 300 * MS)

    # The client span arrives late and starts an hour earlier (a long-running stream), so the
    # row's start, hour and model (its key) move and the old row must be retracted.
    time.sleep(0.01)
    client = {"id": "c1" * 8, "kind": "Client", "start": T0 - 3_600_000 * MS + 40 * MS,
              "end": T0 + 1000 * MS, "attrs": {"gen_ai.request.model": "late-model"}}  # fmt: skip
    store.insert_arrow(SPANS_TABLE, span_rows(trace_id, [client]))
    att.run_until_idle()
    rows = store.query_rows(FINAL_ROWS, {"t": trace_id})
    assert len(rows) == 1, rows
    _, start, model, e2e, network, *_rest, has_client, version = rows[0]
    assert (start, model, has_client, version) == (client["start"], "late-model", True, 4)
    assert e2e == client["end"] - client["start"]
    assert network == e2e - 920 * MS

    # Re-running from scratch (a restarted attributor) writes the same row again: still one.
    before = store.query_rows(FINAL_ROWS, {"t": trace_id})
    fresh = Attributor(store, settle_s=0)
    fresh.watermark_us = 0  # from the start of time: skips to the first span, then catches up
    assert fresh.run_until_idle() >= 1
    assert store.query_rows(FINAL_ROWS, {"t": trace_id}) == before
    store.command("OPTIMIZE TABLE latscope_attribution FINAL")
    assert store.query_rows(FINAL_ROWS, {"t": trace_id}) == before


@pytest.fixture
def clock(store: Store) -> Iterator[StoreClock]:
    """A hand-moved clock for an attributor, after whatever the module stored before has been
    attributed (so the attributors below resume after it, and see only their test's spans)."""
    Attributor(store, settle_s=0).run_until_idle()
    clock = StoreClock(store)
    try:
        yield clock
    finally:
        clock.finish()


def _timed(att: Attributor, clock: StoreClock, pass_s: float) -> Attributor:
    """``att`` on ``clock``, its statements taking ``pass_s`` each."""
    att.clock, att._store_clock_us = clock.monotonic, clock.now_us
    attribute = att.attribute_slice

    def slow(*args: Any, **kwargs: Any) -> int:
        clock.advance(pass_s)
        return attribute(*args, **kwargs)

    att.attribute_slice = slow  # type: ignore[method-assign]
    return att


def _one_settled_one_fresh(
    store: Store, clock: StoreClock, settle_s: float, idle_poll_s: float
) -> tuple[Attributor, str]:
    """An attributor, a trace stored a settle window ago (settled) and one stored now (its pass
    takes 50 ms); returns the attributor and the fresh trace's id."""
    first, last = uuid.uuid4().hex, uuid.uuid4().hex
    att = _timed(Attributor(store, settle_s=settle_s, poll_s=idle_poll_s), clock, 0.05)
    clock.store(first, server_spans())
    clock.advance(settle_s + 0.05)
    clock.store(last, server_spans())
    return att, last


def test_after_a_busy_pass_the_next_waits_only_until_the_newest_span_settles(
    store: Store, clock: StoreClock
) -> None:
    """Under load a busy pass waits up to the settle window before the next, so slices grow; once
    traffic stops, the wait ends when the last span settles, not a whole window later."""
    settle_s, idle_poll_s = 3.0, 2.0
    att, last = _one_settled_one_fresh(store, clock, settle_s, idle_poll_s)
    clock.advance(1.9)  # ingest has not paused (a poll is 2 s)
    assert att.run_until_idle() == 1
    # A busy pass would wait at least the idle poll (2 s); `last` settles 1.05 s after the pass
    # (stored 1.9 s before it, which took 50 ms).
    assert att.poll_s == pytest.approx(settle_s - 1.95), att.poll_s
    assert store.query_rows(ALL_ROWS, {"t": last})[0][0] == 0
    clock.advance(att.poll_s)
    assert att.run_until_idle() == 1
    assert store.query_rows(ALL_ROWS, {"t": last})[0][0] == 1


def test_once_ingest_pauses_a_busy_pass_waits_one_poll_not_until_the_newest_settles(
    store: Store, clock: StoreClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under load the wait after a busy pass is long (here the whole settle window); once no span
    has come for a poll interval, the traces left are taken as they settle, a poll at a time."""
    monkeypatch.setattr("latscope.attribution.cadence.BUSY_PAUSE", 1000.0)
    settle_s, idle_poll_s = 4.0, 1.0
    att, last = _one_settled_one_fresh(store, clock, settle_s, idle_poll_s)
    clock.advance(idle_poll_s + 0.2)  # ingest paused; `last` settles in 2.8 s
    assert att.run_until_idle() == 1
    assert att.poll_s == idle_poll_s, att.poll_s
    assert store.query_rows(ALL_ROWS, {"t": last})[0][0] == 0


def test_during_a_long_wait_the_loop_passes_as_soon_as_ingest_pauses(
    store: Store, clock: StoreClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy pass under load waits long (here until the newest span settles); the loop still
    looks whether ingest has paused (at most a poll apart, and when the newest span will have
    gone a poll without a newer one, from the pass's end on), and once it has it passes then
    instead of when the wait ends."""
    from latscope.attribution.cadence import LOOK_LATE_S

    monkeypatch.setattr("latscope.attribution.cadence.BUSY_PAUSE", 1000.0)
    settle_s, idle_poll_s = 4.0, 1.0
    a, b, c = (uuid.uuid4().hex for _ in range(3))
    att = _timed(Attributor(store, settle_s=settle_s, poll_s=idle_poll_s), clock, 0.05)
    clock.store(a, server_spans())
    clock.advance(1.0)
    b_stored = clock.store(b, server_spans())  # settles a settle window later
    clock.advance(settle_s - 1.0 + 0.3)  # `a` has settled, `b` has not
    c_stored = clock.store(c, server_spans())  # ingest goes on, then stops
    att.poll()  # its first: writes `a`, then waits until `c` settles, ingest being busy
    rows = "SELECT count() FROM latscope_attribution WHERE TraceId IN {t:Array(String)}"
    assert store.query_rows(rows, {"t": [a]})[0][0] == 1
    # The wait ends when `c` settles, not a settle window after the pass (which took 50 ms).
    assert clock.monotonic() + att.poll_s == pytest.approx(c_stored + settle_s), att.poll_s
    # but looks whether ingest paused: when `c` will have gone a poll without a newer span
    looks_at = clock.monotonic() + att.next_wake_s()
    assert looks_at == pytest.approx(c_stored + idle_poll_s + LOOK_LATE_S), looks_at - c_stored
    watermark = att.watermark_us
    att.poll()  # spans came less than a poll ago: no pass (a pass moves the watermark)
    assert att.watermark_us == watermark
    # The next look comes when `c` will have gone a poll without a newer span, not a poll later.
    looks_at = clock.monotonic() + att.next_wake_s()
    assert looks_at == pytest.approx(c_stored + idle_poll_s + LOOK_LATE_S), looks_at - c_stored
    assert store.query_rows(rows, {"t": [b, c]})[0][0] == 0
    # `b` settled, the wait for `c` not over: ingest has paused, so the loop passes now.
    clock.advance(b_stored + settle_s + 0.3 - clock.monotonic())
    assert clock.monotonic() < c_stored + settle_s - idle_poll_s
    att.poll()
    assert store.query_rows(rows, {"t": [b]})[0][0] == 1
    assert store.query_rows(rows, {"t": [c]})[0][0] == 0  # still settling


def _spans_merges_stopped(store: Store) -> bool:
    """Whether the spans table's merges are stopped: the engine refuses OPTIMIZE (ABORTED) then,
    whatever its parts, and merges what it can otherwise."""
    try:
        store.command(f"OPTIMIZE TABLE {SPANS_TABLE}")
    except StoreError as exc:
        if "ABORTED" not in str(exc):
            raise
        return True
    return False


def _merges_by_batch(
    store: Store, clock: StoreClock, idle: list[float], **kwargs: Any
) -> tuple[Attributor, list[bool]]:
    """An attributor in serve's place (its writer says ingest has been idle ``idle[0]`` s), each
    of its batches noting whether the spans table's merges were stopped while it ran."""
    att = _timed(
        Attributor(store, settle_s=1.0, poll_s=0.5, ingest_idle_s=lambda: idle[0], **kwargs),
        clock,
        0.05,
    )
    seen: list[bool] = []
    attribute = att.attribute_slice

    def noting(*args: Any, **kw: Any) -> int:
        seen.append(_spans_merges_stopped(store))
        return attribute(*args, **kw)

    att.attribute_slice = noting  # type: ignore[method-assign]
    return att, seen


def test_a_pass_once_ingest_paused_holds_the_spans_merges_until_it_ends(
    store: Store, clock: StoreClock
) -> None:
    """In serve, a pass made once ingest has paused runs while the spans table's merges are
    stopped (after a burst they would take a core from it), and they merge again after it; a
    pass while ingest is busy leaves them be."""
    idle = [10.0]
    att, seen = _merges_by_batch(store, clock, idle)
    traces = [uuid.uuid4().hex for _ in range(2)]
    for trace_id in traces:  # two inserts: two parts
        clock.store(trace_id, server_spans())
    clock.advance(1.5)
    att.poll()
    assert seen == [True]
    assert not _spans_merges_stopped(store)
    rows = "SELECT count() FROM latscope_attribution WHERE TraceId IN {t:Array(String)}"
    assert store.query_rows(rows, {"t": traces})[0][0] == 2
    idle[0] = 0.0  # ingest busy
    busy = uuid.uuid4().hex
    clock.store(busy, server_spans())
    clock.advance(1.5)
    att.poll()
    assert seen == [True, False]
    assert store.query_rows(rows, {"t": [busy]})[0][0] == 1


def test_merges_start_again_before_the_next_batch_once_ingest_is_busy(
    store: Store, clock: StoreClock
) -> None:
    """A pass of two batches (one trace each) that ingest resumes during: the first batch runs
    with the spans table's merges stopped, the second with them merging, as the new inserts'
    parts need."""
    idle = [10.0]
    att, seen = _merges_by_batch(store, clock, idle, batch_traces=1)
    attribute = att.attribute_slice

    def resuming(*args: Any, **kw: Any) -> int:
        written = attribute(*args, **kw)
        idle[0] = 0.0  # an insert came during the first batch
        return written

    att.attribute_slice = resuming  # type: ignore[method-assign]
    for _ in range(2):
        clock.store(uuid.uuid4().hex, server_spans())
    clock.advance(1.5)
    att.poll()
    assert seen == [True, False]
    assert not _spans_merges_stopped(store)


def test_a_failed_start_of_the_merges_is_retried_on_the_next_poll(
    store: Store, clock: StoreClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store refuses the statement that starts the merges again after a quiet pass: they
    stay stopped until the next poll, which starts them before anything else."""
    idle = [10.0]
    att, seen = _merges_by_batch(store, clock, idle)
    command = store.command

    def refusing(sql: str, *args: Any, **kwargs: Any) -> Any:
        if sql.startswith("SYSTEM START MERGES"):
            raise StoreError("the store refused it")
        return command(sql, *args, **kwargs)

    monkeypatch.setattr(store, "command", refusing)
    clock.store(uuid.uuid4().hex, server_spans())
    clock.advance(1.5)
    try:
        att.poll()
        assert seen == [True]
        monkeypatch.setattr(store, "command", command)
        assert _spans_merges_stopped(store)
        idle[0] = 0.0  # ingest busy: the next poll, before the next pass is due, makes none
        clock.advance(0.1)
        watermark = att.watermark_us
        att.poll()
        assert att.watermark_us == watermark
        assert not _spans_merges_stopped(store)  # but it starts the merges
    finally:
        command(f"SYSTEM START MERGES {SPANS_TABLE}")  # for the module's next tests


def test_an_attributor_at_another_stall_threshold_counts_the_stalls_at_it(store: Store) -> None:
    """The attributor's stall threshold reaches its statements: these token gaps (5, 15, 280 and
    1 ms) are 2 stalls at 10 ms (1 at the default, 250 ms)."""
    Attributor(store, settle_s=0).run_until_idle()  # whatever the module stored before
    (trace_id,) = store_traces(store, {"stalls": stalls_call()})
    assert Attributor(store, settle_s=0, stall_threshold_ns=10 * MS).run_until_idle() == 1
    stalls = store.query_rows(
        f"SELECT Stalls FROM {ATTRIBUTION_TABLE} FINAL WHERE TraceId = {{t:String}}",
        {"t": trace_id},
    )
    assert stalls == [(2,)]


def test_unsettled_trace_waits_for_the_settle_window(store: Store) -> None:
    trace_id = uuid.uuid4().hex
    att = Attributor(store, settle_s=3600)
    store.insert_arrow(SPANS_TABLE, span_rows(trace_id, server_spans()))
    att.run_until_idle()
    assert store.query_rows(ALL_ROWS, {"t": trace_id})[0][0] == 0


@pytest.mark.slow
def test_batches_are_bounded_and_all_traces_get_done(store: Store) -> None:
    trace_ids = [uuid.uuid4().hex for _ in range(7)]
    for t in trace_ids:
        store.insert_arrow(SPANS_TABLE, span_rows(t, server_spans()))
    att = Attributor(store, settle_s=0, batch_traces=2)
    att.run_until_idle()
    for t in trace_ids:
        assert store.query_rows(ALL_ROWS, {"t": t})[0][0] == 1
    # A restarted attributor resumes between the last span it saw and where this one stopped.
    newest = store.query_rows(
        "SELECT toUnixTimestamp64Micro(max(LatscopeIngestedAt)) FROM otel_traces"
        " WHERE TraceId IN {t:Array(String)}",
        {"t": trace_ids},
    )[0][0]
    assert newest <= Attributor(store)._resume() <= att.watermark_us


def _cut_slice(store: Store, inserts: tuple[int, ...]) -> list[str]:
    """The traces of ``inserts`` (a count each), stored one insert each, once whatever the module
    stored before is attributed."""
    Attributor(store, settle_s=0).run_until_idle()
    ids = [[uuid.uuid4().hex for _ in range(n)] for n in inserts]
    for batch in ids:
        store.insert_arrow(
            SPANS_TABLE, pa.concat_tables([span_rows(t, server_spans()) for t in batch])
        )
        time.sleep(0.01)
    time.sleep(0.05)
    return [t for batch in ids for t in batch]


def _markers(store: Store, trace_ids: list[str]) -> dict[str, list[int]]:
    """Each trace's rows' SpansIngestedAt (us)."""
    out: dict[str, list[int]] = {t: [] for t in trace_ids}
    for t, at in store.query_rows(
        f"SELECT TraceId, toUnixTimestamp64Micro(SpansIngestedAt) FROM {ATTRIBUTION_TABLE} "
        "WHERE TraceId IN {t:Array(String)}",
        {"t": trace_ids},
    ):
        out[t].append(int(at))
    return out


def _marks_by_id(store: Store, trace_ids: list[str]) -> list[int]:
    """Each trace's one row's SpansIngestedAt (us), in trace id order."""
    markers = _markers(store, trace_ids)
    assert all(len(m) == 1 for m in markers.values()), markers
    return [markers[t][0] for t in sorted(trace_ids)]


def _runs(values: Iterable[Any]) -> list[int]:
    """The lengths of the runs of equal values: a slice's batches, from its traces' markers in
    trace id order."""
    return [len(list(g)) for _, g in itertools.groupby(values)]


def _before_first_span(store: Store, trace_ids: list[str]) -> int:
    """Just before the ingest time (us) of the first span of ``trace_ids``: a watermark whose
    next slice starts with them (as after idle time)."""
    first = store.query_rows(
        "SELECT toUnixTimestamp64Micro(min(LatscopeIngestedAt)) FROM otel_traces"
        " WHERE TraceId IN {t:Array(String)}",
        {"t": trace_ids},
    )[0][0]
    return int(first) - 1


def _serve_attributor(settings: Settings, store: Store) -> Attributor:
    """The attributor ``latscope serve`` makes from ``settings``."""
    (attributor,) = [
        c for c in attributor_parts(settings, store).components if c.name == "attributor"
    ]
    assert isinstance(attributor, Attributor)
    return attributor


def test_a_slice_is_planned_once_and_cut_by_trace_id(store: Store) -> None:
    """A slice of more traces than a batch holds is grouped once, and cut into batches of at
    most ``batch_traces`` traces by trace id (runs of the spans table's sort key, whatever
    insert they came in), each with its own SpansIngestedAt."""
    trace_ids = _cut_slice(store, (1, 3, 1, 2))
    att = Attributor(store, settle_s=0, batch_traces=2)
    plans: list[list] = []
    batches: list[int] = []
    query_rows, slice_ = store.query_rows, att.attribute_slice

    def spied(sql: str, *args: Any, **kwargs: Any) -> Any:
        out = query_rows(sql, *args, **kwargs)
        if sql == att._sql.plan:
            plans.append(out)
        return out

    def counted(*args: Any, **kwargs: Any) -> int:
        batches.append(slice_(*args, **kwargs))
        return batches[-1]

    store.query_rows = spied  # type: ignore[method-assign]
    att.attribute_slice = counted  # type: ignore[method-assign]
    try:
        assert att.run_until_idle() == 7
    finally:
        del store.query_rows
    # One plan found the slice's 7 traces; the others found an empty slice.
    assert [p[0][0] for p in plans if p[0][0]] == [7], plans
    assert batches == [2, 2, 2, 1]  # ceil(7 / 2) batches, as even as can be
    # Each batch is a run of trace ids, and its rows' mark is its own.
    by_id = _marks_by_id(store, trace_ids)
    assert _runs(by_id) == [2, 2, 2, 1], by_id
    assert by_id[-1] == att.watermark_us  # the last batch's rows mark the slice's end


def _spans_of(size: int) -> list[dict]:
    """A request of ``size`` spans: the server, its queue phase and ``size - 2`` decode slices."""
    s0 = T0 + 40 * MS
    server, queue, decode = server_spans()
    slices = [
        {
            **decode,
            "id": f"{i:016x}",
            "start": s0 + 340 * MS + i * MS,
            "end": s0 + 341 * MS + i * MS,
        }
        for i in range(size - 2)
    ]
    return [server, queue, *slices]


def test_a_slice_of_big_traces_is_cut_by_spans_too(store: Store) -> None:
    """With ``batch_spans``, a trace weighs max(spans * batch_traces, batch_spans), and the slice
    goes in the fewest batches of batch_spans * batch_traces, evenly by weight: big traces go
    in small batches, a batch holds at most ``batch_traces`` traces and fewer than
    ``batch_spans`` spans before its last trace."""
    Attributor(store, settle_s=0).run_until_idle()
    sizes = {uuid.uuid4().hex: size for size in (3, 9, 3, 3, 14, 3, 6, 3, 3, 11)}
    store.insert_arrow(
        SPANS_TABLE, pa.concat_tables([span_rows(t, _spans_of(n)) for t, n in sizes.items()])
    )
    time.sleep(0.05)
    att = Attributor(store, settle_s=0, batch_traces=4, batch_spans=12)
    assert att.run_until_idle() == len(sizes)
    by_id = sorted(sizes)
    got = _runs(_marks_by_id(store, by_id))
    # The same cut, recomputed.
    weights = [max(sizes[t] * 4, 12) for t in by_id]
    k = -(-sum(weights) // (12 * 4))
    share = -(-sum(weights) // k)
    shares = [sum(weights[:i]) // share for i in range(len(by_id))]
    assert got == _runs(shares), (got, shares)
    # More batches than the traces alone need (a share is skipped only when one trace weighs
    # more than a share: here only the 14-span one).
    assert len(got) >= k - 1 > -(-len(sizes) // 4), (got, k)
    at = 0
    for count in got:
        spans = [sizes[t] for t in by_id[at : at + count]]
        assert count <= 4 and sum(spans[:-1]) < 12, spans
        at += count


def test_a_slice_with_fewer_free_markers_than_batches_goes_in_as_many_as_it_has(
    store: Store,
) -> None:
    """Each batch of a slice needs its own SpansIngestedAt marker; with all but one of the
    slice's markers taken (rows of another attributor hold them), its 7 traces of batches of 2
    go in 2 batches, evenly, and every trace gets its row."""
    from latscope.attribution.attributor import MAX_CUTS

    trace_ids = _cut_slice(store, (3, 4))
    att = Attributor(store, settle_s=0, batch_traces=2)
    start = att.watermark_us = _before_first_span(store, trace_ids)
    att._taken = set(range(start + 2, start + MAX_CUTS))  # free: start + 1, and the slice's end
    assert att.run_until_idle() == len(trace_ids)
    by_id = _marks_by_id(store, trace_ids)
    assert _runs(by_id) == [4, 3], by_id
    assert by_id[0] == start + 1


def test_a_restart_inside_a_cut_slice_redoes_it(store: Store) -> None:
    """Stopped after some batches of a slice, a new attributor resumes before the slice: every
    trace gets its row, and the rows already written are written again, the same."""
    trace_ids = _cut_slice(store, (3, 4))
    first = Attributor(store, settle_s=0, batch_traces=2)
    # The slice starts just before its first span (as after idle time): the first batches'
    # marks are at the ingest time of the first insert.
    first.watermark_us = _before_first_span(store, trace_ids)
    # The slice's first two batches, one per call (after any empty slice before it).
    written: list[int] = []
    for _ in range(5):
        written.append(first.run_until_idle(max_batches=1))
        if len([w for w in written if w]) == 2:
            break
    assert [w for w in written if w] == [2, 2], written
    done = {t for t, m in _markers(store, trace_ids).items() if m}
    assert len(done) == 4  # batches of 2 and 2 (then 2 and 1)
    again = Attributor(store, settle_s=0, batch_traces=2)
    assert again.run_until_idle() >= len(trace_ids)
    markers = _markers(store, trace_ids)
    assert all(m for m in markers.values()), markers
    for t in trace_ids:
        assert store.query_rows(FINAL_ROWS, {"t": t})[0][-1] == len(server_spans())  # Version


def _rows_of(store: Store, table: str, prefix: str) -> list[tuple]:
    return sorted(
        store.query_rows(
            f"SELECT TraceId, RequestSpanId, E2eNs, NetworkNs, QueueNs, DecodeNs, OtherNs, Version "
            f"FROM {table} FINAL WHERE startsWith(TraceId, {{p:String}})",
            {"p": prefix},
        )
    )


def _agent_records(seeds: int) -> dict[str, list[Any]]:
    """The traces of ``seeds`` agent runs with parallel calls (several calls each, so the
    general statement runs), as span records by trace id."""
    from tests.agent_traces import agent_run
    from tests.upstream_traces import span_records

    records = {}
    for seed in range(seeds):
        records.update(span_records(agent_run(seed, parallel=True).built.resource_spans))
    return records


def check_n_attributors_write_the_rows_of_one(
    store: Store,
    make: Callable[[int, int], Attributor],
    clock: StoreClock | None = None,
    wait_s: float = 0.0,
) -> None:
    """--attributor-shard I/N: three attributors over one store write the same rows as one, with
    no request done twice (their row counts add up) and none missed. ``make(i, n)`` gives
    attributor ``i`` of ``n``, made before the spans are stored; they run ``wait_s`` after, on
    ``clock`` (the spans stamped with its time) when given."""
    from tests.attribution_support import spans_table

    records = _agent_records(6)
    prefixes = []
    for shards in (1, 3):
        prefix = uuid.uuid4().hex[:6]
        prefixes.append(prefix)
        attributors = [make(i, shards) for i in range(shards)]
        table = spans_table({prefix + t[6:]: spans for t, spans in records.items()})
        if clock is None:
            store.insert_arrow(SPANS_TABLE, table)
        else:
            store.insert_arrow(SPANS_TABLE, clock.stamp(table))
            clock.advance(wait_s)
        written = [a.run_until_idle() for a in attributors]
        rows = _rows_of(store, ATTRIBUTION_TABLE, prefix)
        assert sum(written) >= len(rows) > 0
    one, three = (_rows_of(store, ATTRIBUTION_TABLE, p) for p in prefixes)
    assert [r[1:] for r in one] == [r[1:] for r in three]
    assert [r[0][6:] for r in one] == [r[0][6:] for r in three]


@pytest.mark.slow
def test_a_batch_after_a_restart_never_counts_rows_written_before_as_its_own(
    store: Store,
) -> None:
    """A restart resumes MAX_CUTS us before the newest SpansIngestedAt, and the first slice's
    batches are marked just after that: rows that another attributor, or an earlier run, wrote
    with those markers (within the batches' time bounds) must not count as the batch's own,
    which would skip the general statement and leave the batch's traces without rows."""
    from latscope.attribution.attributor import MAX_CUTS
    from latscope.attribution.engine import attribute_requests
    from latscope.attribution.spans import load_trace
    from tests.attribution_support import spans_table

    Attributor(store, settle_s=0).run_until_idle()  # whatever the module stored before
    prefix = uuid.uuid4().hex[:6]
    records = {prefix + t[6:]: spans for t, spans in _agent_records(3).items()}
    first = min(s.start_ns for spans in records.values() for s in spans)
    # Rows marked just after where the restart resumes (MAX_CUTS before the newest marker, set
    # to now): two traces (not these) under each of the markers the first batches would take.
    newest = int(store.query_rows("SELECT toUnixTimestamp64Micro(now64(6))")[0][0])
    resume = newest - MAX_CUTS
    others = [(newest, uuid.uuid4().hex)] + [
        (resume + j, uuid.uuid4().hex) for j in range(1, 6) for _ in range(2)
    ]
    for marker, trace_id in others:
        store.command(
            f"INSERT INTO {ATTRIBUTION_TABLE} (Timestamp, TraceId, RequestSpanId, ServiceName, "
            "Model, Version, IsDeleted, SpansIngestedAt) VALUES (fromUnixTimestamp64Nano("
            "{ts:Int64}), {t:String}, 'ffffffffffffffff', 'other', '', 1, 0, "
            "fromUnixTimestamp64Micro({m:Int64}))",
            {"ts": first, "t": trace_id, "m": marker},
        )
    time.sleep(0.01)
    store.insert_arrow(SPANS_TABLE, spans_table(records))
    att = Attributor(store, settle_s=0, batch_traces=2)
    att.run_until_idle()
    assert att.watermark_us is not None and att.watermark_us > newest
    want = {t: len(attribute_requests(t, load_trace(store, t))) for t in records}
    assert sum(want.values()) > len(records)  # agent traces: several calls, the general path
    got = {t: len(store.query_rows(FINAL_ROWS, {"t": t})) for t in records}
    assert got == want
    taken = {m for m, _ in others}
    assert not taken & {m for ms in _markers(store, list(records)).values() for m in ms}


def test_n_attributors_split_a_store_and_write_exactly_the_rows_of_one(store: Store) -> None:
    check_n_attributors_write_the_rows_of_one(
        store, lambda i, n: Attributor(store, settle_s=0, shard=(i, n), step_s=3600)
    )


@pytest.mark.slow
def test_n_attributors_in_batches_cut_by_trace_id_write_the_rows_of_one(store: Store) -> None:
    """The same with batches of 2 traces: one attributor cuts the slice by trace id into 3
    batches (agent traces, so the general statement runs too), the three shards each their own."""
    check_n_attributors_write_the_rows_of_one(
        store,
        lambda i, n: Attributor(store, settle_s=0, shard=(i, n), step_s=3600, batch_traces=2),
    )


def test_local_tables_of_a_cluster_node(store: Store) -> None:
    """--attributor-tables local: the *_local tables of a cluster node, read and written."""
    for table in (SPANS_TABLE, ATTRIBUTION_TABLE):
        store.command(f"CREATE TABLE IF NOT EXISTS {table}_local AS {table}")
    trace_id = uuid.uuid4().hex
    store.insert_arrow(SPANS_TABLE + "_local", span_rows(trace_id, server_spans()))
    written = Attributor(store, settle_s=0, tables="local", step_s=3600).run_until_idle()
    assert written >= 1
    local = store.query_rows(
        f"SELECT count() FROM {ATTRIBUTION_TABLE}_local WHERE TraceId = {{t:String}}",
        {"t": trace_id},
    )[0][0]
    assert local == 1
    assert store.query_rows(ALL_ROWS, {"t": trace_id})[0][0] == 0


def test_a_catch_up_pass_writes_a_compact_part(store: Store) -> None:
    """A pass's insert of ~13 MB (40,000 rows) is one compact part, not ~146 files of a wide one
    (008_attribution_compact_parts.sql): over ClickHouse's 10 MiB default, under the table's."""
    service = f"compact-{uuid.uuid4().hex[:8]}"
    store.command(
        f"INSERT INTO {ATTRIBUTION_TABLE} (Timestamp, TraceId, ServiceName, ResourceAttributes, "
        "E2eNs, OtherNs, SpansIngestedAt, Version) "
        "SELECT now64(9), hex(number), {s:String}, map('k8s.pod.name', repeat('x', 300)), "
        "1, 1, now64(6), 1 FROM numbers(40000)",
        {"s": service},
    )
    parts = store.query_rows(
        f"SELECT part_type, data_uncompressed_bytes FROM system.parts WHERE active "
        f"AND table = '{ATTRIBUTION_TABLE}' AND database = currentDatabase() AND name IN "
        f"(SELECT DISTINCT _part FROM {ATTRIBUTION_TABLE} WHERE ServiceName = {{s:String}})",
        {"s": service},
    )
    assert [kind for kind, _ in parts] == ["Compact"], parts
    assert parts[0][1] > 10 * 2**20  # a wide part under ClickHouse's default


# -- end to end through latscope serve ---------------------------------------------------------


def _metric(server: Server, name: str) -> float:
    text = httpx.get(server.url("/metrics"), timeout=10).text
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _wait_metric(server: Server, name: str, at_least: float, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _metric(server, name) >= at_least:
            return
        time.sleep(0.1)
    raise AssertionError(f"{name} never reached {at_least}:\n{server.text()}")


_READ_ROWS = r"""
import json, sys
from latscope.storage import Store
store = Store.open(sys.argv[1])
rows = store.query_rows(
    "SELECT TraceId, HasClient, E2eNs, NetworkNs, QueueNs, PreprocessNs, PrefillNs, DecodeNs,"
    " PostprocessNs, OtherNs, Model, ClockSkewNs FROM latscope_attribution FINAL ORDER BY TraceId")
print(json.dumps([list(r) for r in rows]))
"""


def _read_rows(store_dir: Path) -> list[list]:
    # The stopped server's store, read from a fresh process (chDB: one store per process).
    out = subprocess.run(
        [sys.executable, "-c", _READ_ROWS, f"chdb://{store_dir}"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def send_trace(endpoint: str, *, skew_ns: int = 0) -> tuple[str, Callable[[], None]]:
    """Server and phase spans of LAYOUT go out now; the client span when the callable is called."""
    client_tp = provider(endpoint, "chat-frontend")
    server_tp = provider(endpoint, "llm-server")
    c_span = client_tp.get_tracer("t.client").start_span(
        "POST /v1/chat/completions", kind=SpanKind.CLIENT, start_time=T0 + LAYOUT["client"][0] * MS
    )
    stracer = server_tp.get_tracer("t.server")
    ss, se = LAYOUT["server"]
    s_span = stracer.start_span(
        "chat",
        context=set_span_in_context(c_span),
        kind=SpanKind.SERVER,
        start_time=T0 + ss * MS + skew_ns,
        attributes={"gen_ai.request.model": "llama-3-8b"},
    )
    for phase, (ps, pe) in LAYOUT.items():
        if phase not in ("client", "server"):
            p = stracer.start_span(
                phase,
                context=set_span_in_context(s_span),
                start_time=T0 + ps * MS + skew_ns,
                attributes={"latscope.phase": phase},
            )
            p.end(end_time=T0 + pe * MS + skew_ns)
    s_span.end(end_time=T0 + se * MS + skew_ns)
    server_tp.force_flush()
    server_tp.shutdown()

    def send_client() -> None:
        c_span.end(end_time=T0 + LAYOUT["client"][1] * MS)
        client_tp.force_flush()
        client_tp.shutdown()

    return format(s_span.get_span_context().trace_id, "032x"), send_client


@pytest.mark.slow
@pytest.mark.subprocess
def test_serve_attributes_and_reattributes_after_a_late_client_span(tmp_path: Path) -> None:
    server = start_serve(
        tmp_path / "store", "--attribution-settle-s", "0.3", "--attribution-poll-s", "0.1"
    )
    try:
        full, send_client = send_trace(server.grpc, skew_ns=2_000 * MS)
        send_client()
        late, send_late_client = send_trace(server.grpc)
        _wait_metric(server, "latscope_attributed_requests_total", 2)
        send_late_client()  # the client span, after the server's spans were attributed
        _wait_metric(server, "latscope_attributed_requests_total", 3)
    finally:
        assert server.stop() == 0, server.text()
    listed = _read_rows(tmp_path / "store")
    assert len(listed) == 2, listed  # one row per request after FINAL: no stale duplicate
    rows = {r[0]: r for r in listed}
    assert set(rows) == {full, late}
    buckets = ["network", "queue", "preprocess", "prefill", "decode", "postprocess", "other"]
    for trace_id in (full, late):
        _, has_client, e2e, *values, model, _skew = rows[trace_id]
        assert has_client and e2e == pytest.approx(1000 * MS, abs=MS)
        got = {b: v / MS for b, v in zip(buckets, values, strict=True)}
        assert got == pytest.approx({b: float(v) for b, v in EXPECTED.items()}, abs=1.0)
        assert sum(values) == e2e
        assert model == "llama-3-8b"
    assert rows[full][-1] == pytest.approx(2_000 * MS, abs=MS)


@pytest.mark.slow
def test_the_general_statement_runs_only_for_traces_the_single_call_path_leaves(
    store: Store,
) -> None:
    """A pass of single-call traces and traces without a call runs the cheap statement alone; a
    trace the single-call path leaves (an app SERVER span above the call) brings the general
    statement in, for it only, and every request still gets its row. A pass whose every trace
    got a row from the cheap statement does not look for traces left at all."""
    att = Attributor(store, settle_s=0, poll_s=0.1)
    ran: list[str] = []
    command, query_rows = store.command, store.query_rows

    def spy(call: Any) -> Any:
        def spied(sql: str, *args: object, **kwargs: object) -> object:
            names = {
                att._sql.insert: "general",
                att._sql.insert_simple: "single-call",
                att._sql.count_left: "count left",
            }
            ran.append(names.get(sql, "other"))
            return call(sql, *args, **kwargs)

        return spied

    store.command, store.query_rows = spy(command), spy(query_rows)  # type: ignore[method-assign]
    try:
        single, plain, app, alone = (uuid.uuid4().hex for _ in range(4))
        store.insert_arrow(SPANS_TABLE, span_rows(single, server_spans()))
        no_call = [
            {"id": "d1" * 8, "kind": "Client", "start": T0, "end": T0 + 5 * MS},
            {"id": "d2" * 8, "parent": "d1" * 8, "kind": "Internal", "start": T0,
             "end": T0 + MS},
        ]  # fmt: skip
        store.insert_arrow(SPANS_TABLE, span_rows(plain, no_call))
        assert att.run_until_idle() == 1
        assert ran.count("single-call") == 1 and ran.count("count left") == 1, ran
        assert "general" not in ran, ran

        ran.clear()
        above = {"id": "c1" * 8, "kind": "Server", "start": T0, "end": T0 + 1000 * MS}
        store.insert_arrow(SPANS_TABLE, span_rows(app, [above, *server_spans()]))
        time.sleep(0.01)
        assert att.run_until_idle() == 1
        assert ran.count("single-call") == 1 and ran.count("general") == 1, ran

        ran.clear()
        store.insert_arrow(SPANS_TABLE, span_rows(alone, server_spans()))
        time.sleep(0.01)
        assert att.run_until_idle() == 1
        assert ran.count("single-call") == 1, ran
        assert "count left" not in ran and "general" not in ran, ran
    finally:
        del store.command, store.query_rows
    rows = store.query_rows(
        "SELECT TraceId, E2eNs FROM latscope_attribution FINAL WHERE TraceId IN {t:Array(String)}",
        {"t": [single, plain, app, alone]},
    )
    # The app's SERVER span around the call is in the model's service: the model service's
    # outermost SERVER span is the call's server side (the framework around the engine).
    assert sorted(rows) == sorted([(single, 920 * MS), (app, 1000 * MS), (alone, 920 * MS)])


# The reach tests come last: their late spans, 3 hours from the rest of their traces, would
# widen the reach of a later test's first pass.
_HOUR_MS = 3_600_000


def _attributed_versions(store: Store, trace_id: str) -> list[tuple[bool, int]]:
    return [(r[8], r[9]) for r in store.query_rows(FINAL_ROWS, {"t": trace_id})]


@pytest.mark.slow
def test_a_late_span_reaches_the_spans_inside_it_however_long_it_lasts(store: Store) -> None:
    """The spans a pass reads reach from its slice's first span start to its last span end (and
    the reach beyond): a late client span of a 3-hour stream finds the server spans at its end,
    3 hours after its start, with the default reach of 2 hours."""
    trace_id = uuid.uuid4().hex
    att = Attributor(store, settle_s=0)
    store.insert_arrow(SPANS_TABLE, span_rows(trace_id, server_spans()))
    att.run_until_idle()
    assert _attributed_versions(store, trace_id) == [(False, 3)]
    client = {"id": "c1" * 8, "kind": "Client", "start": T0 - 3 * _HOUR_MS * MS,
              "end": T0 + 1000 * MS}  # fmt: skip
    store.insert_arrow(SPANS_TABLE, span_rows(trace_id, [client]))
    att.run_until_idle()
    assert _attributed_versions(store, trace_id) == [(True, 4)]


@pytest.mark.slow
@pytest.mark.parametrize(("reach_h", "version"), [(4, 4), (2, 3)])
def test_spans_beyond_the_reach_are_not_read(store: Store, reach_h: int, version: int) -> None:
    """A late span, alone in its slice, that starts 3 hours after the trace's other spans ended:
    with a reach of 4 hours its pass reads them all and attributes the trace again (Version 4);
    with 2 hours it reads the late span alone, which holds no request, and the trace's row stays
    as it was."""
    trace_id = uuid.uuid4().hex
    att = Attributor(store, settle_s=0, reach_s=reach_h * 3600)
    store.insert_arrow(SPANS_TABLE, span_rows(trace_id, server_spans()))
    att.run_until_idle()
    late = {"id": "d1" * 8, "kind": "Internal", "start": T0 + 3 * _HOUR_MS * MS + 2000 * MS,
            "end": T0 + 3 * _HOUR_MS * MS + 3000 * MS}  # fmt: skip
    store.insert_arrow(SPANS_TABLE, span_rows(trace_id, [late]))
    att.run_until_idle()
    assert _attributed_versions(store, trace_id) == [(False, version)]


def test_the_reach_is_a_setting_and_must_be_positive(store: Store) -> None:
    with pytest.raises(ValueError, match="reach_s"):
        Attributor(store, reach_s=0)
    with pytest.raises(ConfigError, match="--attribution-reach-s"):
        Settings.from_env({"LATSCOPE_ATTRIBUTION_REACH_S": "-1"}).validate()
    settings = Settings.from_env({"LATSCOPE_ATTRIBUTION_REACH_S": "14400"})
    settings.validate()
    assert _serve_attributor(settings, store).reach_ns == 4 * _HOUR_MS * MS
    assert Attributor(store).reach_ns == 2 * _HOUR_MS * MS


def test_batch_bounds_are_settings_and_must_be_positive(store: Store) -> None:
    with pytest.raises(ValueError, match="batches need"):
        Attributor(store, batch_spans=0)
    with pytest.raises(ValueError, match="batches need"):
        Attributor(store, batch_traces=10**8)
    with pytest.raises(ConfigError, match="--attribution-batch-spans"):
        Settings.from_env({"LATSCOPE_ATTRIBUTION_BATCH_SPANS": "0"}).validate()
    settings = Settings.from_env(
        {"LATSCOPE_ATTRIBUTION_BATCH_SPANS": "5000", "LATSCOPE_ATTRIBUTION_BATCH_TRACES": "700"}
    )
    settings.validate()
    attributor = _serve_attributor(settings, store)
    assert (attributor.batch_spans, attributor.batch_traces) == (5000, 700)


@pytest.mark.parametrize("worker", [False, True], ids=["in-thread", "worker"])
@pytest.mark.parametrize("early", [False, True], ids=["settled", "early"])
def test_a_trace_with_many_spans_goes_to_the_reference_engine_without_the_sql(
    store: Store,
    clock: StoreClock,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    early: bool,
    worker: bool,
) -> None:
    """A trace with at least ``reference_spans`` spans is left out of its batch's general path
    (whose memory grows with the square of a trace's spans) and attributed by the reference
    engine, with the batch's marker; the traces beside it by the SQL (a two-call trace by the
    general path). Early attribution takes it early as it takes the others. The reference
    engine in the attributor's thread, or in its own process as serve runs it."""
    before, after, two, wide = (uuid.uuid4().hex for _ in range(4))
    reference = Worker() if worker else None
    att = Attributor(
        store,
        settle_s=2,
        poll_s=0.1,
        reference_spans=30,
        complete_s=1 if early else None,
        reference=reference,
    )
    if reference is not None:
        request.addfinalizer(reference.close)
    att.clock, att._store_clock_us = clock.monotonic, clock.now_us
    att.run_until_idle()  # the watermark to now
    general: list[tuple[str, str, list[str]]] = []  # each general statement's ids, and skip
    routed: list[tuple[str, str]] = []
    command, by_reference = store.command, att._by_reference

    def recorded_command(sql: str, params: dict[str, Any] | None = None) -> Any:
        inserts = {st.insert for st in (att._sql, att._retry_sql, *att._early_sql.values())}
        if sql in inserts and params is not None:  # the general path's
            general.append((params["id_lo"], params["id_hi"], params["skip_ids"]))
        return command(sql, params)

    def recorded_reference(trace_id: str, *args: Any, **kwargs: Any) -> int:
        routed.append((trace_id, args[2]))
        return by_reference(trace_id, *args, **kwargs)

    monkeypatch.setattr(store, "command", recorded_command)
    monkeypatch.setattr(att, "_by_reference", recorded_reference)
    # Complete trees (a root, every parent stored), so early attribution may take them.
    one = [{**s, "parent": ""} if s["kind"] == "Server" else s for s in server_spans()]
    for trace_id, spans in (
        (before, one),
        (two, calls_run(2)),
        (wide, calls_run(12)),
        (after, one),
    ):
        clock.store(trace_id, spans)
    clock.advance(1.5 if early else 2.5)  # complete / settled
    assert att.run_until_idle() >= 16  # (the store is shared: a trace of another test may come)
    assert routed == [(wide, "37 spans, at least --attribution-reference-spans")]
    # The general statement (for the two-call trace) left the wide trace out; any other there
    # was took another test's traces (the store is shared).
    assert [wide] in [skip for _, _, skip in general], general
    rows = store.query_rows(FINAL_ROWS, {"t": wide})
    assert len(rows) == 12
    for _, _, _, e2e, network, queue, decode, other, has_client, version in rows:
        assert (e2e, network, queue, decode, other) == (
            920 * MS,
            None,
            100 * MS,
            520 * MS,
            300 * MS,
        )
        assert (has_client, version) == (False, 37)
    for trace_id, calls in ((before, 1), (after, 1), (two, 2)):
        assert len(store.query_rows(FINAL_ROWS, {"t": trace_id})) == calls
    clock.advance(2.5)  # settled: unchanged, so not attributed again
    att.run_until_idle()
    assert len(routed) == 1
    assert reference is None or reference.running


def test_a_wide_trace_past_the_span_cap_stays_set_aside_through_its_retries(
    store: Store, clock: StoreClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wide trace of more than ``max_trace_spans`` spans is set aside saying why, and a retry
    that comes to the same answer keeps it set aside (attempts counted), without the SQL's
    general path."""
    wide = uuid.uuid4().hex
    att = Attributor(store, settle_s=2, poll_s=0.1, reference_spans=30, max_trace_spans=35)
    att.clock, att._store_clock_us = clock.monotonic, clock.now_us
    att.run_until_idle()
    general = []  # the general statements of the retries: none, their one trace being wide
    command = store.command

    def recorded_command(sql: str, params: dict[str, Any] | None = None) -> Any:
        if sql == att._retry_sql.insert and params is not None:
            general.append(params["retry_ids"])
        return command(sql, params)

    monkeypatch.setattr(store, "command", recorded_command)
    clock.store(wide, calls_run(12))
    clock.advance(2.5)
    att.run_until_idle()
    (aside,) = att.set_aside.values()
    assert aside.trace_id == wide and aside.attempts == 1
    assert aside.error.startswith("37 spans, more than the reference engine takes (--max-trace-")
    for attempts in (2, 3):
        att.set_aside[wide] = aside._replace(retry_at=0.0)  # due now
        clock.advance(1)
        att.run_until_idle()
        (aside,) = att.set_aside.values()
        assert aside.attempts == attempts, aside
    assert store.query_rows(ALL_ROWS, {"t": wide})[0][0] == 0
    assert general == []
