"""Attribution as background work (``Store.background``): in the embedded engine, the threads
working on an attributor's pass run at nice 19 while they do, and no thread of the process is left
at nice 19 after it, so the inserts and queries that run on the engine's pool threads next are
not slowed by a pass that ran before them; queries outside it run at the process's priority."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable

import pyarrow as pa

from latscope.attribution.attributor import Attributor
from latscope.storage import ATTRIBUTION_TABLE, BACKGROUND_NICE, SPANS_TABLE, Store
from tests.attribution_support import server_spans, span_rows

#: A query long enough to be seen working (a few hundred ms).
BUSY = (
    "SELECT count() FROM (SELECT number % 100003 AS k, sum(sipHash64(number)) "
    "FROM numbers(20000000) GROUP BY k)"
)


def _threads() -> dict[int, tuple[str, int]]:
    """This process's threads: {thread id: (name, nice)}."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        name, fields = stat[stat.index("(") + 1 : stat.rindex(")")], stat.rsplit(")", 1)[1].split()
        out[int(tid)] = (name, int(fields[16]))
    return out


def _nices_while(work: Callable[[], object]) -> set[int]:
    """The nice values this process's threads had while ``work`` ran on a thread of its own."""
    seen: set[int] = set()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # re-raised below, in the test's thread
            failed.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    while worker.is_alive():
        seen.update(nice for _, nice in _threads().values())
        time.sleep(0.0005)
    worker.join()
    if failed:
        raise failed[0]
    return seen


def _lowered() -> dict[int, tuple[str, int]]:
    return {tid: t for tid, t in _threads().items() if t[1] == BACKGROUND_NICE}


def test_a_pass_runs_at_background_priority_and_leaves_no_thread_lowered(store: Store) -> None:
    service = f"priority-{uuid.uuid4().hex[:8]}"
    spans = [{**span, "service": service} for span in server_spans()]
    store.insert_arrow(
        SPANS_TABLE, pa.concat_tables([span_rows(uuid.uuid4().hex, spans) for _ in range(3000)])
    )
    attributor = Attributor(store, settle_s=0)
    seen = _nices_while(attributor.poll)
    got = store.query_rows(
        f"SELECT count() FROM {ATTRIBUTION_TABLE} FINAL WHERE ServiceName = {{s:String}}",
        {"s": service},
    )[0][0]
    assert got == 3000
    if store.background_priority:
        assert BACKGROUND_NICE in seen
    else:  # a process without CAP_SYS_NICE: the pass runs all the same, at its priority
        assert BACKGROUND_NICE not in seen
    # Threads the engine started during the pass inherited nice 19 from the one that started
    # them; each was set back.
    assert _lowered() == {}


def test_work_outside_background_runs_at_the_process_priority(store: Store) -> None:
    inside = _nices_while(lambda: _in_background(store))
    assert _lowered() == {}
    outside = _nices_while(lambda: store.query_rows(BUSY))
    if store.background_priority:
        assert BACKGROUND_NICE in inside
    assert BACKGROUND_NICE not in outside


def _in_background(store: Store) -> None:
    # More threads than the engine's pools have yet: they are started during the call, from
    # threads at nice 19.
    with store.background():
        store.query_rows(BUSY + " SETTINGS max_threads = 48")
