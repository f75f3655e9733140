"""Early attribution (``complete_s``): a trace whose span tree is complete is attributed once it
has gone ``complete_s`` without new spans, before the settle window ends, and only once: when it
settles nothing is written for it again unless it changed since (a late span, or a span whose
insert was still in flight when the early pass read).

With it off, a pass that finds ingest paused (no span for ``poll_s``) does the same up to the
newest span (``early_when_quiet``, on by default): every rule here holds for both ("mode")."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from latscope.attribution import cadence
from latscope.attribution.attributor import QUIET_EARLY_SPANS, WRITER_LOOK_S, Attributor
from latscope.attribution.cadence import LOOK_LATE_S, MIN_POLL_S, QUICK_PAUSE_S
from latscope.collector.service import Collector
from latscope.config import ConfigError, Settings
from latscope.serve import ingest_parts
from latscope.storage import ATTRIBUTION_TABLE, SPANS_TABLE, Store
from tests.attribution_support import MS, T0, server_spans, span_rows
from tests.clock_support import StoreClock
from tests.serve_support import start_serve
from tests.skeleton_support import EXPECTED
from tests.test_attribution_attributor import (
    _read_rows,
    _wait_metric,
    check_n_attributors_write_the_rows_of_one,
    send_trace,
)

SETTLE_S, COMPLETE_S = 3.0, 0.3
#: The client span of ``server_spans()``: with it the trace's tree is complete.
CLIENT = {"id": "c1" * 8, "kind": "Client", "start": T0, "end": T0 + 1000 * MS}
#: A phase span of the server that ``server_spans()`` lacks.
PREFILL = {"id": "b3" * 8, "parent": "a1" * 8, "kind": "Internal", "start": T0 + 150 * MS,
           "end": T0 + 370 * MS, "attrs": {"latscope.phase": "prefill"}}  # fmt: skip
ROWS = (
    f"SELECT count(), max(Version) FROM {ATTRIBUTION_TABLE} "
    "WHERE TraceId = {t:String} AND IsDeleted = 0"
)


@pytest.fixture(autouse=True)
def _no_merges(store: Store) -> Iterator[None]:
    """The tests count every row written for a trace; a background merge of the attribution
    table (a ReplacingMergeTree) would collapse a trace's rows of one key into its newest."""
    store.command(f"SYSTEM STOP MERGES {ATTRIBUTION_TABLE}")
    try:
        yield
    finally:
        store.command(f"SYSTEM START MERGES {ATTRIBUTION_TABLE}")


def _rows(store: Store, trace_id: str) -> tuple[int, int]:
    """How many rows the trace has (every one written, not only the newest), and the highest
    Version."""
    count, version = store.query_rows(ROWS, {"t": trace_id})[0]
    return int(count), int(version)


@pytest.fixture
def clock(store: Store) -> Iterator[StoreClock]:
    """The clock the attributors below and their spans' ingest times follow, moved by hand."""
    clock = StoreClock(store)
    try:
        yield clock
    finally:
        clock.finish()


@pytest.fixture(params=["complete", "quiet"])
def mode(request: pytest.FixtureRequest) -> str:
    """Early attribution on (``complete_s``), or off with a pass that finds ingest paused taking
    the complete traces early all the same (``poll_s`` = COMPLETE_S without a span)."""
    return request.param


def _attributor(store: Store, clock: StoreClock, mode: str, **kwargs) -> Attributor:
    """An early-attributing attributor on ``clock`` that starts now (the shared store holds
    other tests' spans, and rows whose watermark it would otherwise resume from)."""
    if mode == "complete":
        kwargs.update(complete_s=COMPLETE_S, poll_s=0.1, early_when_quiet=False)
    else:
        kwargs.update(poll_s=COMPLETE_S)
    att = Attributor(
        store, settle_s=SETTLE_S, clock=clock.monotonic, store_clock_us=clock.now_us, **kwargs
    )
    att.watermark_us = clock.now_us() - att.settle_us
    return att


