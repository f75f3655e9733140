"""Bounded queue -> columnar batches -> ClickHouse, with the spool for what it has not taken.

Receivers ``submit`` rows and wait on the returned ``Ticket``; it resolves once the rows are
durable, and only then is the Export acknowledged. Two writers:

* ``JournalWriter`` (spans): each Export's serialized bytes are appended to a journal segment in
  the spool and fsync'd (group commit: every Export that arrived during one fsync shares the
  next); the decoded rows wait in memory, and a segment becomes one ClickHouse insert when it
  holds ``batch_rows`` rows or its oldest rows have waited ``batch_timeout_s`` (and no closed
  segment still waits for the insert thread: meanwhile it grows into a larger insert). Under load an
  Export is acknowledged once journaled, so insert size no longer depends on how many Exports
  clients keep in flight (16 SDKs sending 448 spans each made 3,500-row parts, which ClickHouse
  then spent more CPU merging than inserting). When nothing else arrives within
  ``QUIET_GRACE_S`` of an Export being journaled, the segment is inserted at once and the
  acknowledgement waits for it: a quiet collector's clients can read what they sent as soon as
  it is acknowledged.
* ``BatchWriter`` (metrics): one thread flushes a batch when it holds ``batch_rows`` rows, when
  its oldest rows have waited ``batch_timeout_s``, or as soon as no other request is being
  mapped (group commit); the batch is inserted, or fsync'd in the spool, before the Export is
  acknowledged.

Every batch has an ``insert_deduplication_token`` it keeps for life (a journal segment's is in
its name), so a replay of a spooled batch that had in fact reached ClickHouse stores nothing
twice (the table's deduplication window drops it). Order: spooled batches are replayed oldest
first and new ones wait behind them, so ClickHouse sees batches in the order they were
acknowledged.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass

import pyarrow as pa

from latscope.collector import telemetry
from latscope.collector.mapping import (
    RESOURCE_ID,
    Limits,
    combine,
    insert_slices,
    resource_ids,
    resource_rows,
    table_bytes,
)
from latscope.collector.memory import MemoryLimit, return_freed_heap
from latscope.collector.spool import Segment, Spool, SpoolEntry, SpoolError
from latscope.storage import (
    RESOURCE_REFRESH_S,
    RESOURCES_TABLE,
    Store,
    StoreError,
    StoreUnavailable,
)

log = logging.getLogger(__name__)

#: A resource's row is written again once this process wrote it this long ago (half the refresh
#: the attributor counts on: a row is never older than RESOURCE_REFRESH_S before a span naming it).
REWRITE_S = RESOURCE_REFRESH_S / 2
#: The most resource ids remembered before the ones due again are forgotten.
MAX_RESOURCES = 65_536


class _Throttled:
    """A log line that repeats at most once per ``every_s``, saying how many were held back.

    A full spool disk fails every journal write; logging each (thousands a second) would fill
    the log disk next. The condition is also visible in the metrics (refused, spool bytes).
    """

    def __init__(self, level: int, every_s: float = 10.0) -> None:
        self.level = level
        self.every_s = every_s
        self._next = 0.0
        self._held = 0
        self._lock = threading.Lock()

    def log(self, message: str, *args: object) -> None:
        now = time.monotonic()
        with self._lock:
            if now < self._next:
                self._held += 1
                return
            held, self._held = self._held, 0
            self._next = now + self.every_s
        if held:
            message += f" ({held} more like it in the last {self.every_s:.0f} s)"
        log.log(self.level, message, *args)


#: Before a journaled Export is taken for a quiet collector's (inserted at once, acknowledged
#: once inserted), how long the journal thread waits for another to arrive. Clients that each
#: wait for their acknowledgement before sending again arrive a few milliseconds apart under
#: steady load (16 senders at 100,000 spans a second: 4.5 ms on average): without the wait, a
#: moment with nothing in flight made most of their Exports quiet ones, inserts of a few
#: thousand spans (docs/benchmarks.md, "Collector"). A client alone never sends during its own
#: wait, so it still reads what it sent as soon as it is acknowledged.
QUIET_GRACE_S = 0.005
#: ClickHouse error codes of an insert refused for a reason in its rows, not in the server or
#: its state: CANNOT_PARSE_TEXT, CANNOT_PARSE_INPUT_ASSERTION_FAILED, CANNOT_PARSE_DATE,
#: CANNOT_PARSE_DATETIME, TYPE_MISMATCH, ARGUMENT_OUT_OF_BOUND, CANNOT_CONVERT_TYPE,
#: CANNOT_PARSE_NUMBER, INCORRECT_DATA, TOO_LARGE_STRING_SIZE, SIZES_OF_ARRAYS_DONT_MATCH,
#: VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE, CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN, and
#: VIOLATED_CONSTRAINT (a CHECK an operator put on the table).
_DATA_CODES = frozenset({6, 27, 38, 41, 53, 69, 70, 72, 117, 131, 190, 321, 349, 469})
_CODE = re.compile(r"Code: (\d+)\.")


def in_the_data(error: StoreError) -> bool:
    """Whether ClickHouse refused an insert for a reason in its rows (a value it cannot
    convert; rows on more days than it takes in one insert), which a smaller insert avoids.
    TOO_MANY_PARTS is that only for the partitions of one insert: for a partition with too many
    parts (merges behind), it is backpressure, and the insert is retried whole."""
    text = str(error)
    match = _CODE.search(text)
    if match is None:
        return False
    code = int(match.group(1))
    return code in _DATA_CODES or (code == 252 and "partitions" in text.lower())


class Refused(Exception):
    """The collector cannot take this data now; the client should retry after ``retry_after_s``.

    ``exhausted`` is True for backpressure (queue or spool full: gRPC RESOURCE_EXHAUSTED,
    HTTP 429) and False when the collector is shutting down (UNAVAILABLE, HTTP 503).
    """

    def __init__(self, message: str, *, exhausted: bool, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.exhausted = exhausted
        self.retry_after_s = retry_after_s


class Ticket:
    """Resolves when a submitted table is durable (or refused)."""

    __slots__ = ("_done", "error", "rows")

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self._done = threading.Event()
        self.error: Refused | None = None

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def resolve(self, error: Refused | None = None) -> None:
        self.error = error
        self._done.set()

    def wait(self, timeout: float | None = None) -> None:
        """Block until durable; raises ``Refused`` when it was not stored or not in time."""
        if not self._done.wait(timeout):
            raise Refused("storing the batch took too long; retry", exhausted=False)
        if self.error is not None:
            raise self.error


class _Arrival:
    __slots__ = ("writer",)

    def __init__(self, writer: _StoreWriter) -> None:
        self.writer = writer

    def __enter__(self) -> None:
        self.writer._arrive(1)

    def __exit__(self, *exc: object) -> None:
        self.writer._arrive(-1)


@dataclass(frozen=True)
class WriterConfig:
    """Batching, queue and retry limits of one ``BatchWriter``."""

    #: rows waiting in memory before ``submit`` refuses more
    max_queue_rows: int = 200_000
    #: flush when a batch holds this many rows (a busy collector's parts: ClickHouse merged
    #: parts of 20,000 spans for about twice the CPU, ``bench.ingest.run`` variant batch-20k) ...
    batch_rows: int = 40_000
    #: ... or when its oldest rows have waited this long
    batch_timeout_s: float = 0.2
    #: after a failed insert, spool without trying ClickHouse for this long
    retry_backoff_s: float = 1.0
    #: a spooled batch ClickHouse keeps rejecting (not merely unreachable) is set aside after this
    #: many attempts so it cannot block everything behind it
    max_replay_attempts: int = 20
    #: a journal segment also closes once its decoded rows hold this many bytes (large spans):
    #: a segment is what is read back from the spool at once, and what one insert sends
    batch_bytes: int = 64 << 20
    #: an insert sends at most about this many bytes with dictionaries expanded (what it costs
    #: ClickHouse, about five times this at its peak: ``bench/memory``); a larger segment goes in
    #: as several inserts, each with its own token
    insert_bytes: int = 32 << 20
    #: an inserted journal segment is kept until ClickHouse has synced its parts to disk, which
    #: it is asked to do (SYSTEM SYNC FILE CACHE) at most this often, and soon after it idles
    sync_every_s: float = 1.0
    #: after a segment's inserts while the collector holds at least half its memory limit, the
    #: allocators return the pages they freed (the embedded engine's, SYSTEM JEMALLOC PURGE,
    #: and the C heap's, ``memory.return_freed_heap``): else they keep them, and under
    #: prompt-sized spans they were the largest part of the process's memory past its bound
    purge_after_insert: bool = True


class _StoreWriter:
    """What both writers share: one table, its spool, inserts with a backoff after a failure,
    and setting aside a spooled batch ClickHouse keeps rejecting."""

    def __init__(
        self, store: Store, table: str, spool: Spool, config: WriterConfig, *, signal: str
    ) -> None:
        self.name = f"collector-writer-{signal}"
        self.store = store
        self.table = table
        self.spool = spool
        self.config = config
        self.signal = signal
        self._cond = threading.Condition()
        self._stopping = False
        self._arriving = 0
        self._in_grace = False
        self._retry_at = 0.0
        self._failures: dict[int, int] = {}
        self._depth = telemetry.QUEUE_DEPTH.labels(signal)
        self._spool_bytes = telemetry.SPOOL_BYTES.labels(signal)
        self._spool_bytes.set(spool.bytes)
        self._write_failed = _Throttled(logging.ERROR)
        self._quarantined = _Throttled(logging.ERROR)
        self._purge_works = True

    def arriving(self) -> _Arrival:
        """Context for a request being decoded: the writer treats the collector as busy while
        rows are on their way (group commit), so an idle collector answers without waiting for
        ``batch_timeout_s`` and a busy one still fills large batches.
        """
        return _Arrival(self)

    def _arrive(self, delta: int) -> None:
        with self._cond:
            self._arriving += delta
            if not self._arriving or (delta > 0 and self._in_grace):
                self._cond.notify_all()

    def _insert(self, table: pa.Table, token: str, *, split_any: bool = False) -> bool:
        """Insert a batch; False (and a backoff) when the store did not take it.

        A batch ClickHouse refuses for a reason in its rows (``in_the_data``; any refusal with
        ``split_any``) is split in two, by time, and each half inserted alone, down to single
        rows: what can be inserted is, each piece with a token derived from the batch's (the
        same pieces and tokens on a replay), and a row refused alone goes to the quarantine
        with the reason (issue 44: one sender's spans on 150 days, past ClickHouse's 100
        partitions per insert, once failed a segment holding every other sender's spans).
        """
        work = [(table, token)]
        while work:
            part, tok = work.pop()
            started = time.perf_counter()
            try:
                self.store.insert_arrow(self.table, part, dedup_token=tok)
            except StoreError as exc:
                if isinstance(exc, StoreUnavailable) or not (split_any or in_the_data(exc)):
                    self._retry_at = time.monotonic() + self.config.retry_backoff_s
                    level = logging.WARNING if isinstance(exc, StoreUnavailable) else logging.ERROR
                    log.log(level, "%s: insert of %d rows failed: %s", self.name, part.num_rows,
                            exc)  # fmt: skip
                    return False
                if part.num_rows == 1:
                    self._quarantine(part, tok, str(exc))
                    continue
                if part is table:
                    log.warning("%s: ClickHouse refused %d rows for a reason in them; inserting "
                                "them in parts to set aside only the rows it refuses: %s",
                                self.name, part.num_rows, exc)  # fmt: skip
                if "Timestamp" in part.column_names:
                    part = part.sort_by("Timestamp")
                half = part.num_rows // 2
                work += [(part.slice(half), f"{tok}-b"), (part.slice(0, half), f"{tok}-a")]
                continue
            telemetry.WRITE_SECONDS.labels(self.signal).observe(time.perf_counter() - started)
        return True

    def _quarantine(self, row: pa.Table, token: str, reason: str) -> None:
        """Keep a row ClickHouse refuses alone, with the reason, for an operator to replay."""
        try:
            path = self.spool.quarantine_rows(self.table, token, row, reason)
        except OSError as exc:
            telemetry.DROPPED.labels(self.signal).inc(row.num_rows)
            log.error("%s: cannot quarantine a row ClickHouse refused (%s); lost: %s",
                      self.name, reason, exc)  # fmt: skip
            return
        telemetry.QUARANTINED.labels(self.signal).inc(row.num_rows)
        self._quarantined.log("%s: ClickHouse refused a row alone; kept in %s (latscope "
                              "quarantine list): %s", self.name, path, reason)  # fmt: skip

    def _insert_sliced(
        self, table: pa.Table, token: str, *, split_any: bool = False, size: int | None = None
    ) -> bool:
        """Insert a segment's rows in slices of at most ``insert_bytes`` expanded bytes: what
        ClickHouse holds for one insert stays bounded whatever the spans or resources carry.
        ``size``: the rows' expanded bytes, when known (``insert_slices``).

        A lone slice keeps the segment's token; several get ``<token>-<i>``. The cut depends on
        the rows alone, so a replay after a failure midway sends the same slices with the same
        tokens, and ClickHouse drops the ones it already has.
        """
        slices = insert_slices(table, self.config.insert_bytes, size)
        for i, part in enumerate(slices):
            tok = token if len(slices) == 1 else f"{token}-{i}"
            # One contiguous chunk per column, a slice at a time (so one slice is copied at
            # once): ClickHouse takes it several times faster than many.
            with self._holding(2 * table_bytes(part)):  # the copy, and what the insert expands
                if not self._insert(self._prepare(combine(part)), tok, split_any=split_any):
                    return False
        self._purge()
        return True

    def _purge(self) -> None:
        """While memory is pressed (``purge_after_insert``), the allocators return the pages
        freed since: the embedded engine's (its jemalloc) and the process's C heap (glibc's,
        ``memory.return_freed_heap``), both the process's own, which latscope's memory bound
        counts. Never a ClickHouse server's, whose memory is its own to manage."""
        if not (self.config.purge_after_insert and self._pressed()):
            return
        if self.store.embedded and self._purge_works:
            try:
                self.store.command("SYSTEM JEMALLOC PURGE")
            except StoreError as exc:
                # An engine built without jemalloc: nothing to purge, not asked again.
                self._purge_works = False
                log.info("%s: no allocator to purge after inserts (%s)", self.name, exc)
        return_freed_heap()

    def _holding(self, nbytes: int) -> contextlib.AbstractContextManager[None]:
        """Count memory an insert needs against the collector's limit while it runs."""
        return contextlib.nullcontext()

    def _pressed(self) -> bool:
        """The collector holds at least half its memory limit."""
        return False

    def _prepare(self, part: pa.Table) -> pa.Table:
        """A slice as it is inserted (after the cut, which depends on the decoded rows alone)."""
        return part

    def _count_failure(self, entry: SpoolEntry, table: pa.Table) -> bool:
        """After a failed insert of a spooled batch: True when, rejected (not merely
        unreachable) ``max_replay_attempts`` times, it was inserted in parts at last, the rows
        refused alone set aside in the quarantine (so it blocks nothing behind it)."""
        # Only rejections count: an unreachable store may stay down for days without loss.
        if not self._store_reachable():
            return False
        self._failures[entry.seq] = self._failures.get(entry.seq, 0) + 1
        if self._failures[entry.seq] < self.config.max_replay_attempts:
            return False
        log.error("%s: ClickHouse keeps rejecting spooled batch %s; inserting it in parts",
                  self.name, entry.path.name)  # fmt: skip
        return self._insert_sliced(table, entry.token, split_any=True)

    def _store_reachable(self) -> bool:
        return self.store.ping()

    def _lose(self, entry: SpoolEntry, why: str, *, rows: int) -> None:
        target = self.spool.quarantine(entry)
        self._failures.pop(entry.seq, None)
        self._spool_bytes.set(self.spool.bytes)
        telemetry.DROPPED.labels(self.signal).inc(rows)
        log.error("%s: spooled batch set aside as %s (%s); %d rows not stored", self.name, target,
                  why, rows)  # fmt: skip


class BatchWriter(_StoreWriter):
    """Writes one table's rows to the store in batches; a ``Component`` of the process."""

    def __init__(
        self, store: Store, table: str, spool: Spool, config: WriterConfig, *, signal: str
    ) -> None:
        super().__init__(store, table, spool, config, signal=signal)
        self._queue: deque[tuple[float, pa.Table, Ticket]] = deque()
        self._queued_rows = 0
        self._thread: threading.Thread | None = None

    # -- intake --------------------------------------------------------------------------------

    def submit(self, table: pa.Table) -> Ticket:
        """Queue rows for writing; raises ``Refused`` when the queue is full or stopping."""
        ticket = Ticket(table.num_rows)
        with self._cond:
            if self._stopping:
                raise Refused("the collector is shutting down", exhausted=False)
            # One Export larger than the whole queue still goes in when the queue is empty,
            # otherwise it could never be stored.
            if self._queue and self._queued_rows + table.num_rows > self.config.max_queue_rows:
                raise Refused(
                    f"ingest queue full ({self._queued_rows} rows waiting); retry later",
                    exhausted=True,
                    retry_after_s=max(1.0, self.config.batch_timeout_s),
                )
            self._queue.append((time.monotonic(), table, ticket))
            self._queued_rows += table.num_rows
            self._depth.set(self._queued_rows)
            self._cond.notify()
        return ticket

    # -- component -----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def close_intake(self) -> None:
        """Refuse new rows from now on (UNAVAILABLE / 503); queued rows are still written."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def stop(self, deadline: float) -> None:
        """Stop intake and drain: insert or spool every queued row before ``deadline``."""
        self.close_intake()
        if self._thread is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()))
            if self._thread.is_alive():
                # An insert is hanging: spool what is still queued so nothing acknowledged is
                # lost and nothing waiting is left unanswered.
                log.warning("%s: store too slow at shutdown; spooling the queue", self.name)
                self._spool_queue()
        self.spool.close()

    def _spool_queue(self) -> None:
        with self._cond:
            items = list(self._queue)
            self._queue.clear()
            self._queued_rows = 0
            self._depth.set(0)
        if items:
            self._to_spool(pa.concat_tables([t for _, t, _ in items]), uuid.uuid4().hex, items)

    # -- the writer thread ---------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            items = self._next_batch()
            if items is None:
                break
            try:
                if items:
                    self._write(items)
                elif len(self.spool):
                    self._replay()
            except Exception:
                # A bug here must not wedge the writer: refuse this batch (it was never
                # acknowledged, so the clients retry it) and keep serving.
                log.exception("%s: unexpected error writing a batch", self.name)
                self._retry_at = time.monotonic() + self.config.retry_backoff_s
                error = Refused("internal error storing the batch; retry", exhausted=False)
                for _, _, ticket in items or ():
                    if not ticket.done:
                        ticket.resolve(error)
        # Drained: one last replay attempt so a clean shutdown leaves as little spooled as can be.
        if len(self.spool) and time.monotonic() >= self._retry_at:
            self._replay()

    def _next_batch(self) -> list[tuple[float, pa.Table, Ticket]] | None:
        """The next batch to write; [] means "idle, try the spool"; None means stop."""
        cfg = self.config
        with self._cond:
            while not self._queue:
                if self._stopping:
                    return None
                if len(self.spool):
                    wait = max(0.05, self._retry_at - time.monotonic())
                    if not self._cond.wait(min(wait, cfg.retry_backoff_s)) and not self._queue:
                        return []
                else:
                    self._cond.wait()
            while not self._stopping and self._queued_rows < cfg.batch_rows and self._arriving:
                left = self._queue[0][0] + cfg.batch_timeout_s - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            items: list[tuple[float, pa.Table, Ticket]] = []
            rows = 0
            while self._queue and (
                not items or rows + self._queue[0][1].num_rows <= cfg.batch_rows
            ):
                item = self._queue.popleft()
                items.append(item)
                rows += item[1].num_rows
            self._queued_rows -= rows
            self._depth.set(self._queued_rows)
            return items

    def _write(self, items: list[tuple[float, pa.Table, Ticket]]) -> None:
        # One contiguous chunk per column: ClickHouse takes it several times faster than many.
        table = pa.concat_tables([t for _, t, _ in items]).combine_chunks()
        token = uuid.uuid4().hex
        if len(self.spool) and time.monotonic() >= self._retry_at:
            self._replay()
        if (
            not len(self.spool)
            and time.monotonic() >= self._retry_at
            and self._insert(table, token)
        ):
            telemetry.ACCEPTED.labels(self.signal).inc(table.num_rows)
            for _, _, ticket in items:
                ticket.resolve()
            return
        self._to_spool(table, token, items)

    def _to_spool(self, table: pa.Table, token: str, items: list) -> None:
        try:
            stored = self.spool.append(token, table)
        except OSError as exc:
            self._write_failed.log("%s: cannot write the spool: %s", self.name, exc)
            stored = False
        if stored:
            self._spool_bytes.set(self.spool.bytes)
            telemetry.SPOOLED.labels(self.signal).inc(table.num_rows)
            telemetry.ACCEPTED.labels(self.signal).inc(table.num_rows)
            for _, _, ticket in items:
                ticket.resolve()
            return
        telemetry.REFUSED.labels(self.signal).inc(table.num_rows)
        error = Refused(
            "ClickHouse is unavailable and the spool is full; retry later",
            exhausted=True,
            retry_after_s=max(1.0, self.config.retry_backoff_s),
        )
        for _, _, ticket in items:
            ticket.resolve(error)

    def _replay(self) -> None:
        """Insert spooled batches oldest first with their original tokens; stop at a failure."""
        for entry in self.spool.entries():
            try:
                table = self.spool.read(entry)
            except SpoolError as exc:
                self._lose(entry, str(exc), rows=entry.rows)
                continue
            if not self._insert(table, entry.token) and not self._count_failure(entry, table):
                return
            self.spool.remove(entry)
            self._failures.pop(entry.seq, None)
            self._spool_bytes.set(self.spool.bytes)
            telemetry.REPLAYED.labels(self.signal).inc(table.num_rows)
            log.info("%s: replayed %d spooled rows", self.name, table.num_rows)


class JournalWriter(_StoreWriter):
    """Writes the spans table through a journal in the spool; a ``Component`` of the process.

    ``submit`` takes the decoded rows and the Export's serialized bytes; the ticket resolves
    once the bytes are fsync'd. Two threads: the journal thread appends and fsyncs, the insert
    thread inserts closed segments oldest first (from memory, or read back from the spool after
    a failure or a restart).
    """

    def __init__(
        self,
        store: Store,
        table: str,
        spool: Spool,
        config: WriterConfig,
        *,
        signal: str,
        limits: Limits,
        memory: MemoryLimit | None = None,
    ) -> None:
        super().__init__(store, table, spool, config, signal=signal)
        self.limits = limits
        # Decoded rows count against the collector's memory limit from submit until they leave
        # memory (inserted, or dropped to wait in the spool); by table, as submitted.
        self.memory = memory
        self._held: dict[int, int] = {}
        # Their expanded bytes, as the decoder counted them (mapping.DecodedSpans.expanded): a
        # segment in memory is sliced without a pass over its rows.
        self._expanded: dict[int, int] = {}
        self._segment_bytes = 0
        self._pending: list[tuple[bytes, pa.Table, Ticket]] = []
        self._pending_rows = 0
        # Rows acknowledged and still in memory: the open segment's and closed segments' whose
        # insert has not happened yet (dropped, and read back later, when ClickHouse fails).
        self._memory: dict[int, list[pa.Table]] = {}
        self._memory_rows = 0
        # Tickets acknowledged when their segment's insert is done (a quiet collector's).
        self._waiting: dict[int, list[Ticket]] = {}
        self._segment: Segment | None = None
        self._segment_tables: list[pa.Table] = []
        self._segment_since = 0.0
        self._journaling = False  # a batch taken from _pending is being written
        self._journal_done = False
        self._halted = False  # stop() gave up waiting: the spool belongs to the next start
        self._threads: list[threading.Thread] = []
        # Segments inserted into ClickHouse whose parts may not be on disk yet (ClickHouse does
        # not fsync new parts by default): kept in the spool until a sync, so an acknowledged
        # Export survives a power failure too. (inserted at, entry), oldest first.
        self._unsynced: list[tuple[float, SpoolEntry]] = []
        self._sync_works = True
        # Resource ids whose row in latscope_resources this process wrote, and when (monotonic).
        self._resources: dict[int, float] = {}
        self._resources_failed = _Throttled(logging.WARNING)

    # -- resources -----------------------------------------------------------------------------

    def _prepare(self, part: pa.Table) -> pa.Table:
        """The slice with each span's resource id (``LatscopeResourceId``), the ids' attributes
        written to ``latscope_resources`` first where this process has not written them within
        half of ``RESOURCE_REFRESH_S`` (deploy/clickhouse/012_resource_ids.sql)."""
        if "ResourceAttributes" not in part.column_names or RESOURCE_ID in part.column_names:
            return part
        ids, found = resource_ids(part.column("ResourceAttributes"))
        now = time.monotonic()
        due = [rid for rid in found if now - self._resources.get(rid, -math.inf) >= REWRITE_S]
        if due:
            try:
                self.store.insert_arrow(RESOURCES_TABLE, resource_rows(found, due))
            except StoreError as exc:
                # Nothing depends on the row: the attributor reads a request whose resource it
                # does not find from the spans. Tried again with the next batch.
                self._resources_failed.log(
                    "%s: writing %d resources failed: %s", self.name, len(due), exc
                )
            else:
                if len(self._resources) > MAX_RESOURCES:
                    self._resources = {
                        r: t for r, t in self._resources.items() if now - t < REWRITE_S
                    }
                self._resources.update(dict.fromkeys(due, now))
        return part.append_column(RESOURCE_ID, ids)

    # -- intake --------------------------------------------------------------------------------

    def submit(
        self, table: pa.Table, raw: bytes, *, held: int = 0, expanded: int | None = None
    ) -> Ticket:
        """Journal an Export (``raw``) whose rows are ``table``; raises ``Refused`` when full.

        ``held``: the bytes ``table`` holds against the memory limit; once submitted, the
        writer releases them when the rows leave memory. ``expanded``: ``table``'s
        ``expanded_bytes``, when the decoder counted it.
        """
        rows = table.num_rows
        ticket = Ticket(rows)
        with self._cond:
            if self._stopping:
                raise Refused("the collector is shutting down", exhausted=False)
            waiting = self._memory_rows + self._pending_rows
            # One Export larger than the whole queue still goes in when nothing is held.
            if waiting and waiting + rows > self.config.max_queue_rows:
                raise Refused(
                    f"ingest queue full ({waiting} rows waiting for ClickHouse); retry later",
                    exhausted=True,
                    retry_after_s=max(1.0, self.config.batch_timeout_s),
                )
            self._pending.append((raw, table, ticket))
            self._held[id(table)] = held
            if expanded is not None:
                self._expanded[id(table)] = expanded
            self._pending_rows += rows
            self._depth.set(self._memory_rows + self._pending_rows)
            self._cond.notify_all()
        return ticket

    def check_room(self) -> None:
        """Raise the ``Refused`` a ``submit`` would raise now whatever its size (stopping, or the
        queue already full), so an Export is refused before it is decoded."""
        with self._cond:
            if self._stopping:
                raise Refused("the collector is shutting down", exhausted=False)
            waiting = self._memory_rows + self._pending_rows
            if waiting >= self.config.max_queue_rows:
                raise Refused(
                    f"ingest queue full ({waiting} rows waiting for ClickHouse); retry later",
                    exhausted=True,
                    retry_after_s=max(1.0, self.config.batch_timeout_s),
                )

    def drained(self) -> bool:
        """Whether everything acknowledged is in ClickHouse (nothing pending, open or spooled)."""
        with self._cond:
            return (
                not self._pending
                and not self._journaling
                and self._segment is None
                and not len(self.spool)
            )

    # -- component -----------------------------------------------------------------------------

    def start(self) -> None:
        for target, suffix in ((self._journal_loop, "journal"), (self._insert_loop, "insert")):
            thread = threading.Thread(target=target, name=f"{self.name}-{suffix}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def close_intake(self) -> None:
        """Refuse new Exports from now on (UNAVAILABLE / 503); journaled ones are still inserted."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def stop(self, deadline: float) -> None:
        """Stop intake, journal what was submitted, insert what time allows before ``deadline``.

        Whatever is not inserted by then is already in the spool: the next start replays it.
        """
        self.close_intake()
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._cond:
            self._halted = True
            waiting = [t for tickets in self._waiting.values() for t in tickets]
            self._waiting.clear()
            self._cond.notify_all()
        for ticket in waiting:
            ticket.resolve()  # journaled: durable in the spool
        if not any(thread.is_alive() for thread in self._threads):
            self._sync_inserted(force=True)
        if any(thread.is_alive() for thread in self._threads):
            log.warning("%s: store too slow at shutdown; %d batches stay spooled for the next "
                        "start", self.name, len(self.spool))  # fmt: skip
        self.spool.close()

    # -- the journal thread --------------------------------------------------------------------

    def _journal_loop(self) -> None:
        cfg = self.config
        while True:
            with self._cond:
                while not self._pending and not self._stopping:
                    if self._segment is None:
                        self._cond.wait()
                        continue
                    left = self._segment_since + cfg.batch_timeout_s - time.monotonic()
                    if left <= 0:
                        if not self._inserts_waiting():
                            break
                        self._cond.wait()  # until an insert is done, or Exports arrive
                        continue
                    self._cond.wait(left)
                # Everything that arrived while the last fsync ran shares the next one.
                batch, self._pending = self._pending, []
                rows = self._pending_rows
                self._pending_rows = 0
                self._memory_rows += rows
                self._journaling = bool(batch)
                stopping = self._stopping
            stored = False
            if batch:
                try:
                    stored = self._journal(batch, rows)
                except Exception:
                    # A bug here must not wedge the journal: refuse (never acknowledged, so the
                    # clients retry) and keep serving.
                    log.exception("%s: unexpected error journaling Exports", self.name)
                    self._refuse(batch, rows, "internal error journaling the Export; retry")
            with self._cond:
                quiet = self._quiet()
                if stored and quiet and not stopping:
                    self._in_grace = True
                    quiet = not self._cond.wait_for(lambda: not self._quiet(), QUIET_GRACE_S)
                    self._in_grace = False
            segment = self._segment
            if stored and quiet:
                # Nothing else is coming: insert now, and acknowledge once inserted.
                self._close_segment([ticket for _, _, ticket in batch])
            else:
                for _, _, ticket in batch if stored else ():
                    ticket.resolve()
                if segment is not None and (
                    stopping
                    or segment.rows >= cfg.batch_rows
                    or self._segment_bytes >= cfg.batch_bytes
                    or (
                        time.monotonic() - self._segment_since >= cfg.batch_timeout_s
                        and not self._inserts_waiting()
                    )
                ):
                    self._close_segment()
            with self._cond:
                self._journaling = False
                if stopping and not self._pending:
                    self._journal_done = True
                    self._cond.notify_all()
                    return

    def _quiet(self) -> bool:
        """Nothing else arriving, and nothing older waiting for ClickHouse (under the lock)."""
        return (
            not self._pending
            and not self._arriving
            and not len(self.spool)
            and time.monotonic() >= self._retry_at
        )

    def _inserts_waiting(self) -> bool:
        """Whether closed segments still wait for the insert thread. The open segment then
        stays open past ``batch_timeout_s`` (up to ``batch_rows`` or ``batch_bytes``): closed
        now, it would only wait behind them, while open it grows into one larger insert, so
        ClickHouse makes fewer parts and merges less when inserts are what is behind. What is
        acknowledged is journaled either way."""
        return bool(len(self.spool))

    def _journal(self, batch: list[tuple[bytes, pa.Table, Ticket]], rows: int) -> bool:
        """Append and fsync; True when stored (the tickets are the caller's to resolve)."""
        if self._segment is None:
            segment = self.spool.open_segment(self.limits)
            with self._cond:
                self._segment = segment
                self._segment_since = time.monotonic()
        assert self._segment is not None
        try:
            stored = self._segment.append([raw for raw, _, _ in batch], rows)
        except OSError as exc:
            self._write_failed.log("%s: cannot write the journal: %s", self.name, exc)
            stored = False
        if not stored:
            self._refuse(batch, rows, "the spool is full (ClickHouse is behind or down); retry")
            return False
        self._segment_tables.extend(table for _, table, _ in batch)
        self._segment_bytes += sum(self._held.get(id(table), 0) for _, table, _ in batch)
        self._spool_bytes.set(self.spool.bytes)
        telemetry.ACCEPTED.labels(self.signal).inc(rows)
        return True

    def _release(self, tables: list[pa.Table]) -> None:
        """The tables left memory: give their bytes back to the limit (lock held or not)."""
        freed = sum(self._held.pop(id(t), 0) for t in tables)
        for t in tables:
            self._expanded.pop(id(t), None)
        if self.memory is not None:
            self.memory.release(freed)

    def _refuse(self, batch: list[tuple[bytes, pa.Table, Ticket]], rows: int, why: str) -> None:
        with self._cond:
            self._release([table for _, table, _ in batch])
            self._memory_rows -= rows
            self._depth.set(self._memory_rows + self._pending_rows)
        telemetry.REFUSED.labels(self.signal).inc(rows)
        error = Refused(why, exhausted=True, retry_after_s=max(1.0, self.config.retry_backoff_s))
        for _, _, ticket in batch:
            ticket.resolve(error)

    def _close_segment(self, tickets: list[Ticket] | None = None) -> None:
        with self._cond:
            # Under the lock: drained() must never see the segment gone and not yet an entry.
            segment, tables = self._segment, self._segment_tables
            self._segment, self._segment_tables = None, []
            self._segment_bytes = 0
            assert segment is not None
            entry = segment.close()
            if entry is not None and tickets:
                self._waiting[entry.seq] = tickets
            if entry is not None and time.monotonic() >= self._retry_at:
                self._memory[entry.seq] = tables
            else:
                # ClickHouse is failing: the rows wait in the spool, not in memory.
                dropped = sum(t.num_rows for t in tables)
                self._release(tables)
                self._memory_rows -= dropped
                if entry is not None:
                    telemetry.SPOOLED.labels(self.signal).inc(dropped)
                self._depth.set(self._memory_rows + self._pending_rows)
            self._cond.notify_all()
        if entry is None:
            for ticket in tickets or ():
                ticket.resolve()

    # -- the insert thread ---------------------------------------------------------------------

    def _insert_loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._halted:
                        return
                    entries = self.spool.entries()
                    now = time.monotonic()
                    if entries and now >= self._retry_at:
                        break
                    if self._journal_done and (not entries or self._stopping):
                        # Stopping while ClickHouse fails: the rest waits in the spool.
                        return
                    if self._unsynced and not entries:
                        # Nothing to insert: sync once the oldest inserted segment has waited
                        # sync_every_s (sooner would sync after nearly every insert under load).
                        due = self._unsynced[0][0] + self.config.sync_every_s - now
                        if due <= 0:
                            break
                        self._cond.wait(due)
                        continue
                    self._cond.wait(self._retry_at - now if entries else None)
                entry = entries[0] if entries else None
            if entry is None:
                self._sync_inserted(force=True)
                continue
            with self._cond:
                tables = self._memory.pop(entry.seq, None)
            try:
                self._insert_entry(entry, tables)
            except Exception:
                log.exception("%s: unexpected error inserting a batch", self.name)
                self._failed(tables)
            with self._cond:
                waiting = self._waiting.pop(entry.seq, ())
                self._cond.notify_all()  # the journal thread may close the open segment now
            for ticket in waiting:
                ticket.resolve()  # inserted, or left in the spool: durable either way
            self._sync_inserted(force=False)

    def _sync_inserted(self, *, force: bool) -> None:
        """Ask ClickHouse to write what it has to disk, then drop the segments inserted before.

        Batched: at most every ``sync_every_s`` under load (``force`` when idle or stopping),
        and off the insert's path, so inserts become visible as fast as before. SYSTEM SYNC
        FILE CACHE is a sync(2) on the machine that runs ClickHouse (this process, for the
        embedded store). A server that refuses it (no SYSTEM privilege) is logged once, and
        segments are dropped at insert from then on: docs/deploy.md gives the table settings
        that make a server fsync its parts instead.
        """
        with self._cond:
            if not self._unsynced:
                return
            oldest = self._unsynced[0][0]
            if not force and time.monotonic() - oldest < self.config.sync_every_s:
                return
            batch = list(self._unsynced)
        if self._sync_works:
            try:
                self.store.command("SYSTEM SYNC FILE CACHE")
            except StoreUnavailable:
                return  # kept: tried again later, or replayed (a no-op) after a restart
            except Exception as exc:  # a refusal (StoreError), or a store that cannot sync
                self._sync_works = False
                log.warning(
                    "%s: ClickHouse refused SYSTEM SYNC FILE CACHE (%s); inserted segments "
                    "are dropped without it from now on", self.name, exc,
                )  # fmt: skip
        with self._cond:
            del self._unsynced[: len(batch)]
        self.spool.discard([entry for _, entry in batch])
        self._spool_bytes.set(self.spool.bytes)

    def _holding(self, nbytes: int) -> contextlib.AbstractContextManager[None]:
        return self.memory.holding(nbytes) if self.memory is not None else contextlib.nullcontext()

    def _pressed(self) -> bool:
        return self.memory is not None and 2 * self.memory.held >= self.memory.limit

    def _insert_entry(self, entry: SpoolEntry, tables: list[pa.Table] | None) -> None:
        if tables is None:
            try:
                table = self.spool.read(entry)
            except SpoolError as exc:
                self._lose(entry, str(exc), rows=max(entry.rows, 0))
                return
        else:
            table = pa.concat_tables(tables) if tables else None
        if table is None or not table.num_rows:
            self._removed(entry, tables)
            return
        # Rows read back from the spool are counted while they are inserted (rows still in
        # memory were counted since they were decoded).
        with self._holding(table_bytes(table) if tables is None else 0):
            self._insert_table(entry, tables, table)

    def _insert_table(
        self, entry: SpoolEntry, tables: list[pa.Table] | None, table: pa.Table
    ) -> None:
        size = None  # read back from the spool: sized from its rows
        if tables is not None and all(id(t) in self._expanded for t in tables):
            size = sum(self._expanded[id(t)] for t in tables)
        if self._insert_sliced(table, entry.token, size=size) or self._count_failure(entry, table):
            self._removed(entry, tables)
            if tables is None:
                telemetry.REPLAYED.labels(self.signal).inc(table.num_rows)
                log.info("%s: replayed %d spooled rows", self.name, table.num_rows)
            return
        self._failed(tables)

    def _removed(self, entry: SpoolEntry, tables: list[pa.Table] | None) -> None:
        # Inserted: out of the queue, but on disk until ClickHouse's parts are (_sync_inserted).
        self.spool.set_aside(entry)
        with self._cond:
            self._unsynced.append((time.monotonic(), entry))
        self._failures.pop(entry.seq, None)
        self._spool_bytes.set(self.spool.bytes)
        with self._cond:
            if tables is not None:
                self._release(tables)
                self._memory_rows -= sum(t.num_rows for t in tables)
                self._depth.set(self._memory_rows + self._pending_rows)
            self._cond.notify_all()

    def _failed(self, tables: list[pa.Table] | None) -> None:
        """After a failed insert: back off, and let every closed segment wait in the spool."""
        with self._cond:
            self._retry_at = time.monotonic() + self.config.retry_backoff_s
            released = [tables] if tables is not None else []
            released.extend(self._memory.values())
            self._memory.clear()
            for ts in released:
                self._release(ts)
            rows = sum(t.num_rows for ts in released for t in ts)
            self._memory_rows -= rows
            self._depth.set(self._memory_rows + self._pending_rows)
            waiting = [t for tickets in self._waiting.values() for t in tickets]
            self._waiting.clear()
        if rows:
            telemetry.SPOOLED.labels(self.signal).inc(rows)
        for ticket in waiting:
            ticket.resolve()  # durable in the spool; ClickHouse gets it on a replay


__all__ = ["BatchWriter", "JournalWriter", "Refused", "Ticket", "WriterConfig"]
