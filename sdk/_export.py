"""A bounded batching span processor that counts what it drops.

OpenTelemetry's ``BatchSpanProcessor`` logs a warning for every dropped span; under a collector
outage that floods the app's log. This one keeps the same shape (bounded queue, flush on size or
timer, one worker thread) but counts drops and failures, reports them at most once a minute, and
backs off (up to 30 s) while exports keep failing.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
import weakref
from collections.abc import Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

logger = logging.getLogger("latscope.sdk")

_DROP_LOG_INTERVAL_S = 60.0
#: Longest pause between export attempts while the collector keeps failing.
_MAX_BACKOFF_S = 30.0


class BoundedBatchProcessor(SpanProcessor):
    """Queue ended spans (at most ``max_queue_size``) and export them from a worker thread."""

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_queue_size: int = 4096,
        max_batch_size: int = 512,
        schedule_delay_s: float = 1.0,
    ) -> None:
        self._exporter = exporter
        self._max = max_queue_size
        self._batch = max_batch_size
        self._delay = schedule_delay_s
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._wake = threading.Event()
        self._stop = False
        self._export_lock = threading.Lock()
        self.dropped = 0
        self.exported = 0
        self.failed = 0
        self._dropped_logged = 0
        self._last_drop_log = 0.0
        self._last_fail_log = -_DROP_LOG_INTERVAL_S
        self._final_deadline = 0.0
        self._thread = self._start_thread()
        # Pre-fork servers (gunicorn) configure in the parent; the thread does not survive fork.
        if hasattr(os, "register_at_fork"):
            ref = weakref.WeakMethod(self._after_fork)
            os.register_at_fork(after_in_child=lambda: (m := ref()) and m())

    def _start_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="latscope-export", daemon=True)
        thread.start()
        return thread

    def _after_fork(self) -> None:
        self._queue.clear()  # the parent exports its own spans
        self._export_lock = threading.Lock()
        self._wake = threading.Event()
        if not self._stop:
            self._thread = self._start_thread()

    # SpanProcessor -------------------------------------------------------------------------
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if self._stop:
            self.dropped += 1
            return
        if len(self._queue) >= self._max:
            # Drop the newest: the app must never wait for the exporter.
            self.dropped += 1
            self._wake.set()
            return
        self._queue.append(span)
        if len(self._queue) >= self._batch:
            self._wake.set()

    def shutdown(self, timeout_s: float = 5.0) -> None:
        if self._stop:
            return
        self._final_deadline = time.monotonic() + timeout_s
        self._stop = True
        self._wake.set()
        self._thread.join(timeout_s)
        # What the final flush could not send in time is dropped now, not held: a collector
        # that is down at shutdown must not keep a queue of spans alive with this processor.
        while True:
            try:
                self._queue.popleft()
            except IndexError:
                break
            self.dropped += 1
        try:
            self._exporter.shutdown()
        except Exception:
            logger.debug("exporter shutdown failed", exc_info=True)
        self._log_drops(force=True)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export what is queued now, ignoring any back-off; False if it did not all go."""
        deadline = time.monotonic() + timeout_millis / 1000
        return self._drain(deadline)

    # worker ---------------------------------------------------------------------------------
    def _run(self) -> None:
        streak = 0
        retry_at = 0.0
        while not self._stop:
            self._wake.wait(self._delay)
            self._wake.clear()
            if self._stop:
                break
            if time.monotonic() < retry_at:  # backing off after failures: queue, don't hammer
                continue
            if self._drain(None):
                streak = 0
            else:
                streak += 1
                backoff = min(_MAX_BACKOFF_S, self._delay * 2**streak)
                retry_at = time.monotonic() + backoff
                self._log_failure(backoff)
            self._log_drops()
        # Last flush at shutdown, bounded by the time shutdown() was given.
        self._drain(self._final_deadline)

    def _drain(self, deadline: float | None) -> bool:
        """Export what is queued, batch by batch; False at the first failed batch or deadline."""
        with self._export_lock:
            while self._queue:
                if deadline is not None and time.monotonic() > deadline:
                    return False
                batch: Sequence[ReadableSpan] = [
                    self._queue.popleft() for _ in range(min(self._batch, len(self._queue)))
                ]
                try:
                    result = self._exporter.export(batch)
                except Exception:
                    logger.debug("span export raised", exc_info=True)
                    result = SpanExportResult.FAILURE
                if result is not SpanExportResult.SUCCESS:
                    self.failed += len(batch)
                    return False
                self.exported += len(batch)
        return True

    def _log_failure(self, backoff: float) -> None:
        now = time.monotonic()
        if now - self._last_fail_log >= _DROP_LOG_INTERVAL_S:
            logger.warning(
                "latscope SDK: span export failing (%d spans lost so far); next try in %.1f s",
                self.failed,
                backoff,
            )
            self._last_fail_log = now

    def _log_drops(self, force: bool = False) -> None:
        new = self.dropped - self._dropped_logged
        now = time.monotonic()
        if new and (force or now - self._last_drop_log >= _DROP_LOG_INTERVAL_S):
            logger.warning(
                "latscope SDK: dropped %d spans (queue full at %d; %d dropped in total)",
                new,
                self._max,
                self.dropped,
            )
            self._dropped_logged = self.dropped
            self._last_drop_log = now