def _attributed_early(store: Store, clock: StoreClock, att: Attributor) -> tuple[str, float]:
    """A complete trace stored and attributed early by ``att``; its id, and when it was stored
    (on ``clock``)."""
    trace_id = uuid.uuid4().hex
    stored = clock.store(trace_id, [CLIENT, *server_spans()])
    clock.advance(COMPLETE_S + 0.2)
    att.run_until_idle()
    assert _rows(store, trace_id) == (1, 4)
    return trace_id, stored


def _advance_to(clock: StoreClock, at: float) -> None:
    clock.advance(at - clock.monotonic())


def _early_then_settled(
    store: Store,
    clock: StoreClock,
    att: Attributor,
    trace_id: str,
    since: float,
    *,
    early: tuple,
    settled: tuple,
) -> None:
    """A pass just before the trace's newest spans are ``complete_s`` old, one just after, then
    one once spans stored at ``since`` (on ``clock``) have settled: the trace's rows after the
    first (none new) and the others (``_rows``)."""
    before = _rows(store, trace_id)
    clock.advance(COMPLETE_S - 0.01)
    att.run_until_idle()
    assert _rows(store, trace_id) == before  # neither complete_s nor a poll without spans
    clock.advance(0.21)
    att.run_until_idle()
    assert _rows(store, trace_id) == early
    _advance_to(clock, since + SETTLE_S + 0.2)
    att.run_until_idle()
    assert _rows(store, trace_id) == settled


@pytest.mark.slow
def test_a_complete_trace_is_attributed_before_it_settles_and_only_once(
    store: Store, clock: StoreClock, mode: str
) -> None:
    att = _attributor(store, clock, mode)
    complete, incomplete = uuid.uuid4().hex, uuid.uuid4().hex
    clock.store(complete, [CLIENT, *server_spans()])
    # The server's spans alone: their parent, the client span, is not stored (yet).
    stored = clock.store(incomplete, server_spans())
    clock.advance(COMPLETE_S - 0.01)
    att.run_until_idle()
    assert _rows(store, complete) == (0, 0)  # its spans came less than complete_s ago
    clock.advance(0.21)
    att.run_until_idle()
    assert _rows(store, complete) == (1, 4)
    assert _rows(store, incomplete) == (0, 0)
    _advance_to(clock, stored + SETTLE_S + 0.2)
    att.run_until_idle()  # the incomplete trace has settled
    assert _rows(store, incomplete) == (1, 3)
    assert _rows(store, complete) == (1, 4)  # not written a second time


@pytest.mark.slow
def test_a_client_span_without_a_child_waits_for_the_settle_window(
    store: Store, clock: StoreClock, mode: str
) -> None:
    """An agent's LLM call with its server's spans, and a tool call whose server has not reported
    (its spans may be on their way): the trace waits to settle."""
    att = _attributor(store, clock, mode)
    trace_id = uuid.uuid4().hex
    agent = {"id": "d1" * 8, "kind": "Internal", "start": T0 - 100 * MS, "end": T0 + 2000 * MS}
    llm_call = {**CLIENT, "parent": agent["id"]}
    tool_call = {"id": "e1" * 8, "parent": agent["id"], "kind": "Client",
                 "start": T0 + 1100 * MS, "end": T0 + 1900 * MS}  # fmt: skip
    spans = [agent, llm_call, *server_spans(), tool_call]
    stored = clock.store(trace_id, spans)
    _early_then_settled(store, clock, att, trace_id, stored, early=(0, 0), settled=(1, len(spans)))


@pytest.mark.slow
def test_a_late_span_attributes_the_trace_again(store: Store, clock: StoreClock, mode: str) -> None:
    att = _attributor(store, clock, mode)
    trace_id, _ = _attributed_early(store, clock, att)
    late = clock.store(trace_id, [PREFILL])
    # Early again, with the late span; nothing more once it settles.
    _early_then_settled(store, clock, att, trace_id, late, early=(2, 5), settled=(2, 5))


