"""The reference engine in a process of its own (``attribution.reference.Worker``), as ``latscope
serve`` runs it on the traces too wide for the SQL: the rows it gives are those the attributor's
thread gives, and each way it can fail (the engine's own error, a worker killed, a worker past
its time limit) fails that trace alone, saying why, with a worker for the next trace."""

from __future__ import annotations

import os
import signal
import sys
import uuid
from collections.abc import Iterator
from contextlib import closing

import pyarrow as pa
import pytest

from latscope.attribution import rules
from latscope.attribution.queries import TRACE_SPANS, TRACE_SPANS_READ_BY_RULES
from latscope.attribution.reference import Reference, ReferenceFailed, Worker
from latscope.attribution.sql import rule_keys
from latscope.config import ConfigError, Settings
from latscope.storage import SPANS_TABLE, Store
from latscope.tokens import DEFAULT_STALL_NS
from tests.attribution_support import MS, T0, calls_run, span_rows, store_traces
from tests.shapes_support import shapes_by_rulebook
from tests.test_engine_rules import FASTGEN_RULES, fastgen_request
from tests.upstream_traces import span_records

ALL = (0, 2**63 - 1)


def _stored(store: Store, calls: int) -> tuple[str, pa.Table]:
    """A run of ``calls`` calls stored, and its spans as the attributor reads them."""
    trace_id = uuid.uuid4().hex
    store.insert_arrow(SPANS_TABLE, span_rows(trace_id, calls_run(calls)))
    return trace_id, store.query_arrow(TRACE_SPANS, {"trace_id": trace_id})


@pytest.fixture
def worker() -> Iterator[Worker]:
    made = Worker()
    yield made
    made.close()


def _pid(worker: Worker) -> int:
    assert worker._proc is not None and worker._proc.pid is not None
    return worker._proc.pid


@pytest.mark.parametrize(
    "around", [ALL, (T0 + 3_000 * MS, T0 + 6_500 * MS)], ids=["every span", "within a window"]
)
def test_the_worker_gives_the_rows_the_attributor_thread_gives(
    store: Store, worker: Worker, around: tuple[int, int]
) -> None:
    trace_id, spans = _stored(store, 40)
    args = (spans, trace_id, around, 1_234, DEFAULT_STALL_NS)
    want_rows, want_spans = Reference()(*args)
    got_rows, got_spans = worker(*args)
    assert got_spans == want_spans == (121 if around == ALL else 12)
    assert got_rows.num_rows == (40 if around == ALL else 4)
    assert got_rows.schema == want_rows.schema
    assert got_rows.to_pylist() == want_rows.to_pylist()
    marked = got_rows.column("SpansIngestedAt").cast(pa.int64()).to_pylist()
    assert set(marked) == {1_234}


def test_an_engine_error_fails_that_trace_alone(store: Store, worker: Worker) -> None:
    """The worker answers the error (its repr; the traceback goes to the log) and takes the next
    trace in the same process."""
    trace_id, spans = _stored(store, 3)
    worker(spans, trace_id, ALL, 1, DEFAULT_STALL_NS)
    pid = _pid(worker)
    broken = pa.table({"SpanId": ["a"], "ParentSpanId": [""]})  # 2 of the 12 columns
    with pytest.raises(ReferenceFailed, match=r"ValueError\('not enough values to unpack"):
        worker(broken, trace_id, ALL, 1, DEFAULT_STALL_NS)
    rows, _ = worker(spans, trace_id, ALL, 1, DEFAULT_STALL_NS)
    assert rows.num_rows == 3 and _pid(worker) == pid


def test_a_killed_worker_fails_its_trace_and_a_new_one_takes_the_next(
    store: Store, worker: Worker
) -> None:
    trace_id, spans = _stored(store, 3)
    worker(spans, trace_id, ALL, 1, DEFAULT_STALL_NS)
    pid = _pid(worker)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ReferenceFailed, match=r"its process ended \(exit code -9\)"):
        worker(spans, trace_id, ALL, 1, DEFAULT_STALL_NS)
    assert not worker.running
    rows, _ = worker(spans, trace_id, ALL, 1, DEFAULT_STALL_NS)
    assert rows.num_rows == 3 and _pid(worker) != pid


@pytest.mark.parametrize(
    ("executable", "why"),
    [
        ("/nonexistent/python", r"its process could not start \(.*No such file.*\); "
         r"--attribution-reference-process off works it out"),
        ("/bin/false", r"its process ended \(exit code 1\)"),
    ],
    ids=["no interpreter", "dies at once"],
)  # fmt: skip
def test_a_worker_that_cannot_start_fails_its_trace_saying_why(
    store: Store, monkeypatch: pytest.MonkeyPatch, executable: str, why: str
) -> None:
    trace_id, spans = _stored(store, 3)
    worker = Worker()
    monkeypatch.setattr(sys, "executable", executable)
    with pytest.raises(ReferenceFailed, match=why):
        worker(spans, trace_id, ALL, 1, DEFAULT_STALL_NS)
    assert not worker.running
    monkeypatch.undo()
    try:
        rows, _ = worker(spans, trace_id, ALL, 1, DEFAULT_STALL_NS)
    finally:
        worker.close()
    assert rows.num_rows == 3


