"""How many trace answers run at once, how many wait, and the deadline each keeps
(``latscope.api.trace``): past the queue a request is refused at once (503 ``busy``), and a
request that cannot start or finish by its deadline stops (503 ``query_timeout``)."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable

import pytest

from latscope.api.errors import QueryError
from latscope.api.trace import _CyclesLater, _Gate, _Trace, _Worked
from latscope.attribution import rules


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