@pytest.mark.slow
def test_a_span_stored_into_a_window_already_passed_is_attributed_once_settled(
    store: Store, clock: StoreClock, mode: str
) -> None:
    """An insert still in flight when the early pass read: its span carries an ingest time inside
    the window that pass took. Early windows do not look back; settling does, and the trace's
    count of spans (5) differs from its row's Version (4), so it is attributed again."""
    att = _attributor(store, clock, mode)
    trace_id, stored = _attributed_early(store, clock, att)
    ingested_us = store.query_rows(
        f"SELECT toUnixTimestamp64Micro(max(LatscopeIngestedAt)) FROM {SPANS_TABLE} "
        "WHERE TraceId = {t:String}",
        {"t": trace_id},
    )[0][0]
    in_flight = span_rows(trace_id, [PREFILL])
    in_flight = in_flight.append_column(
        "LatscopeIngestedAt", pa.array([ingested_us], pa.timestamp("us"))
    )
    store.insert_arrow(SPANS_TABLE, in_flight)
    _early_then_settled(store, clock, att, trace_id, stored, early=(1, 4), settled=(2, 5))


@pytest.mark.slow
def test_an_attributor_resumed_inside_its_settle_window_takes_the_early_window(
    store: Store, clock: StoreClock, mode: str
) -> None:
    """A run with no settle window wrote rows just now; an attributor that resumes from them has
    its watermark past its own settle bound, so it has no settled slice to take the early window
    beside: it takes it alone, and the trace is not written again when it settles."""
    first = uuid.uuid4().hex
    clock.store(first, [CLIENT, *server_spans()])
    clock.advance(0.01)
    before = Attributor(store, settle_s=0, clock=clock.monotonic, store_clock_us=clock.now_us)
    before.watermark_us = clock.now_us() - 20_000
    assert before.run_until_idle() >= 1
    assert _rows(store, first) == (1, 4)
    att = _attributor(store, clock, mode)
    att.watermark_us = None  # resumes from the rows: past its settle bound
    trace_id = uuid.uuid4().hex
    stored = clock.store(trace_id, [CLIENT, *server_spans()])
    clock.advance(COMPLETE_S + 0.2)
    att.run_until_idle()
    assert att.watermark_us is not None and att.watermark_us > clock.now_us() - att.settle_us
    assert _rows(store, trace_id) == (1, 4)
    _advance_to(clock, stored + SETTLE_S + 0.2)
    att.run_until_idle()
    assert _rows(store, trace_id) == (1, 4)
    assert _rows(store, first) == (1, 4)


@pytest.mark.slow
def test_n_early_attributors_split_a_store_and_write_exactly_the_rows_of_one(
    store: Store, clock: StoreClock, mode: str
) -> None:
    check_n_attributors_write_the_rows_of_one(
        store,
        lambda i, n: _attributor(store, clock, mode, shard=(i, n), step_s=3600),
        clock=clock,
        wait_s=COMPLETE_S + 0.2,
    )


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("early", [("--attribution-complete-s", "0.3"), ()], ids=["on", "quiet"])
def test_serve_attributes_a_complete_trace_before_the_settle_window(
    tmp_path: Path, early: tuple[str, ...]
) -> None:
    """With early attribution on, or off (the default) when ingest pauses after the trace."""
    server = start_serve(
        tmp_path / "store",
        *("--attribution-settle-s", "30", *early, "--attribution-poll-s", "0.1"),
    )
    try:
        trace_id, send_client = send_trace(server.grpc)
        send_client()
        _wait_metric(server, "latscope_attributed_requests_total", 1, timeout=15)
    finally:
        assert server.stop() == 0, server.text()
    rows = _read_rows(tmp_path / "store")
    assert [r[0] for r in rows] == [trace_id]
    _, has_client, e2e, *values, _model, _skew = rows[0]
    assert has_client and e2e == pytest.approx(1000 * MS, abs=MS)
    buckets = ["network", "queue", "preprocess", "prefill", "decode", "postprocess", "other"]
    got = {b: v / MS for b, v in zip(buckets, values, strict=True)}
    assert got == pytest.approx({b: float(v) for b, v in EXPECTED.items()}, abs=1.0)


