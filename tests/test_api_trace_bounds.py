"""How many trace answers run at once, how many wait, and the deadline each keeps
(``latscope.api.trace``): past the queue a request is refused at once (503 ``busy``), and a
request that cannot start or finish by its deadline stops (503 ``query_timeout``). What is worked
out of a trace is shared by the answers about it while the trace stays as it is."""

from __future__ import annotations

import gc
import threading
import time
import uuid
import weakref
from collections.abc import Callable

import pytest

from latscope.api import trace, trace_state
from latscope.api.errors import QueryError
from latscope.api.trace_state import _CyclesLater, _Gate, _Trace, _Worked
from latscope.attribution import rules
from latscope.storage import SPANS_TABLE, Store
from tests.attribution_support import MS, T0, server_spans, span_rows


def _until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_past_the_queue_a_trace_answer_is_refused_at_once() -> None:
    gate = _Gate(1, 1)
    far = time.monotonic() + 60
    entered = threading.Event()

    def waiter() -> None:
        with gate.slot(far, "trace w"):
            entered.set()

    with gate.slot(far, "trace a"):
        thread = threading.Thread(target=waiter)
        thread.start()
        _until(lambda: gate._queued == 1)
        with pytest.raises(QueryError) as info, gate.slot(far, "trace b"):
            pass
        assert (info.value.status, info.value.error) == (503, "busy")
        assert "retry trace b later" in str(info.value)
        assert not entered.is_set()
    thread.join(10)
    assert entered.is_set()  # the one waiting got the slot once it was free
    assert gate._queued == 0


def test_a_trace_answer_waiting_past_its_deadline_stops() -> None:
    gate = _Gate(1, 4)
    with gate.slot(time.monotonic() + 60, "trace a"):
        with pytest.raises(QueryError) as info, gate.slot(time.monotonic() - 1, "trace b"):
            pass
        assert (info.value.status, info.value.error) == (503, "query_timeout")
        assert "--query-timeout-s" in str(info.value)
    # The slot is free again, and the one that timed out holds none.
    with gate.slot(time.monotonic() + 60, "trace c"):
        pass


def test_an_answer_past_its_deadline_stops_at_its_next_step() -> None:
    now = time.monotonic()
    worked = _Worked(1, rules.active())
    _Trace("ab" * 16, worked, now + 60, "trace x").check()
    with pytest.raises(QueryError) as info:
        _Trace("ab" * 16, worked, now - 1, "trace x").check()
    assert (info.value.status, info.value.error) == (503, "query_timeout")


def test_the_cyclic_collector_is_back_once_no_answer_runs() -> None:
    cycles = _CyclesLater()
    assert gc.isenabled()
    with cycles.paused():
        assert not gc.isenabled()
        with cycles.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # one answer still runs
    assert gc.isenabled()
    with pytest.raises(QueryError), cycles.paused():
        raise QueryError(503, "query_timeout", "stopped")
    assert gc.isenabled()


def test_an_answer_waiting_for_a_piece_past_its_deadline_stops() -> None:
    worked = _Worked(1, rules.active())
    held = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with worked.lock:
            held.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(10)
    try:
        with pytest.raises(QueryError) as info:
            _Trace("ab" * 16, worked, time.monotonic() + 0.05, "trace x").piece("p", lambda: 1)
        assert (info.value.status, info.value.error) == (503, "query_timeout")
    finally:
        release.set()
        thread.join(10)
    # Once the piece is free, it is worked out once and shared.
    t = _Trace("ab" * 16, worked, time.monotonic() + 60, "trace x")
    assert t.piece("p", lambda: [1]) is t.piece("p", lambda: [2])


def test_what_each_call_has_its_own_of_is_kept_for_the_latest_call_only() -> None:
    t = _Trace("ab" * 16, _Worked(1, rules.active()), time.monotonic() + 60, "trace x")
    first = t.latest("rows", "call 1", lambda: [1])
    assert t.latest("rows", "call 1", lambda: [2]) is first
    assert t.latest("rows", "call 2", lambda: [3]) == [3]
    assert list(t.worked.pieces) == ["rows"]  # one call's, not one per call asked
    assert t.latest("rows", "call 1", lambda: [4]) == [4]


def test_answers_follow_the_trace_as_its_spans_arrive(store: Store) -> None:
    trace_id = uuid.uuid4().hex
    store.insert_arrow(SPANS_TABLE, span_rows(trace_id, server_spans()))
    (alone,) = trace.trace_requests(store, trace_id).requests
    assert alone.buckets_ms.network is None
    assert len(trace.trace_spans(store, trace_id).spans) == 3
    # Asked again in the same state, the answer is the one worked out already.
    assert trace.trace_requests(store, trace_id) is trace.trace_requests(store, trace_id)
    # The client span arrives late: every answer is worked out again, with it.
    client = {"id": "c1" * 8, "kind": "Client", "start": T0, "end": T0 + 1000 * MS}
    store.insert_arrow(SPANS_TABLE, span_rows(trace_id, [client]))
    (called,) = trace.trace_requests(store, trace_id).requests
    assert called.buckets_ms.network is not None and called.e2e_ms == 1000
    assert len(trace.trace_spans(store, trace_id).spans) == 4