def test_a_worker_past_its_time_limit_is_stopped_and_replaced(store: Store) -> None:
    """A first call includes the worker's start (an interpreter importing the engine, about half
    a second): past a limit of 10 ms it is stopped, and the next call starts another."""
    trace_id, spans = _stored(store, 1_000)
    worker = Worker(timeout_s=0.01)
    try:
        with pytest.raises(ReferenceFailed, match=r"gave no answer in 0\.01 s and was stopped"):
            worker(spans, trace_id, ALL, 1, DEFAULT_STALL_NS)
        assert not worker.running
        worker.timeout_s = 120
        rows, _ = worker(spans, trace_id, ALL, 1, DEFAULT_STALL_NS)
        assert rows.num_rows == 1_000
    finally:
        worker.close()


def test_a_worker_ends_when_idle_or_closed(store: Store) -> None:
    trace_id, spans = _stored(store, 2)
    worker = Worker(idle_s=3600)
    worker(spans, trace_id, ALL, 1, DEFAULT_STALL_NS)
    proc = worker._proc
    assert proc is not None
    worker.close_if_idle()  # not idle long enough
    assert worker.running and proc.poll() is None
    worker.idle_s = 0
    worker.close_if_idle()
    assert not worker.running and proc.returncode == 0  # ended of itself, its pipe closed
    worker(spans, trace_id, ALL, 1, DEFAULT_STALL_NS)  # a new one
    proc = worker._proc
    assert proc is not None and proc.poll() is None
    worker.close()
    assert not worker.running and proc.returncode is not None


def test_the_worker_attributes_by_the_rulebook_in_force(store: Store, worker: Worker) -> None:
    """A rule file (``--rules``) installed in the attributor's process reaches the worker: an
    engine only that file reads is a call there too, and not once the shipped book is back."""
    built, truth = fastgen_request(7)
    ((stored, _),) = store_traces(store, span_records(built.resource_spans)).items()
    spans = store.query_arrow(TRACE_SPANS, {"trace_id": stored})
    shipped = rules.active()
    rules.install(rules.load([FASTGEN_RULES]))
    try:
        rows, _ = worker(spans, stored, ALL, 1, DEFAULT_STALL_NS)
        want, _ = Reference()(spans, stored, ALL, 1, DEFAULT_STALL_NS)
    finally:
        rules.install(shipped)
    assert rows.to_pylist() == want.to_pylist()
    assert rows.column("E2eNs").to_pylist() == [truth["e2e"]]
    rows, _ = worker(spans, stored, ALL, 1, DEFAULT_STALL_NS)
    assert rows.num_rows == 0


def test_the_rule_attributes_give_the_rows_every_attribute_gives(store: Store) -> None:
    """The attributor reads a wide trace's spans for the reference engine with the attributes
    the statements read only (``sql.rule_keys``), leaving prompts in ClickHouse: over every
    upstream client's, serving engine's and agent run's shape, with the rulebook of a user's
    file too, the rows are those worked out from every attribute."""
    # Closed when the test ends, pass or fail: the shipped rulebook is installed again.
    with closing(shapes_by_rulebook()) as books:
        for built in books:
            rows = dropped = 0
            for records in (span_records(b.resource_spans) for b in built):
                for stored, _ in store_traces(store, records).items():
                    full = store.query_arrow(TRACE_SPANS, {"trace_id": stored})
                    read = store.query_arrow(
                        TRACE_SPANS_READ_BY_RULES, {"trace_id": stored, "keys": rule_keys()}
                    )
                    kept = [dict(a) for a in read.column(7).to_pylist()]
                    assert all(a.keys() <= set(rule_keys()) for a in kept)
                    dropped += sum(map(len, full.column(7).to_pylist())) - sum(map(len, kept))
                    want, _ = Reference()(full, stored, ALL, 1, DEFAULT_STALL_NS)
                    got, _ = Reference()(read, stored, ALL, 1, DEFAULT_STALL_NS)
                    assert got.to_pylist() == want.to_pylist(), stored
                    rows += want.num_rows
            assert rows > len(built) and dropped > 0


def test_reference_process_is_on_or_off() -> None:
    assert Settings().attribution_reference_process == "on"
    Settings(attribution_reference_process="off").validate()
    with pytest.raises(ConfigError, match="--attribution-reference-process: expected on or off"):
        Settings(attribution_reference_process="thread").validate()