def _filler(clock: StoreClock) -> None:
    """Another trace's spans, stored now: ingest has not paused."""
    clock.store(uuid.uuid4().hex, server_spans())


def _statements_run(store: Store, clock: StoreClock, att: Attributor) -> set[str]:
    """One pass of ``att`` that starts 1 ms before its settled bound (so it holds no settled
    traces, and the early window is its only work), and the names of the statements it ran."""
    sql: list[str] = []
    real = store.command, store.query_rows
    store.command = lambda s, *a, **k: (sql.append(s), real[0](s, *a, **k))[1]  # type: ignore[method-assign]
    store.query_rows = lambda s, *a, **k: (sql.append(s), real[1](s, *a, **k))[1]  # type: ignore[method-assign]
    try:
        att.watermark_us = clock.now_us() - att.settle_us - 1000
        att.run_until_idle()
    finally:
        del store.command, store.query_rows
    kinds = [att._sql, *att._early_sql.values()]  # whichever the pass used
    return {n for kind in kinds for n, text in vars(kind).items() if text in sql}


@pytest.mark.slow
def test_the_exact_count_of_traces_left_runs_only_when_a_superset_has_one(
    store: Store, clock: StoreClock
) -> None:
    """The batch of an early window is known only by its tree check, so counting which of its
    traces got no row from the single-call statement would evaluate that check again. A first
    quiet pass (no trace of its slice attributed early before, so no Version check) counts a
    superset first, the window's traces complete or not: with none there, neither the exact
    count nor the general statement runs; with an incomplete trace that has a SERVER span, the
    exact count runs, finds no complete trace left, and the general statement does not run.
    Once a quiet window was taken, the slices reaching into it make the exact count alone."""
    att = _attributor(store, clock, "quiet")
    att._early_us = clock.now_us()  # the window starts here: no other test's spans in it
    complete = uuid.uuid4().hex
    clock.advance(0.001)
    clock.store(complete, [CLIENT, *server_spans()])
    clock.advance(COMPLETE_S + 0.2)
    ran = _statements_run(store, clock, att)
    assert _rows(store, complete) == (1, 4)
    assert {"insert_simple", "count_left_superset"} <= ran
    assert not ran & {"count_left", "insert"}
    assert set(att._early_sql) == {False}  # no Version check

    incomplete = uuid.uuid4().hex  # the server's spans without their parent, the client span
    before = clock.now_us()
    clock.advance(0.001)
    clock.store(incomplete, server_spans())
    clock.advance(COMPLETE_S + 0.2)
    ran = _statements_run(store, clock, att)  # its slice reaches into the first window
    assert _rows(store, incomplete) == (0, 0)
    assert True in att._early_sql
    assert {"insert_simple", "count_left"} <= ran
    assert not ran & {"count_left_superset", "insert"}

    fresh = _attributor(store, clock, "quiet")  # no window taken: the superset first
    fresh._early_us = before
    ran = _statements_run(store, clock, fresh)
    assert _rows(store, incomplete) == (0, 0)
    assert {"insert_simple", "count_left_superset", "count_left"} <= ran
    assert "insert" not in ran


@pytest.mark.slow
def test_while_spans_keep_coming_a_quiet_pass_does_not_come(
    store: Store, clock: StoreClock
) -> None:
    """Early attribution off: a complete trace waits to settle while other spans keep coming."""
    att = _attributor(store, clock, "quiet")
    trace_id = uuid.uuid4().hex
    stored = clock.store(trace_id, [CLIENT, *server_spans()])
    for _ in range(3):
        clock.advance(COMPLETE_S + 0.2)
        _filler(clock)
        att.run_until_idle()
        assert _rows(store, trace_id) == (0, 0)
    _advance_to(clock, stored + SETTLE_S + 0.2)
    att.run_until_idle()
    assert _rows(store, trace_id) == (1, 4)


