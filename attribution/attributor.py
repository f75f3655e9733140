"""The continuous attributor: settled traces -> rows of the attribution table, by SQL inside
ClickHouse (``attribution/sql/``): spans never travel to Python, but for a trace of thousands of
spans, too wide for the SQL's memory (``Attributor._by_reference``).

How it finds work. Every span carries ``LatscopeIngestedAt`` (when it reached the store, on the
store's clock). The attributor keeps a watermark on that time. Each pass takes the *slice* of
spans ingested after the watermark, up to ``settle_s`` ago and at most ``step_s`` wide, and the
traces with spans in it that have received none in the last ``settle_s`` (they have settled: the
request ended and nothing more came for a while). An ``INSERT ... SELECT`` attributes every
request of those traces from all their stored spans and writes one row each: the single-call
path's for the traces of the common shape, then the general one's, only when the batch has other
traces that may hold a call; another one retracts the rows whose key moved (below). A slice
holding more than ``batch_traces`` traces or ``batch_spans`` spans is cut by trace id into batches
of at most that many traces and about that many spans, so one statement's memory is bounded
whatever the backlog and whatever the traces' sizes. The cut is by trace id, not by ingest
time, because the spans table sorts by trace id within an hour: a batch of a range of ids reads
the granules of that range, where a batch of random ids (one insert's) reads every granule of the
hours it reaches, so each batch of a backlog would read all of it again.

A late span (say the client span, exported after the server's) is a new span after the watermark:
its trace is attributed again from all its spans and the new row, with a higher Version (the
trace's number of distinct spans), replaces the old one. When re-attribution moves a request to
another sorting key (a late client span changes the request's id, its start time and so its hour,
or its model), the old key gets a tombstone (IsDeleted = 1, the new Version), so no stale row
survives ``FINAL``. Re-running a slice writes the same rows with the same Version: idempotent.

Early attribution (``complete_s``, off unless set): each pass's last slice also takes the traces
of the *early window* (spans ingested since the last pass's window, after the settle bound, up
to ``complete_s`` ago) with no newer span whose span tree is complete (``_early_batch``); once such
a trace settles it is taken again only if its count of distinct spans is no longer its row's
Version (a late span, or an insert that was in flight when the early pass read). The last
slice's settled traces and the window's are cut by trace id together (``_plan``), each batch
taking the window's traces of its range, so a batch stays within ``batch_traces`` and reads its
range's granules, not all of them. After a busy pass the wait is then capped by when the newest
span is ``complete_s`` old, not settled.

Early when quiet (``early_when_quiet``, on unless early attribution is): a pass that finds ingest
paused (no span for ``poll_s``, or for less after a burst: ``cadence.pause_s``) takes an early
window up to the newest span all the same, since the CPU it costs is idle then; the slices that
reach into such a window are taken with the statements that skip the traces it attributed
(``_statements``). Where the store's only writer says how long ingest has been idle
(``ingest_idle_s``: serve's collector over the embedded store), that decides the pause instead
of the newest span's age.

Each row records in SpansIngestedAt the watermark its pass brought the attributor to, and so
tells the rows of one pass from every other's: the slice's end for its last batch, and for each
earlier batch of a cut slice a time just after the slice's start (``after_us + 1``, ``+ 2``, ...,
fewer than ``MAX_CUTS``), never one that rows of this shard may already hold (``_markers``: a
slice planned again, or the first after a restart, whose start another attributor's or the last
run's markers follow). After a restart the watermark resumes ``MAX_CUTS`` us before the largest
one, so a slice stopped between its batches is redone from its start (work after it is redone,
harmlessly), and the tombstones of the batch with the largest one are written if a stop left
them out (``_mend_moved``).

Cadence: after a pass with work it waits longer, so the next takes a bigger slice for the same
fixed cost, and between passes it looks whether ingest has paused (``attribution/cadence.py``).
A pass made once the store's only writer says ingest has paused runs with the spans table's
merges stopped (``_merges_held``): after a burst they would take a core from the pass that
attributes its last requests. They start again when it ends, or before its next batch once
ingest is busy again.

Scale-out: ``shard=(i, n)`` takes only the traces with ``cityHash64(TraceId) % n = i``, so ``n``
attributors split a store's traces with none done twice and none missed; on a cluster (spans and
attribution rows sharded by the same hash) attributor ``i`` runs against shard ``i``'s local
tables (``tables="local"``) and every read and write stays on that shard (docs/deploy.md; the
resources by id are on every node).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from prometheus_client import Counter, Gauge

from latscope.attribution.cadence import busy_wait_s, next_look_s, pause_s
from latscope.attribution.queries import TRACE_SPANS_READ_BY_RULES
from latscope.attribution.reference import Reference, ReferenceFailed, Worker
from latscope.attribution.rollups import NOW_US_SQL, Rollups
from latscope.attribution.setaside import (
    BATCH_ERRORS,
    SET_ASIDE,
    SetAsideTraces,
    set_aside_router,
)
from latscope.attribution.sql import STORED_STALL_NS, rule_keys
from latscope.attribution.statements import LOCAL_SUFFIX, MAX_CUTS, Statements
from latscope.config import (
    DEFAULT_BATCH_SPANS,
    DEFAULT_BATCH_TRACES,
    DEFAULT_MAX_TRACE_SPANS,
    DEFAULT_REACH_S,
    DEFAULT_REFERENCE_SPANS,
    MAX_BATCH_SPANS,
    MAX_BATCH_TRACES,
    Settings,
    parse_shard,
)
from latscope.metrics import REGISTRY
from latscope.parts import Parts, Poller
from latscope.storage import (
    ATTRIBUTION_TABLE,
    SPANS_TABLE,
    Store,
    StoreError,
    StoreOutOfMemory,
    StoreUnavailable,
)
from latscope.tokens import DEFAULT_STALL_NS

log = logging.getLogger(__name__)

#: A trace's stored spans (``_by_reference`` reads at most ``max_trace_spans`` of them).
_TRACE_SPAN_COUNT = f"SELECT count() FROM {SPANS_TABLE} WHERE TraceId = {{trace_id:String}}"


#: While the store's writer says it is busy (``Attributor.ingest_idle_s``), the longest wait
#: before asking it again (a question costs a lock, not a query).
WRITER_LOOK_S = 0.1

#: A quiet pass (ingest paused, early attribution off) takes its early window when it holds at
#: most this many spans per ``batch_traces`` (and ``batch_spans`` in all): past that, those
#: traces wait to settle, so a quiet pass's work beyond the settled traces stays bounded.
QUIET_EARLY_SPANS = 16


class _Early(NamedTuple):
    """A pass's early window ``(lo_us, hi_us]`` of ingest time: the first start and last end of
    its spans, and whether every one has a resource id."""

    lo_us: int
    hi_us: int
    first_ns: int
    last_ns: int
    named: bool


class _Batch(NamedTuple):
    """A batch of a slice ``(after_us, hi_us]``: its traces settled at ``settled_us`` with ids in
    ``[id_lo, id_hi)`` ('': unbounded), ``traces`` of them, their rows marked with SpansIngestedAt
    ``marker_us``."""

    after_us: int
    hi_us: int
    settled_us: int
    marker_us: int
    id_lo: str
    id_hi: str
    traces: int
    first_ns: int
    last_ns: int
    #: every span of the slice has a resource id (the single-call path carries the ids)
    named: bool = False
    #: the early window whose traces of its range of ids it takes as well (a pass's last slice)
    early: _Early | None = None


class _Quiet(NamedTuple):
    """The newest span after the watermark: how long ago it was stored (s), its ingest time
    (us), and how many spans after the watermark no pass has taken (stored after the last early
    window)."""

    age_s: float
    newest_us: int
    waiting: int


class Attributor(Poller):
    """A ``latscope.parts.Component``: attributes settled traces until stopped.

    >>> Attributor(store, settle_s=5, poll_s=1).run_until_idle()  # doctest: +SKIP
    """

    name = "attributor"

    def __init__(
        self,
        store: Store,
        *,
        settle_s: float = 5.0,
        poll_s: float = 1.0,
        batch_traces: int = DEFAULT_BATCH_TRACES,
        batch_spans: int = DEFAULT_BATCH_SPANS,
        stall_threshold_ns: int = DEFAULT_STALL_NS,
        step_s: float = 60.0,
        shard: tuple[int, int] = (0, 1),
        tables: str = "shared",
        complete_s: float | None = None,
        early_when_quiet: bool = True,
        reach_s: float = DEFAULT_REACH_S,
        max_trace_spans: int = DEFAULT_MAX_TRACE_SPANS,
        reference_spans: int = DEFAULT_REFERENCE_SPANS,
        reference: Reference | None = None,
        ingest_idle_s: Callable[[], float] | None = None,
        clock: Callable[[], float] = time.monotonic,
        store_clock_us: Callable[[], int] | None = None,
    ) -> None:
        self.store = store
        #: Runs the reference engine on the traces too wide for the SQL: in this thread unless
        #: given (``latscope serve`` gives a ``Worker``, a process of its own).
        self.reference: Reference = reference if reference is not None else Reference()
        #: The clock the waits between passes are timed on (s), and the store's (us, the clock
        #: of LatscopeIngestedAt) that settles traces: the store's own unless given. Tests give
        #: both to decide the cadence without sleeping.
        self.clock = clock
        self._store_clock_us = store_clock_us
        if not reach_s > 0:
            raise ValueError(f"reach_s must be positive, got {reach_s}")
        self.reach_ns = int(reach_s * 1e9)
        self.settle_us = int(settle_s * 1e6)
        #: Early attribution: a trace whose span tree is complete is attributed once it has gone
        #: ``complete_s`` without new spans, before it settles (None or 0: off).
        if complete_s and not 0 < complete_s < settle_s:
            raise ValueError(f"complete_s must be in (0, settle_s), got {complete_s}")
        self.complete_us = int(complete_s * 1e6) if complete_s else None
        #: With early attribution off: a pass that finds ingest paused (``cadence.pause_s``)
        #: takes the complete traces up to the newest span early all the same (the CPU it costs
        #: is idle then), so the last requests of a burst are not left to wait a settle window.
        self.early_when_quiet = early_when_quiet
        #: The store's only writer's word on how long ingest has been idle (s; 0 while it has
        #: spans to store): ``latscope serve`` over the embedded store gives its collector's
        #: (``Collector.spans_idle_s``). Ingest has paused once it is ``cadence.pause_s``, instead
        #: of once the newest stored span is that old: no pause is seen while an insert is in
        #: flight (its spans carry the time it began), and one is seen as it happens. None: the
        #: store's newest span decides (other processes may write to it).
        self.ingest_idle_s = ingest_idle_s
        #: How long ingest must be idle to have paused, by the last look's count of spans waiting.
        self._pause_s = poll_s
        #: A quiet pass stopped the spans table's merges (``_merges_held``).
        self._merges_stopped = False
        #: The end of the last early window whose traces a quiet pass attributed (ingest time,
        #: us): a slice that starts before it may hold traces attributed early, and is taken
        #: with the statements that skip those unchanged since (``_early_batch``).
        self._early_done_us: int | None = None
        #: The batches of the slice after the watermark still to do (run_until_idle).
        self._batches: list[_Batch] = []
        #: SpansIngestedAt values after the watermark that rows of this shard may hold: those
        #: found at a restart within ``MAX_CUTS`` us after where it resumes (another attributor's,
        #: or an earlier run's, rows), and every marker planned since. A batch is never given one
        #: (``_markers``), so the rows with its marker are its own (count_written).
        self._taken: set[int] = set()
        #: Where the early window of the next pass starts (ingest time, us): each pass looks at
        #: the traces with spans stored since the last one's.
        self._early_us: int | None = None
        self.step_us = max(1, int(step_s * 1e6))
        super().__init__(poll_s)
        self.idle_poll_s = poll_s
        self.busy_poll_max_s = max(poll_s, settle_s)
        if not (0 < batch_traces <= MAX_BATCH_TRACES and 0 < batch_spans <= MAX_BATCH_SPANS):
            raise ValueError(
                f"batches need 1-{MAX_BATCH_TRACES:,} traces and 1-{MAX_BATCH_SPANS:,} spans, "
                f"got {batch_traces}, {batch_spans}"
            )
        self.batch_traces = batch_traces
        self.batch_spans = batch_spans
        self.stall_threshold_ns = stall_threshold_ns
        #: A trace with at least ``reference_spans`` spans goes to the reference engine instead
        #: of the SQL's general path, as does one the SQL refuses alone for its memory, up to
        #: ``max_trace_spans`` spans (``_by_reference``): a wider one is set aside.
        if reference_spans < 1:
            raise ValueError(f"reference_spans must be at least 1, got {reference_spans}")
        self.reference_spans = reference_spans
        self.max_trace_spans = max_trace_spans
        index, count = shard
        if not (count >= 1 and 0 <= index < count):
            raise ValueError(f"shard must be I/N with 0 <= I < N, got {index}/{count}")
        self.shard = shard
        suffix = LOCAL_SUFFIX if tables == "local" else ""
        self.spans_table = SPANS_TABLE + suffix
        self.table = ATTRIBUTION_TABLE + suffix
        self.watermark_us: int | None = None
        #: When the next pass is due (s, on ``clock``); between passes the loop wakes every
        #: ``idle_poll_s`` to see whether ingest has paused.
        self._due = 0.0
        #: When to look next whether ingest has paused (s, on ``clock``; inf: at the next poll).
        self._look = math.inf
        #: The single-call path reads the token figures the collector stored with each span
        #: when they counted the stalls at this threshold (sql.STORED_STALL_NS), else it
        #: computes them from the offsets.
        self.stored_figures = stall_threshold_ns == STORED_STALL_NS
        self._sql = Statements(
            self.spans_table,
            self.table,
            shard,
            early=self.complete_us is not None,
            stored_figures=self.stored_figures,
        )
        self._retry_sql = Statements(
            self.spans_table,
            self.table,
            shard,
            early=False,
            stored_figures=self.stored_figures,
            retry=True,
        )
        #: Traces a pass failed on (ClickHouse refused the statement for them alone), by id:
        #: retried with a backoff while the others go on (``_isolate``, ``_retry``). In memory:
        #: after a restart, such a trace is attributed again when a span of it arrives.
        self.set_aside = SetAsideTraces()
        #: With early attribution off, the statements with it (built when first needed), by
        #: whether they take the Version check: with it for the slices that may hold traces a
        #: quiet pass attributed, without it for a quiet pass's batch whose slice cannot hold
        #: such traces (its settled traces are taken as in any pass).
        self._early_sql: dict[bool, Statements] = {}

    def failed(self, exc: Exception) -> None:
        BATCH_ERRORS.labels("store").inc()
        # The lag goes on growing while passes fail (the store's clock cannot be asked: this
        # one's stands in), so monitoring sees attribution stopped.
        if self.watermark_us is not None:
            LAG.set(max(0.0, time.time() - self.watermark_us / 1e6))

    def poll(self) -> None:
        """The background loop's wake-up: a pass when one is due, or before, once ingest has
        paused (no span for ``cadence.pause_s``); otherwise nothing."""
        self.reference.close_if_idle()
        self._release_merges()  # a start of the merges that failed is retried first
        if self.clock() < self._due and self.watermark_us is not None:
            idle = None if self.ingest_idle_s is None else self.ingest_idle_s()
            if idle is not None and idle < self._pause_s:
                # The writer is busy, or idle for less than a pause: no need to ask the store.
                self._look = self.clock() + min(self._pause_s - idle, WRITER_LOOK_S)
                return
            quiet = self._quiet(self._now_us())
            if not self._paused(quiet):
                self._look_after(quiet)
                return
        # A pass that fails is retried after the idle poll.
        self._due = self.clock() + self.idle_poll_s
        self._look = math.inf
        # Ingest and the API's queries first (Store.background).
        with self._merges_held(), self.store.background():
            self.run_until_idle()

    def _ingest_paused(self) -> bool:
        """Whether the store's only writer says ingest has paused (``ingest_idle_s``; False
        without its word)."""
        return self.ingest_idle_s is not None and self.ingest_idle_s() >= self._pause_s

    @contextlib.contextmanager
    def _merges_held(self) -> Iterator[None]:
        """Inside, when ingest has paused and this process owns the embedded engine that ingest
        writes to (its writer's word, ``ingest_idle_s``), the spans table's merges are stopped:
        after a burst they merge its parts at ingest's priority while the pass that attributes
        its last requests runs in the background, and would take a core from it. They start again
        when the pass ends, or before its next batch once ingest is busy again
        (``_release_merges``), so its inserts never wait on parts left unmerged."""
        if self.store.embedded and self._ingest_paused():
            self.store.command(f"SYSTEM STOP MERGES {self.spans_table}")
            self._merges_stopped = True
        try:
            yield
        finally:
            self._release_merges()

    def _release_merges(self) -> None:
        """Start the spans table's merges again if a quiet pass stopped them
        (``_merges_held``); a failure is logged and the start retried on the next poll."""
        if not self._merges_stopped:
            return
        try:
            self.store.command(f"SYSTEM START MERGES {self.spans_table}")
        except StoreError:
            log.warning("could not start the spans table's merges again; retried next poll")
            return
        self._merges_stopped = False

    def stop(self, deadline: float) -> None:
        """Stop passes (the one running ends by ``deadline``), then the reference engine's
        process, if it runs."""
        super().stop(deadline)
        self.reference.close()

    def next_wake_s(self) -> float:
        now = self.clock()
        return max(0.0, min(self.idle_poll_s, self._due - now, self._look - now))

    # -- work --------------------------------------------------------------------------------

    def _params(self, **values: Any) -> dict[str, Any]:
        return {"shard_index": self.shard[0], "shard_count": self.shard[1], **values}

    def _now_us(self) -> int:
        """Now on the store's clock (us)."""
        if self._store_clock_us is not None:
            return self._store_clock_us()
        return int(self.store.query_rows(NOW_US_SQL)[0][0])

    def _quiet(self, now_us: int) -> _Quiet | None:
        """The newest span after the watermark, seen at ``now_us`` (the store's clock); None when
        there is none."""
        assert self.watermark_us is not None
        since_us = max(self.watermark_us, self._early_us or 0)
        newest_us, pending, waiting = self.store.query_rows(
            self._sql.quiet, self._params(after_us=self.watermark_us, since_us=since_us)
        )[0]
        if not int(pending):
            return None
        return _Quiet((now_us - int(newest_us)) / 1e6, int(newest_us), int(waiting))

    def _idle_s(self, quiet: _Quiet) -> float:
        """How long ingest has been idle, with ``quiet`` the newest span after the watermark:
        by the writer's word where it gives it (``ingest_idle_s``), else that span's age."""
        return quiet.age_s if self.ingest_idle_s is None else self.ingest_idle_s()

    def _look_after(self, quiet: _Quiet | None) -> None:
        """Set the next look whether ingest has paused, after one that found ``quiet``."""
        quiet_s, waiting = (None, 0) if quiet is None else (self._idle_s(quiet), quiet.waiting)
        self._pause_s = pause_s(self.idle_poll_s, waiting)
        self._look = self.clock() + next_look_s(self.idle_poll_s, quiet_s, waiting)

    def _paused(self, quiet: _Quiet | None) -> bool:
        """Whether ingest has paused (``cadence.pause_s``)."""
        return quiet is not None and self._idle_s(quiet) >= pause_s(self.idle_poll_s, quiet.waiting)

    def _statements(self, after_us: int, early: bool) -> Statements:
        """The statements for a batch of the slice after ``after_us``: with early attribution
        when it is on, when its slice may hold traces a quiet pass attributed early, or when the
        batch takes an early window (then without the Version check when its slice holds none)."""
        if self.complete_us is not None:
            return self._sql
        # When no trace of this slice was attributed early, the Version check of its settled
        # traces would find none to skip (it cost about a tenth of a quiet pass's CPU).
        versioned = self._early_done_us is not None and after_us < self._early_done_us
        if not (early or versioned):
            return self._sql
        if versioned not in self._early_sql:
            self._early_sql[versioned] = Statements(
                self.spans_table,
                self.table,
                self.shard,
                early=True,
                versioned=versioned,
                stored_figures=self.stored_figures,
            )
        return self._early_sql[versioned]

    def _mend_moved(self, marker_us: int) -> None:
        """The tombstones of the last batch written before a restart, if they are missing.

        A process killed between a batch's rows and its tombstones left a request whose key moved
        (a late client span) with two live rows, and a restart resumes after that batch, never
        redoing it (issue 44). The tombstones statement over its rows (their marker is the
        largest, ``marker_us``) writes what is missing and nothing when none is."""
        first_ns, last_ns, rows = self.store.query_rows(
            self._sql.marked, self._params(through_us=marker_us)
        )[0]
        if not int(rows):
            return
        params = self._params(
            through_us=marker_us,
            from_ns=max(0, int(first_ns) - self.reach_ns),
            to_ns=min(int(last_ns) + self.reach_ns, 2**63 - 1),
        )
        missing = int(self.store.query_rows(self._sql.count_moved, params)[0][0])
        if missing:
            self.store.command(self._sql.tombstones, params)
            TOMBSTONES.inc(missing)
            log.warning("wrote %d tombstones a stop before them had left out", missing)

    def _markers(self, after_us: int, hi: int) -> tuple[list[int], int]:
        """The SpansIngestedAt values free for the batches of the slice ``(after_us, hi]``: for
        all but its last batch, times inside the slice, fewer than ``MAX_CUTS`` us after its
        start (a restart after one of them redoes the slice, _resume); for the last, the slice's
        end. None is taken (``_taken``): a slice planned again (after a failed batch), or the
        first slice after a restart, may otherwise give a batch the marker of rows written
        before, and count those as its own."""
        self._taken = {m for m in self._taken if m > after_us}
        free = [
            m
            for m in range(after_us + 1, after_us + min(MAX_CUTS, hi - after_us))
            if m not in self._taken
        ]
        last = hi if hi not in self._taken or not free else free.pop()
        return free, last

    def _plan(
        self,
        after_us: int,
        hi: int,
        settled_us: int,
        markers: tuple[list[int], int],
        early: _Early | None = None,
    ) -> list[_Batch]:
        """The batches of the slice ``(after_us, hi]``: its settled traces cut by trace id into
        ranges of at most ``batch_traces`` traces and about ``batch_spans`` spans (each a run of
        the spans table's sort key, so a batch reads its own share of the slice's granules
        instead of all of them). Each batch's ``first_ns`` / ``last_ns`` are the first start and
        last end of the slice's spans. ``markers``: the slice's free ones (``_markers``); those
        its batches take are taken. With the ``early`` window, the slice's settled traces and
        the window's are cut together, and each batch takes the window's traces of its range."""
        free, last = markers
        params = self._params(
            after_us=after_us,
            upto_us=hi,
            settled_us=settled_us,
            batch_traces=self.batch_traces,
            batch_spans=self.batch_spans,
            max_batches=len(free) + 1,
        )
        sql = self._sql.plan
        if early is not None:
            sql = self._sql.plan_early
            params.update(early_lo_us=early.lo_us, early_hi_us=early.hi_us)
        traces, first_ns, last_ns, cuts, starts, unnamed = self.store.query_rows(sql, params)[0]
        traces, count = int(traces), len(cuts) + 1
        if not traces:
            return []
        bounds = ["", *cuts, ""]
        firsts = [0, *(int(i) for i in starts), traces]
        taken = [*free[: count - 1], last]
        self._taken.update(taken)
        return [
            _Batch(
                after_us=after_us,
                hi_us=hi,
                settled_us=settled_us,
                marker_us=taken[j],
                id_lo=bounds[j],
                id_hi=bounds[j + 1],
                traces=firsts[j + 1] - firsts[j],
                first_ns=int(first_ns),
                last_ns=int(last_ns),
                named=not int(unnamed),
                early=early,
            )
            for j in range(count)
        ]

    def _spare_marker(self, after_us: int, hi: int) -> int | None:
        """A marker of the slice ``(after_us, hi]`` no batch has (``_markers``), for a batch cut
        from one that failed or for traces retried; None when all are taken."""
        for marker in range(after_us + 1, min(after_us + MAX_CUTS, hi)):
            if marker not in self._taken:
                self._taken.add(marker)
                return marker
        return None

    def _isolate(self, batch: _Batch, error: StoreError) -> int:
        """A batch ClickHouse refused: cut it by trace id until the traces it fails on alone
        are found and set aside; the others are attributed. Returns the rows written."""
        params = self._params(
            after_us=batch.after_us, hi_us=batch.hi_us, settled_us=batch.settled_us,
            id_lo=batch.id_lo, id_hi=batch.id_hi,
        )  # fmt: skip
        ids = [str(t) for (t,) in self.store.query_rows(self._sql.batch_ids, params)]
        log.warning("attribution of %d traces failed (%s); looking for the traces it fails on",
                    len(ids), error)  # fmt: skip
        around = (batch.first_ns - self.reach_ns, batch.last_ns + self.reach_ns)

        def run(part: list[str], id_hi: str, marker: int) -> int:
            return self._or_reference(part, around, marker, lambda: self.attribute_slice(
                batch.after_us, batch.hi_us, settled_us=batch.settled_us, around=around,
                ids=(part[0], id_hi), marker_us=marker,
            ))  # fmt: skip

        bounds: dict[str, tuple[int, int]] = dict.fromkeys(ids, around)
        if len(ids) <= 1:
            for trace_id in ids:
                try:
                    if isinstance(error, StoreOutOfMemory):
                        return self._by_reference(
                            trace_id, around, batch.marker_us, f"the SQL refused it: {error}"
                        )
                except StoreUnavailable:
                    raise
                except StoreError as exc:
                    error = exc
                self.set_aside.add(trace_id, error, around)
            SET_ASIDE.set(len(self.set_aside))
            return 0
        return self.set_aside.cut(
            [(ids, batch.id_hi)],
            error,
            run,
            bounds,
            lambda: self._spare_marker(batch.after_us, batch.hi_us),
        )

    def _retry(self, after_us: int, hi: int) -> int:
        """Attribute again the set-aside traces whose backoff is over, with a marker of the
        slice ``(after_us, hi]``; those that fail again wait longer."""
        if hi <= after_us + 1:
            return 0

        def attribute(ids: list[str], around: tuple[int, int], marker: int) -> int:
            return self._or_reference(ids, around, marker, lambda: self.attribute_slice(
                after_us, hi, settled_us=after_us, around=around, marker_us=marker, retry_ids=ids
            ))  # fmt: skip

        return self.set_aside.retry(attribute, lambda: self._spare_marker(after_us, hi))

    def _or_reference(
        self, ids: list[str], around: tuple[int, int], marker: int, sql: Callable[[], int]
    ) -> int:
        """``sql()``; when ClickHouse refuses it for its memory for one trace alone, that trace
        by the reference engine (``_by_reference``, whose StoreError says why it cannot take
        it, the refusal included)."""
        try:
            return sql()
        except StoreOutOfMemory as exc:
            if len(ids) != 1:
                raise
            return self._by_reference(ids[0], around, marker, f"the SQL refused it: {exc}")

    def _by_reference(
        self,
        trace_id: str,
        around: tuple[int, int],
        marker_us: int,
        why: str,
    ) -> int:
        """Attribute one trace too wide for the SQL (``why``: at least ``reference_spans``
        spans, or refused alone for its memory) with the reference engine, in Python: its spans
        that start within ``around``, each call's row with ``marker_us``, then the tombstones of
        the keys it moved, as a batch's. Returns the rows written; raises a StoreError for a
        trace of more than ``max_trace_spans`` spans, or one the engine fails on (saying so).

        The SQL's general path holds a trace's spans as arrays and reads them in lambdas that
        read other arrays of the trace, which ClickHouse copies for every element: its memory
        grows with the square of the trace's spans, past the engine's limit at a few thousand
        (a long agent run in one trace). The reference engine's grows with the spans, and the
        tests hold every SQL row equal to its (``tests/attribution_support.py``)."""
        lo, hi = around
        counted = int(self.store.query_rows(_TRACE_SPAN_COUNT, {"trace_id": trace_id})[0][0])
        if counted > self.max_trace_spans:
            raise StoreError(
                f"{counted:,} spans, more than the reference engine takes (--max-trace-spans "
                f"{self.max_trace_spans:,}); too wide for the SQL: {why}"
            )
        # Only the attributes the rows are worked out from: prompts stay in ClickHouse.
        stored = self.store.query_arrow(
            TRACE_SPANS_READ_BY_RULES, {"trace_id": trace_id, "keys": rule_keys()}
        )
        try:
            rows, spans = self.reference(
                stored, trace_id, around, marker_us, self.stall_threshold_ns
            )
        except ReferenceFailed as exc:  # the engine's own failure: the trace is set aside
            raise StoreError(f"the reference engine fails on it ({exc}); {why}") from exc
        if rows.num_rows:
            self.store.insert_arrow(self.table, rows)
        params = self._params(through_us=marker_us, from_ns=max(0, lo), to_ns=min(hi, 2**63 - 1))
        moved = int(self.store.query_rows(self._sql.count_moved, params)[0][0])
        if moved:
            self.store.command(self._sql.tombstones, params)
            TOMBSTONES.inc(moved)
        BY_REFERENCE.inc()
        ATTRIBUTED.inc(len(rows))
        log.info("attributed trace %s (%d spans, %d calls) with the reference engine: %s",
                 trace_id, spans, rows.num_rows, why[:200])  # fmt: skip
        return rows.num_rows

    def _any_left(self, sql: Statements, params: dict[str, Any]) -> bool:
        """Whether the batch has a trace left without a row that may hold a call."""
        superset = sql.count_left_superset
        if superset is not None and not int(self.store.query_rows(superset, params)[0][0]):
            return False
        return bool(int(self.store.query_rows(sql.count_left, params)[0][0]))

    def _resume(self) -> int:
        value = self.store.query_rows(self._sql.resume, self._params())[0][0]
        # An empty table answers the epoch: start from the beginning of the spans table. Back by
        # MAX_CUTS: a slice's batches but its last record times within that of its start.
        start = max(0, int(value or 0) - MAX_CUTS)
        if value:
            self._mend_moved(int(value))
        # The markers the first slice's batches could be given that rows of this shard hold.
        taken = self.store.query_rows(self._sql.markers, self._params(after_us=start))
        self._taken = {int(m) for (m,) in taken}
        return start

    def _early_window(self, settled_us: int, complete_us: int) -> _Early | None:
        """The early window of this pass, ``(lo, hi]`` in ingest time: from the last pass's
        (at the soonest the settle bound: what is older is settled) to ``complete_us``; with the
        first start and last end of its spans (ns), and whether each has a resource id. None
        when it holds no span of this shard, or (a quiet pass's, early attribution off) more than
        ``QUIET_EARLY_SPANS`` per batch trace or ``batch_spans`` in all."""
        lo = max(settled_us, self._early_us or settled_us)
        if lo >= complete_us:
            return None
        params = self._params(early_lo_us=lo, early_hi_us=complete_us)
        count, first_ns, last_ns, unnamed = self.store.query_rows(self._sql.early_spans, params)[0]
        if not int(count):
            self._early_us = complete_us
            return None
        if self.complete_us is None and int(count) > min(
            QUIET_EARLY_SPANS * self.batch_traces, self.batch_spans
        ):
            # Past this, the traces wait to settle (QUIET_EARLY_SPANS).
            return None
        return _Early(lo, complete_us, int(first_ns), int(last_ns), not int(unnamed))

    def _early_beyond_settled(self, at: int, upto: int, complete_us: int) -> None:
        """With the watermark ``at`` at or past the settle bound ``upto`` (resumed from rows a
        run wrote within this settle window, say with a shorter one), there is no settled slice
        to take the early window beside: the window from the watermark goes alone, in a batch of
        the empty slice at the watermark, which stays. Its marker is a free time within
        ``MAX_CUTS`` after the watermark, so a restart resumes at the watermark or before."""
        early = self._early_window(at, complete_us)
        free, _ = self._markers(at, at + MAX_CUTS)
        if early is None or not free:
            return
        self._taken.add(free[0])
        self._batches[:] = [_Batch(at, at, upto, free[0], "", "", 0, *early[2:], early=early)]

    def run_until_idle(self, *, max_batches: int = 1000) -> int:
        """Attribute every settled trace up to now (bounded batches); returns requests written."""
        started = self.clock()
        if self.watermark_us is None:
            self.watermark_us = self._resume()
        now_us = self._now_us()
        upto = now_us - self.settle_us
        complete_us = None if self.complete_us is None else now_us - self.complete_us
        if complete_us is None and self.early_when_quiet:
            # Ingest has paused: the early window runs to the newest span.
            quiet = self._quiet(now_us)
            if quiet is not None and self._paused(quiet):
                complete_us = quiet.newest_us
        written = 0
        # The current slice's batches still to do, planned once per slice (kept across passes
        # while the watermark has not moved past it).
        batches = self._batches
        if not batches and complete_us is not None and self.watermark_us >= upto:
            self._early_beyond_settled(self.watermark_us, upto, complete_us)
        for _ in range(max_batches):
            if (self.watermark_us >= upto and not batches) or (self.stopping and written):
                break
            if not batches and self.set_aside.any_due():
                written += self._retry(
                    self.watermark_us, min(upto, self.watermark_us + self.step_us)
                )
            if not batches:
                # A trace whose spans straddle the slice's end (but have all settled) is
                # attributed now from what is there and again when a slice reaches its later
                # spans.
                hi = min(upto, self.watermark_us + self.step_us)
                markers = self._markers(self.watermark_us, hi)
                # The pass's last slice also takes the complete traces of the early window.
                early = (
                    self._early_window(upto, complete_us)
                    if complete_us is not None and hi == upto
                    else None
                )
                # (A window of spans gives batches of its traces, settled traces or none.)
                batches[:] = self._plan(self.watermark_us, hi, upto, markers, early)
                if not batches:
                    self.watermark_us = hi
                    if hi < upto:  # skip the idle time to the next span, if any
                        first_us, count = self.store.query_rows(
                            self._sql.after, self._params(after_us=self.watermark_us)
                        )[0]
                        nxt = int(first_us) - 1 if int(count) else upto
                        self.watermark_us = max(hi, min(nxt, upto))
                    continue
            if self._merges_stopped and not self._ingest_paused():
                self._release_merges()  # ingest is busy again: its parts merge as it goes
            batch = batches.pop(0)
            # The early window's traces of its range of ids go with each batch of the slice.
            with_early = batch.early
            first_ns, last_ns = batch.first_ns, batch.last_ns
            if with_early is not None:  # (a batch of no traces already has the window's bounds)
                first_ns = min(with_early.first_ns, first_ns)
                last_ns = max(with_early.last_ns, last_ns)
            try:
                written += self.attribute_slice(
                    batch.after_us,
                    batch.hi_us,
                    # As planned: a batch kept from an earlier pass is the traces it was planned
                    # with, not those that settled since.
                    settled_us=batch.settled_us,
                    around=(first_ns - self.reach_ns, last_ns + self.reach_ns),
                    early=None if with_early is None else (with_early.lo_us, with_early.hi_us),
                    ids=(batch.id_lo, batch.id_hi),
                    marker_us=batch.marker_us,
                    # A batch is exactly the traces it was planned with; one with early
                    # attribution also holds the early window's.
                    traces=batch.traces if with_early is None else None,
                    # The single-call path carries resource ids when every span of the slice,
                    # and of the early window it takes, has one.
                    resource_ids=batch.named and (with_early is None or with_early.named),
                )
                if with_early is not None and not batches:
                    self._early_us = with_early.hi_us
                    self._early_done_us = with_early.hi_us
            except StoreUnavailable:
                batches.clear()  # the slice is planned again, and retried, on the next poll
                raise
            except StoreError as exc:
                # Refused (not unreachable): find the traces it fails on, set them aside, and
                # attribute the others, so one trace cannot stop attribution (issue 44).
                written += self._isolate(batch, exc)
            except Exception:
                # A batch the statement cannot process would block every later one: count it,
                # log it, and move on.
                BATCH_ERRORS.labels("skipped").inc()
                log.exception("attribution of the slice up to %d failed; skipped", batch.hi_us)
            if not batches:
                self.watermark_us = batch.hi_us
        now_us = self._now_us()
        LAG.set(max(0.0, (now_us - self.watermark_us) / 1e6))
        # When the newest traces can next be taken: once complete (early), else once settled.
        ready_s = (self.settle_us if self.complete_us is None else self.complete_us) / 1e6
        # The wait before the next pass (Poller reads poll_s after each pass, cadence.py).
        self.poll_s = self.idle_poll_s
        quiet = self._quiet(now_us)
        paused = self._paused(quiet)
        if not paused:
            # Look whether ingest paused from when it could have, not from the next pass.
            self._look_after(quiet)
        if written:
            busy_s = busy_wait_s(
                self.clock() - started,
                idle_poll_s=self.idle_poll_s,
                busy_poll_max_s=self.busy_poll_max_s,
                ready_s=ready_s,
                quiet_s=None if quiet is None else quiet.age_s,
                paused=paused,
                # A quiet pass takes spans up to the newest there was when it began: one that
                # began while ingest went on (a quick pause) leaves the spans stored since.
                early_next=self.complete_us is None
                and self.early_when_quiet
                and quiet is not None
                and (complete_us is None or quiet.newest_us > complete_us),
            )
            self.poll_s = busy_s
            log.debug(
                "attributed %d requests in %.2f s (%s); lag %.1f s; next pass in %.2f s",
                written,
                self.clock() - started,
                "with an early window" if complete_us is not None else "settled traces",
                (now_us - self.watermark_us) / 1e6,
                busy_s,
            )
        self._due = self.clock() + self.poll_s
        return written

    def attribute_slice(
        self,
        after_us: int,
        through_us: int,
        *,
        settled_us: int,
        around: tuple[int, int],
        early: tuple[int, int] | None = None,
        ids: tuple[str, str] = ("", ""),
        marker_us: int | None = None,
        traces: int | None = None,
        resource_ids: bool = False,
        retry_ids: list[str] | None = None,
    ) -> int:
        """Attribute the settled traces with spans ingested in ``(after_us, through_us]`` and
        trace ids in ``[ids[0], ids[1])`` ('': unbounded) (and, with early attribution on, the
        complete traces of the ``early`` window of ingest times) from all their spans that
        started within ``around`` (ns), and retract the keys they moved from; returns the rows
        written. ``marker_us`` (default ``through_us``), recorded as SpansIngestedAt, tells this
        pass's rows from every other pass's. ``traces``, when known, is how many traces that
        batch holds. ``resource_ids``: the slice's spans all have resource ids (``_plan``), and
        the single-call path carries them instead of the resources' attributes. ``retry_ids``:
        these traces instead (set aside by an earlier pass, ``_retry``).

        A trace left for the general path with at least ``reference_spans`` spans within
        ``around`` is left out of it and attributed by the reference engine after, with the
        same marker (``_by_reference``); one that fails there is set aside alone."""
        params = self._params(
            after_us=after_us,
            hi_us=through_us,
            through_us=through_us if marker_us is None else marker_us,
            id_lo=ids[0],
            id_hi=ids[1],
            settled_us=settled_us,
            from_ns=max(0, around[0]),
            to_ns=min(around[1], 2**63 - 1),
            stall_ns=self.stall_threshold_ns,
            skip_ids=[],
            reference_spans=self.reference_spans,
        )
        sql = self._statements(after_us, early is not None)
        if retry_ids is not None:
            sql = self._retry_sql
            params["retry_ids"] = retry_ids
        if sql.early:
            # No early window: an empty one at the settled bound (whose newer spans are few).
            params["early_lo_us"], params["early_hi_us"] = early or (settled_us, settled_us)
        # Traces of the common single-call shape first (a cheap statement); the general one runs
        # only when some trace of the batch got no row from it and may hold a call. The simple
        # path writes one row per trace it answers: a row for every trace means none is left.
        self.store.command(sql.insert_simple_ids if resource_ids else sql.insert_simple, params)
        written, with_row, older = self.store.query_rows(sql.count_simple, params)[0]
        wide: list[tuple[str, int]] = []
        if (traces is None or int(with_row) < traces) and self._any_left(sql, params):
            wide = [(str(t), int(n)) for t, n in self.store.query_rows(sql.wide_left, params)]
            params["skip_ids"] = [trace_id for trace_id, _ in wide]
            # Not for a batch whose traces left are all wide: the general statement costs over
            # a CPU second on no trace at all (docs/benchmarks.md, "The statements' fixed cost").
            if not wide or int(self.store.query_rows(sql.count_left, params)[0][0]):
                self.store.command(sql.insert, params)
                written, _, older = self.store.query_rows(sql.count_written, params)[0]
        # Only a trace attributed before can have a row whose key moved: most passes have none,
        # and skip the comparison.
        if older:
            tombstones = int(self.store.query_rows(sql.count_moved, params)[0][0])
            if tombstones:
                self.store.command(sql.tombstones, params)
                TOMBSTONES.inc(tombstones)
        ATTRIBUTED.inc(int(written))
        return int(written) + self._wide(wide, around, params["through_us"])

    def _wide(self, wide: list[tuple[str, int]], around: tuple[int, int], marker_us: int) -> int:
        """Traces too wide for the general path, with their spans: by the reference engine,
        each with ``marker_us``; one it cannot take is set aside, saying why. Returns the rows
        written."""
        written = 0
        for trace_id, spans in wide:
            why = f"{spans:,} spans, at least --attribution-reference-spans"
            try:
                written += self._by_reference(trace_id, around, marker_us, why)
            except StoreUnavailable:
                raise
            except StoreError as exc:
                self.set_aside.add(trace_id, exc, around)
                SET_ASIDE.set(len(self.set_aside))
        return written


ATTRIBUTED = Counter(
    "latscope_attributed_requests",
    "Requests attributed (rows written to the attribution table), re-attributions included",
    registry=REGISTRY,
)
TOMBSTONES = Counter(
    "latscope_attribution_tombstones",
    "Rows retracted because re-attribution moved a request to another key",
    registry=REGISTRY,
)
BY_REFERENCE = Counter(
    "latscope_attribution_by_reference_traces",
    "Traces too wide for the SQL (--attribution-reference-spans, or refused alone for its "
    "memory) attributed by the reference engine in Python instead",
    registry=REGISTRY,
)
LAG = Gauge(
    "latscope_attribution_lag_seconds",
    "Store time minus the attributor's watermark (includes the settle window)",
    registry=REGISTRY,
)


def attributor_parts(
    settings: Settings, store: Store, ingest_idle_s: Callable[[], float] | None = None
) -> Parts:
    """The attributor as a background component of ``latscope serve`` / ``collector``, with the
    rollup builder beside it: the process that writes attribution rows keeps their hourly
    rollups fresh (latscope.attribution.rollups), and ``GET /v1/attribution/set-aside``.
    ``ingest_idle_s``: the store's only writer's idle time (``Attributor.ingest_idle_s``)."""
    attributor = Attributor(
        store,
        settle_s=settings.attribution_settle_s,
        complete_s=settings.attribution_complete_s,
        early_when_quiet=settings.attribution_early_when_quiet == "on",
        reach_s=settings.attribution_reach_s,
        max_trace_spans=settings.max_trace_spans,
        reference_spans=settings.attribution_reference_spans,
        poll_s=settings.attribution_poll_s,
        batch_traces=settings.attribution_batch_traces,
        batch_spans=settings.attribution_batch_spans,
        stall_threshold_ns=int(settings.stall_threshold_ms * 1e6),
        shard=parse_shard(settings.attributor_shard),
        tables=settings.attributor_tables,
        reference=Worker() if settings.attribution_reference_process == "on" else None,
        ingest_idle_s=ingest_idle_s,
    )
    return Parts(
        components=[attributor, Rollups(store)],
        http_routers=[set_aside_router(attributor.set_aside, settings.token)],
    )