def test_askers_of_one_trace_at_once_share_one_answer(store: Store) -> None:
    trace_id = uuid.uuid4().hex
    store.insert_arrow(SPANS_TABLE, span_rows(trace_id, server_spans()))
    answers: list[object] = []
    start = threading.Barrier(4)

    def ask() -> None:
        start.wait(10)
        answers.append(trace.trace_run(store, trace_id))

    askers = [threading.Thread(target=ask) for _ in range(4)]
    for thread in askers:
        thread.start()
    for thread in askers:
        thread.join(60)
    assert len(answers) == 4
    assert all(a is answers[0] for a in answers)


def test_kept_traces_hold_at_most_the_span_cap_and_the_text_bound(store, monkeypatch) -> None:
    one, two = uuid.uuid4().hex, uuid.uuid4().hex
    for trace_id in (one, two):
        store.insert_arrow(SPANS_TABLE, span_rows(trace_id, server_spans()))
    first = trace.trace_run(store, one, max_spans=5)
    assert trace.trace_run(store, one, max_spans=5) is first
    # Three spans each: with a cap of 5 the second trace's state lets go of the first's.
    trace.trace_run(store, two, max_spans=5)
    assert trace.trace_run(store, one, max_spans=5) is not first
    # Spans carrying more attribute text than the bound are not kept past their answer.
    monkeypatch.setattr(trace_state, "KEPT_TEXT", 5)
    again = trace.trace_run(store, one)
    assert trace.trace_run(store, one) is not again


def test_past_the_text_bound_answers_bytes_go_before_their_trace(store, monkeypatch) -> None:
    trace_id = uuid.uuid4().hex
    store.insert_arrow(SPANS_TABLE, span_rows(trace_id, server_spans()))
    view = trace.trace_explain(store, trace_id)
    (worked,) = (w for w in trace_state._KEPT._states.values() if view in w.pieces.values())
    view_json = trace_state.json_of(view)
    spans = trace.trace_spans(store, trace_id)
    spans_json = trace_state.json_of(spans)
    assert worked.kept == worked.text + len(view_json) + len(spans_json) and worked.text > 0
    # Room for the spans' text and one answer's JSON: the view's, asked for less recently, goes.
    monkeypatch.setattr(
        trace_state, "KEPT_TEXT", worked.text + max(len(view_json), len(spans_json))
    )
    assert trace_state.json_of(spans) is spans_json
    assert trace.trace_explain(store, trace_id) is view  # the trace's state is kept
    assert list(worked.made) == [("json", "spans answer")]
    assert worked.kept == worked.text + len(spans_json)
    again = trace_state.json_of(view)
    assert again == view_json and again is not view_json
    assert trace_state.json_of(spans) is spans_json
    # The spans' text alone past the bound: the state goes once its answer is done.
    monkeypatch.setattr(trace_state, "KEPT_TEXT", worked.text - 1)
    assert trace.trace_explain(store, trace_id) is view
    assert trace.trace_explain(store, trace_id) is not view


def test_a_shared_answer_is_written_once_and_counted_with_its_trace(store: Store) -> None:
    trace_id = uuid.uuid4().hex
    store.insert_arrow(SPANS_TABLE, span_rows(trace_id, server_spans()))
    answer = trace.trace_explain(store, trace_id)
    (worked,) = (w for w in trace_state._KEPT._states.values() if answer in w.pieces.values())
    kept = worked.kept
    body = trace_state.json_of(answer)
    assert body == answer.model_dump_json().encode()
    assert worked.kept == kept + len(body)
    # Asked again in the same state: the same answer, its JSON not written again.
    again = trace.trace_explain(store, trace_id)
    assert again is answer and trace_state.json_of(again) is body
    assert worked.kept == kept + len(body)
    # An answer built for one asker (a call's attribution) is written for each.
    (call,) = trace.trace_requests(store, trace_id).requests
    one = trace.request_attribution(store, call.request_id)
    assert trace_state.json_of(one) == trace_state.json_of(one)
    assert trace_state.json_of(one) is not trace_state.json_of(one)
    # A span arrives: a new state, a new answer and JSON, with it.
    client = {"id": "c1" * 8, "kind": "Client", "start": T0, "end": T0 + 1000 * MS}
    store.insert_arrow(SPANS_TABLE, span_rows(trace_id, [client]))
    newer = trace_state.json_of(trace.trace_explain(store, trace_id))
    assert newer != body and ("c1" * 8).encode() in newer
    # The shared answers' entries go with them.
    key = id(answer)
    del answer, again, worked
    trace_state._KEPT.clear()
    gc.collect()
    assert key not in trace_state._SHARED.states


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_answers_one_after_another_do_not_keep_the_collector_paused() -> None:
    cycles = _CyclesLater(most_s=0.0)
    with cycles.paused():
        with cycles.paused():
            ref = weakref.ref(_Cycle())
        # An answer ended past most_s while another still runs: the cycle is collected.
        assert ref() is None
        assert not gc.isenabled()
    assert gc.isenabled()