@pytest.mark.slow
@pytest.mark.parametrize("early_when_quiet", [True, False])
def test_a_pass_that_ends_after_ingest_paused_calls_the_quiet_pass_at_once(
    store: Store, clock: StoreClock, early_when_quiet: bool
) -> None:
    """A pass that began while spans kept coming and ended after ingest paused: the early
    window is ready, so the next pass comes at once (MIN_POLL_S), not a poll later."""
    att = _attributor(store, clock, "quiet", early_when_quiet=early_when_quiet)
    settled = uuid.uuid4().hex
    clock.store(settled, [CLIENT, *server_spans()])
    clock.advance(SETTLE_S + 0.2)
    _filler(clock)  # spans keep coming when the pass begins
    late = []

    def now_us() -> int:
        if _rows(store, settled)[0] and not late:  # the pass's end: ingest paused since it began
            clock.advance(att.idle_poll_s)
            late.append(True)
        return clock.now_us()

    att._store_clock_us = now_us
    att.run_until_idle()
    assert late and _rows(store, settled) == (1, 4)
    assert att.poll_s == (MIN_POLL_S if early_when_quiet else att.idle_poll_s)


@pytest.mark.slow
def test_a_quiet_pass_that_ends_after_newer_spans_paused_calls_the_next_at_once(
    store: Store, clock: StoreClock
) -> None:
    """A quiet pass took the early window up to the newest span there was when it began; spans
    stored during it, and ingest paused since: the next pass takes them at once (MIN_POLL_S)."""
    att = _attributor(store, clock, "quiet")
    first, second = uuid.uuid4().hex, uuid.uuid4().hex
    clock.store(first, [CLIENT, *server_spans()])
    clock.advance(att.idle_poll_s + 0.01)
    stored = []

    def now_us() -> int:
        if _rows(store, first)[0] and not stored:  # the pass's end: it wrote the first's row
            stored.append(clock.store(second, [CLIENT, *server_spans()]))
            clock.advance(att.idle_poll_s)
        return clock.now_us()

    att._store_clock_us = now_us
    att.run_until_idle()
    assert stored and _rows(store, first) == (1, 4) and _rows(store, second) == (0, 0)
    assert att.poll_s == MIN_POLL_S
    clock.advance(att.poll_s)
    att.run_until_idle()
    assert _rows(store, second) == (1, 4)


@pytest.mark.slow
@pytest.mark.parametrize("bound", [8, 9])
def test_with_many_spans_waiting_a_short_pause_is_a_quiet_one(
    store: Store, clock: StoreClock, monkeypatch: pytest.MonkeyPatch, bound: int
) -> None:
    """Early attribution off, a poll of 1 s: once QUICK_PAUSE_SPANS spans wait that no pass has
    taken, ingest has paused when the newest is QUICK_PAUSE_S old. Two complete traces (8 spans)
    are attributed then with a bound of 8, and a poll after them with 9; the loop looks at that
    time. The spans a quiet pass took wait no longer: a third trace alone waits a poll."""
    monkeypatch.setattr(cadence, "QUICK_PAUSE_SPANS", bound)
    att = Attributor(
        store, settle_s=SETTLE_S, poll_s=1.0, clock=clock.monotonic, store_clock_us=clock.now_us
    )
    # From a settle window after the clock's start: the shared store's spans, before, wait
    # no more.
    clock.advance(SETTLE_S)
    att.watermark_us = clock.now_us() - att.settle_us
    att.run_until_idle()  # (no span yet)
    ids = [uuid.uuid4().hex, uuid.uuid4().hex]
    for trace_id in ids:
        clock.store(trace_id, [CLIENT, *server_spans()])
    att.poll()  # a look: the newest span is new
    quick = bound <= 2 * 4
    assert att.next_wake_s() == pytest.approx(QUICK_PAUSE_S + LOOK_LATE_S if quick else 1.0)
    clock.advance(QUICK_PAUSE_S + LOOK_LATE_S)
    att.poll()
    assert [_rows(store, t) for t in ids] == [(1, 4) if quick else (0, 0)] * 2
    clock.advance(1.0 - QUICK_PAUSE_S)
    att.poll()
    assert [_rows(store, t) for t in ids] == [(1, 4)] * 2
    third = uuid.uuid4().hex
    clock.store(third, [CLIENT, *server_spans()])
    clock.advance(QUICK_PAUSE_S + LOOK_LATE_S)
    att.run_until_idle()
    assert _rows(store, third) == (0, 0)
    clock.advance(1.0 - QUICK_PAUSE_S)
    att.run_until_idle()
    assert _rows(store, third) == (1, 4)


