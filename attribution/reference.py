"""The reference engine as the attributor runs it, on a trace too wide for the SQL
(``Attributor._by_reference``): the rows of a trace's calls, worked out in Python from its spans
as the store returns them (``TRACE_SPANS_READ_BY_RULES`` read as Arrow: the rules' attributes
only, in no order; ``span_records`` sorts them).

``reference_rows`` is the work, by the rulebook in force. ``Reference`` runs it in the caller's
thread; ``Worker``, which ``latscope serve`` and ``latscope collector`` use, in a process of its
own, sent the caller's rulebook (``--rules``) with each trace. On a trace of 20,000 spans the
work is a CPU second or more of Python, which in the process that receives Exports holds the
GIL against the gRPC handlers: acknowledgements waited up to 0.8 s beside it
(``bench.attribution.wide --beside-ingest``). The worker gets the spans as an Arrow table and
gives back the rows as one; the ingest process reads, sends and inserts them in calls that
spend little time holding the GIL.

Errors: a failure of the engine on a trace, a worker that died (killed, out of memory) or did
not answer within its time limit, each raise ``ReferenceFailed`` saying so; the attributor sets
the trace aside with that message. A worker that died or timed out is replaced at the next call.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

import pyarrow as pa

from latscope.attribution import rules
from latscope.attribution.engine import attribute_requests
from latscope.attribution.spans import span_records
from latscope.attribution.table import attribution_row, rows_to_table
from latscope.collector.memory import return_freed_heap

log = logging.getLogger(__name__)

__all__ = ["Reference", "ReferenceFailed", "Worker", "reference_rows"]

#: A worker left without work this long ends; the next wide trace starts another (about 0.5 s).
WORKER_IDLE_S = 60.0
#: The longest one trace may take in the worker (its spans are capped by --max-trace-spans).
WORKER_TIMEOUT_S = 600.0


class ReferenceFailed(Exception):
    """The reference engine gave no rows for a trace; the message says why."""


def reference_rows(
    spans: pa.Table,
    trace_id: str,
    around: tuple[int, int],
    marker_us: int,
    stall_threshold_ns: int,
) -> tuple[pa.Table, int]:
    """The attribution rows (``ATTRIBUTION_SCHEMA``) of the calls of ``trace_id`` among its
    ``spans`` that start within ``around`` (ns, both ends in), each with SpansIngestedAt
    ``marker_us``; and how many spans they were worked out from."""
    lo, hi = around
    columns = [column.to_pylist() for column in spans.columns]
    records = [s for s in span_records(zip(*columns, strict=True)) if lo <= s.start_ns <= hi]
    rows = [
        attribution_row(a, span_count=len(records), ingested_us=marker_us)
        for a in attribute_requests(trace_id, records, stall_threshold_ns=stall_threshold_ns)
    ]
    return rows_to_table(rows), len(records)


class Reference:
    """Runs ``reference_rows`` in the caller's thread; raises ReferenceFailed when it gives no
    rows."""

    def __call__(
        self,
        spans: pa.Table,
        trace_id: str,
        around: tuple[int, int],
        marker_us: int,
        stall_threshold_ns: int,
    ) -> tuple[pa.Table, int]:
        return self._rows(trace_id, (spans, trace_id, around, marker_us, stall_threshold_ns))

    def _rows(self, trace_id: str, args: tuple[Any, ...]) -> tuple[pa.Table, int]:
        try:
            return reference_rows(*args)
        except Exception as exc:
            log.exception("the reference engine fails on trace %s", trace_id)
            raise ReferenceFailed(repr(exc)) from exc

    def close_if_idle(self) -> None:
        """Let go of what it holds between traces, once idle long enough."""

    def close(self) -> None:
        """Let go of what it holds."""


#: The worker's start: the caller's import path first (as multiprocessing's spawn sends it),
#: then ``_serve``. Started this way rather than by multiprocessing's spawn, which runs the
#: caller's main module again in the worker (a script without a ``__main__`` guard would start
#: serve there) and imports what it imports. Ctrl-C reaches the caller's process group; the
#: worker ends when the caller closes its end.
_BOOT = """
import signal, sys
from multiprocessing.connection import Connection
signal.signal(signal.SIGINT, signal.SIG_IGN)
conn = Connection(int(sys.argv[1]))
sys.path[:] = conn.recv()
from latscope.attribution.reference import _serve
_serve(conn)
"""


def _serve(conn: Connection) -> None:
    """The worker's loop: the rulebook in force and a call's arguments in, ("ok", rows, spans)
    or ("error", why, traceback) out, until the ingest process closes its end (or ends, killed
    or not)."""
    while True:
        try:
            book, *args = conn.recv()
        except (EOFError, OSError):
            return
        if book != rules.active():  # the ingest process's --rules
            rules.install(book)
        try:
            answer: tuple[Any, ...] = ("ok", *reference_rows(*args))
        except Exception as exc:
            answer = ("error", repr(exc), traceback.format_exc())
        conn.send(answer)
        # What the trace took, handed back between traces: the worker waits, maybe a minute, at
        # the size of its largest trace otherwise.
        del args, answer
        gc.collect()
        return_freed_heap()


class Worker(Reference):
    """``reference_rows`` in a process of its own (a new interpreter, not a fork: the ingest
    process runs threads inside the embedded ClickHouse and gRPC), started at the first call and
    ended after ``idle_s`` without one (``close_if_idle``), so an ingest process without wide
    traces holds no second interpreter. One call at a time (the attributor's one thread makes
    them)."""

    def __init__(
        self, *, idle_s: float = WORKER_IDLE_S, timeout_s: float = WORKER_TIMEOUT_S
    ) -> None:
        self.idle_s = idle_s
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._last = 0.0

    @property
    def running(self) -> bool:
        """Whether the worker's process is up (between its first call and ``close``)."""
        return self._proc is not None

    def _rows(self, trace_id: str, args: tuple[Any, ...]) -> tuple[pa.Table, int]:
        with self._lock:
            try:
                answer = self._ask((rules.active(), *args))
            finally:
                self._last = time.monotonic()
        if answer[0] == "error":
            log.error("the reference engine fails on trace %s:\n%s", trace_id, answer[2])
            raise ReferenceFailed(answer[1])
        return answer[1], answer[2]

    def _ask(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        try:
            if self._conn is None:
                self._start()
            assert self._conn is not None
            self._conn.send(args)
            if not self._conn.poll(self.timeout_s):
                self._end()
                raise ReferenceFailed(
                    f"its process gave no answer in {self.timeout_s:g} s and was stopped"
                )
            answer: tuple[Any, ...] = self._conn.recv()
            return answer
        except (EOFError, OSError) as exc:  # the worker died (killed, out of memory)
            code = self._end()
            raise ReferenceFailed(f"its process ended (exit code {code})") from exc

    def _start(self) -> None:
        ours, theirs = multiprocessing.Pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
            )
        except OSError as exc:
            ours.close()
            raise ReferenceFailed(
                f"its process could not start ({exc}); --attribution-reference-process off "
                "works it out in the attributor's thread"
            ) from exc
        finally:
            theirs.close()
        self._proc, self._conn = proc, ours
        log.info("the reference engine's process started (pid %s)", proc.pid)
        ours.send(sys.path)

    def _end(self) -> int | None:
        """Stop the worker's process (killed if it does not end at once); its exit code."""
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if conn is not None:
            conn.close()  # the worker's recv() sees EOF and returns
        if proc is None:
            return None
        try:
            return proc.wait(1.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()

    def close_if_idle(self) -> None:
        """End the worker's process once it has had no call for ``idle_s``."""
        if self._proc is None or time.monotonic() - self._last < self.idle_s:
            return
        if self._lock.acquire(blocking=False):
            try:
                self._end()
            finally:
                self._lock.release()

    def close(self) -> None:
        """End the worker's process, a call in it too (that call raises ReferenceFailed)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
        with self._lock:
            self._end()
