"""Bounded queue -> columnar batches -> ClickHouse, or the spool when ClickHouse cannot take them.

Receivers ``submit`` an Arrow table and wait on the returned ``Ticket``; it resolves once the
rows are durable (inserted, or fsync'd in the spool), and only then is the Export acknowledged.
One writer thread per table flushes a batch when it holds ``batch_rows`` rows, when its oldest
rows have waited ``batch_timeout_s``, or as soon as no other request is being mapped (group
commit: under load the queue fills while the previous batch is being inserted). Every batch
gets a fresh ``insert_deduplication_token`` that it keeps for life, so a replay of a spooled
batch that had in fact reached ClickHouse stores nothing twice (the table's deduplication
window drops it).

Order: while the spool holds anything, new batches are spooled behind it and the spool is
replayed oldest first, so ClickHouse sees batches in the order they were acknowledged.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass

import pyarrow as pa

from latscope.collector import telemetry
from latscope.collector.spool import Spool, SpoolEntry, SpoolError
from latscope.storage import Store, StoreError, StoreUnavailable

log = logging.getLogger(__name__)


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

    def __init__(self, writer: BatchWriter) -> None:
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
    #: flush when a batch holds this many rows ...
    batch_rows: int = 20_000
    #: ... or when its oldest rows have waited this long
    batch_timeout_s: float = 0.2
    #: after a failed insert, spool without trying ClickHouse for this long
    retry_backoff_s: float = 1.0
    #: a spooled batch ClickHouse keeps rejecting (not merely unreachable) is set aside after this
    #: many attempts so it cannot block everything behind it
    max_replay_attempts: int = 20


class BatchWriter:
    """Writes one table's rows to the store in batches; a ``Component`` of the process."""

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
        self._queue: deque[tuple[float, pa.Table, Ticket]] = deque()
        self._queued_rows = 0
        self._stopping = False
        self._arriving = 0
        self._retry_at = 0.0
        self._failures: dict[int, int] = {}
        self._thread: threading.Thread | None = None
        self._depth = telemetry.QUEUE_DEPTH.labels(signal)
        self._spool_bytes = telemetry.SPOOL_BYTES.labels(signal)
        self._spool_bytes.set(spool.bytes)

    # -- intake --------------------------------------------------------------------------------

    def arriving(self) -> _Arrival:
        """Context for a request being mapped: the writer holds a batch open only while rows
        are on their way (group commit), so an idle collector answers without waiting for
        ``batch_timeout_s`` and a busy one still fills large batches.
        """
        return _Arrival(self)

    def _arrive(self, delta: int) -> None:
        with self._cond:
            self._arriving += delta
            if not self._arriving:
                self._cond.notify_all()

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
            log.error("%s: cannot write the spool: %s", self.name, exc)
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

    def _insert(self, table: pa.Table, token: str) -> bool:
        """Insert a batch; False (and a backoff) when the store did not take it."""
        started = time.perf_counter()
        try:
            self.store.insert_arrow(self.table, table, dedup_token=token)
        except StoreError as exc:
            self._retry_at = time.monotonic() + self.config.retry_backoff_s
            level = logging.WARNING if isinstance(exc, StoreUnavailable) else logging.ERROR
            log.log(level, "%s: insert of %d rows failed: %s", self.name, table.num_rows, exc)
            return False
        telemetry.WRITE_SECONDS.labels(self.signal).observe(time.perf_counter() - started)
        return True

    def _replay(self) -> None:
        """Insert spooled batches oldest first with their original tokens; stop at a failure."""
        for entry in self.spool.entries():
            try:
                table = self.spool.read(entry)
            except SpoolError as exc:
                self._lose(entry, str(exc), rows=entry.rows)
                continue
            if not self._insert(table, entry.token):
                self._count_failure(entry, table.num_rows)
                return
            self.spool.remove(entry)
            self._failures.pop(entry.seq, None)
            self._spool_bytes.set(self.spool.bytes)
            telemetry.REPLAYED.labels(self.signal).inc(table.num_rows)
            log.info("%s: replayed %d spooled rows", self.name, table.num_rows)

    def _count_failure(self, entry: SpoolEntry, rows: int) -> None:
        # Only rejections count: an unreachable store may stay down for days without loss.
        if self._store_reachable():
            self._failures[entry.seq] = self._failures.get(entry.seq, 0) + 1
            if self._failures[entry.seq] >= self.config.max_replay_attempts:
                self._lose(entry, "ClickHouse keeps rejecting it", rows=rows)

    def _store_reachable(self) -> bool:
        return self.store.ping()

    def _lose(self, entry: SpoolEntry, why: str, *, rows: int) -> None:
        target = self.spool.quarantine(entry)
        self._failures.pop(entry.seq, None)
        self._spool_bytes.set(self.spool.bytes)
        telemetry.DROPPED.labels(self.signal).inc(rows)
        log.error("%s: spooled batch set aside as %s (%s); %d rows not stored", self.name, target,
                  why, rows)  # fmt: skip


__all__ = ["BatchWriter", "Refused", "Ticket", "WriterConfig"]