@pytest.mark.slow
def test_early_when_quiet_off_waits_for_the_settle_window(store: Store, clock: StoreClock) -> None:
    att = _attributor(store, clock, "quiet", early_when_quiet=False)
    trace_id = uuid.uuid4().hex
    stored = clock.store(trace_id, [CLIENT, *server_spans()])
    _early_then_settled(store, clock, att, trace_id, stored, early=(0, 0), settled=(1, 4))


@pytest.mark.slow
@pytest.mark.parametrize("traces", [4, 5])
def test_a_quiet_pass_takes_an_early_window_of_at_most_16_spans_per_batch_trace(
    store: Store, clock: StoreClock, traces: int
) -> None:
    """One statement takes a quiet pass's early window: a window larger than QUIET_EARLY_SPANS
    (16) spans per batch trace waits to settle, and goes in batches (here of one trace)."""
    assert QUIET_EARLY_SPANS == 16
    att = _attributor(store, clock, "quiet", batch_traces=1)
    ids = [uuid.uuid4().hex for _ in range(traces)]  # 4 spans each: 16 or 20
    for trace_id in ids:
        stored = clock.store(trace_id, [CLIENT, *server_spans()])
    clock.advance(COMPLETE_S + 0.2)
    att.run_until_idle()
    early = (1, 4) if traces * 4 <= 16 else (0, 0)
    assert [_rows(store, t) for t in ids] == [early] * traces
    _advance_to(clock, stored + SETTLE_S + 0.2)
    att.run_until_idle()
    assert [_rows(store, t) for t in ids] == [(1, 4)] * traces


@pytest.mark.parametrize("complete_s", [-1.0, 5.0, 6.0])
def test_complete_s_must_be_shorter_than_the_settle_window(complete_s: float) -> None:
    with pytest.raises(ConfigError, match="--attribution-complete-s"):
        Settings(attribution_settle_s=5.0, attribution_complete_s=complete_s).validate()


def test_early_attribution_is_off_by_default_but_on_when_quiet() -> None:
    settings = Settings()
    settings.validate()
    assert settings.attribution_complete_s == 0
    assert settings.attribution_early_when_quiet == "on"


def test_early_when_quiet_is_on_or_off() -> None:
    with pytest.raises(ConfigError, match="--attribution-early-when-quiet: expected on or off"):
        Settings(attribution_early_when_quiet="yes").validate()


