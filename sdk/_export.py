"""A bounded batching span processor that counts what it drops.

OpenTelemetry's ``BatchSpanProcessor`` logs a warning for every dropped span; under a collector
outage that floods the app's log. This one keeps the same shape (bounded queue, flush on size or
timer, one worker thread) but counts drops and reports them at most once per interval.
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
        self._stop = True
        self._wake.set()
        self._thread.join(timeout_s)
        try:
            self._exporter.shutdown()
        except Exception:
            logger.debug("exporter shutdown failed", exc_info=True)
        self._log_drops(force=True)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        deadline = time.monotonic() + timeout_millis / 1000
        return self._drain(deadline)

    # worker ---------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(self._delay)
            self._wake.clear()
            if self._stop:
                break
            self._drain(None)
            self._log_drops()
        # Last flush at shutdown, bounded by the exporter's own timeout.
        self._drain(time.monotonic() + self._delay)

    def _drain(self, deadline: float | None) -> bool:
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
                if result is SpanExportResult.SUCCESS:
                    self.exported += len(batch)
                else:
                    self.failed += len(batch)
        return True

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