def test_the_complete_tree_check_of_a_wide_trace_fits_in_linear_memory(store: Store) -> None:
    """The early window's check that a trace's tree is complete (a root, every parent stored,
    every CLIENT span with a child) compares sets: a lambda over one array of the trace reading
    another gets a copy of it per element, and 20,000 spans would ask for gigabytes, failing
    the statement of every trace in the window with the wide one."""
    from latscope.attribution.statements import _early_batch

    n = 20_000
    trace_ids = [uuid.uuid4().hex for _ in range(3)]
    root = {"id": "f0" * 8, "kind": "Internal", "start": T0, "end": T0 + n * MS}
    calls = [
        {"id": f"{i:016x}", "parent": root["id"], "kind": "Client", "start": T0 + i * MS,
         "end": T0 + (i + 1) * MS}
        for i in range(1, n // 2)
    ]  # fmt: skip
    servers = [{**c, "id": f"{i:016x}", "parent": c["id"], "kind": "Server"}
               for i, c in enumerate(calls, start=n)]  # fmt: skip
    # Complete; one CLIENT span without the server it called; one span whose parent is missing.
    store.insert_arrow(SPANS_TABLE, span_rows(trace_ids[0], [root, *calls, *servers]))
    store.insert_arrow(SPANS_TABLE, span_rows(trace_ids[1], [root, *calls, *servers[1:]]))
    orphan = {**servers[0], "parent": "ee" * 8}
    store.insert_arrow(SPANS_TABLE, span_rows(trace_ids[2], [root, *calls, orphan, *servers[1:]]))
    batch = _early_batch(
        "SELECT '' AS trace_id WHERE 0", "TraceId IN {ids:Array(String)}", SPANS_TABLE,
        ATTRIBUTION_TABLE, "", "1", "1", versioned=False,
    ).exact  # fmt: skip
    found = store.query_rows(
        f"{batch} SETTINGS max_memory_usage = 300000000",
        {"ids": trace_ids, "early_hi_us": 2**62},
    )
    assert [t for (t,) in found] == trace_ids[:1]


@pytest.mark.slow
def test_the_writers_word_decides_when_ingest_has_paused(store: Store, clock: StoreClock) -> None:
    """With the store's only writer's idle time (``ingest_idle_s``, serve's collector over the
    embedded store): no pause while it is busy, however old the newest stored span (its insert
    may be in flight), and a pause once it has been idle ``pause_s``, however new that span
    (its time is when its insert began). While it is busy the loop asks it again within
    WRITER_LOOK_S, without a query."""
    idle = [0.0]
    att = _attributor(store, clock, "quiet", ingest_idle_s=lambda: idle[0])
    trace_id = uuid.uuid4().hex
    clock.store(trace_id, [CLIENT, *server_spans()])
    clock.advance(5 * COMPLETE_S)  # the store alone would call this a pause
    att.run_until_idle()
    assert _rows(store, trace_id) == (0, 0)
    att._due = math.inf  # no pass due: the loop only looks
    queries = []
    query_rows = store.query_rows
    store.query_rows = lambda *a, **kw: queries.append(a) or query_rows(*a, **kw)  # type: ignore[method-assign]
    try:
        att.poll()
    finally:
        del store.query_rows
    assert not queries and att.next_wake_s() == pytest.approx(WRITER_LOOK_S)
    second = uuid.uuid4().hex
    clock.store(second, [CLIENT, *server_spans()])
    clock.advance(0.01)
    idle[0] = COMPLETE_S
    att.poll()
    assert _rows(store, trace_id) == (1, 4) and _rows(store, second) == (1, 4)


@pytest.mark.slow
def test_a_passs_early_window_is_cut_by_trace_id_with_its_settled_traces(
    store: Store, clock: StoreClock, mode: str
) -> None:
    """The last slice's settled traces and the early window's are cut into batches together,
    each batch taking the window's traces of its range of ids: no statement holds more than
    ``batch_traces`` traces (its memory grows with them), and each reads its own range."""
    att = _attributor(store, clock, mode, batch_traces=2)
    att.watermark_us = clock.now_us() - 1  # (not the spans of the tests before)
    ids = [uuid.uuid4().hex for _ in range(5)]
    for trace_id in ids[:2]:
        clock.store(trace_id, [CLIENT, *server_spans()])
    clock.advance(SETTLE_S + 0.2)
    for trace_id in ids[2:]:
        clock.store(trace_id, [CLIENT, *server_spans()])
    clock.advance(COMPLETE_S + 0.01)
    assert att.run_until_idle() == 5
    per_batch = store.query_rows(
        f"SELECT SpansIngestedAt, count() FROM {ATTRIBUTION_TABLE} "
        "WHERE TraceId IN {ids:Array(String)} GROUP BY SpansIngestedAt",
        {"ids": ids},
    )
    assert len(per_batch) == 3 and max(int(n) for _, n in per_batch) <= 2


def test_serve_over_the_embedded_store_gives_the_attributor_its_collectors_word(
    store: Store, tmp_path: Path
) -> None:
    settings = Settings(store=store.dsn, spool_dir=str(tmp_path / "spool"), attributor="on")
    parts = ingest_parts(settings, store)
    (collector,) = (c for c in parts.components if isinstance(c, Collector))
    (att,) = (c for c in parts.components if isinstance(c, Attributor))
    assert att.ingest_idle_s == collector.spans_idle_s
