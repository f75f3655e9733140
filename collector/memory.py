"""The collector's memory limit, in bytes: what Exports hold while they are received, decoded and
waiting for ClickHouse.

The anchor is the OpenTelemetry Collector's ``memory_limiter`` processor, which refuses data
while the process's heap is above a limit, so that receivers push back (``RESOURCE_EXHAUSTED``,
HTTP 429) and senders retry, instead of the process growing until the kernel kills it. Sampling
the heap suits Go; here the memory that grows with load is known exactly, so it is counted:

* an Export's bytes until it is answered: an HTTP body as it arrives (one whose
  ``Content-Length`` does not fit is refused unread); a gRPC message, whose size is not known
  before it is read, as the largest of the last Exports (``ExportSizes``) until it is read, then
  as its own size, and refused unread when that does not fit, so what handler threads are
  reading is counted, not only what they hold;
* while it is parsed in Python (OTLP/JSON, or protobuf without the C decoder), an estimate of
  the objects parsing creates;
* its decoded columns, from decoding until they are inserted into ClickHouse, or dropped from
  memory because ClickHouse is failing (they wait in the spool then, not in memory);
* the insert's own copies while it runs (``holding``): each slice of a segment made contiguous
  and written out as an Arrow stream for ClickHouse, and a segment read back from the spool.

An Export that does not fit is refused before it is decoded where its size tells (the bytes
alone do not fit), else as soon as decoding passes what is left (the C decoder stops there).
Memory that is not counted is bounded elsewhere: the embedded ClickHouse by its own limit, set
from this one (``latscope.storage.engine_settings``), and the process's fixed footprint
(``docs/deploy.md`` gives the bound).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Callable, Iterator

from latscope.collector import telemetry


class MemoryLimit:
    """A byte budget shared by every receiver and writer of one collector.

    >>> limit = MemoryLimit(100)
    >>> limit.reserve(60), limit.reserve(60), limit.available
    (True, False, 40)
    """

    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes
        self._held = 0
        self._lock = threading.Lock()
        telemetry.MEMORY_LIMIT.set(limit_bytes)

    @property
    def held(self) -> int:
        return self._held

    @property
    def available(self) -> int:
        return max(0, self.limit - self._held)

    def reserve(self, nbytes: int) -> bool:
        """Count ``nbytes`` as held, if they fit; all or nothing."""
        if nbytes <= 0:
            return True
        with self._lock:
            if self._held + nbytes > self.limit:
                return False
            self._held += nbytes
            telemetry.MEMORY_HELD.set(self._held)
        return True

    def release(self, nbytes: int) -> None:
        if nbytes <= 0:
            return
        with self._lock:
            self._held -= nbytes
            telemetry.MEMORY_HELD.set(self._held)

    @contextlib.contextmanager
    def holding(self, nbytes: int) -> Iterator[None]:
        """Count ``nbytes`` while the block runs, past the limit if need be: memory the writer
        needs to make progress (an insert's copies), which new Exports then wait for."""
        with self._lock:
            self._held += max(0, nbytes)
            telemetry.MEMORY_HELD.set(self._held)
        try:
            yield
        finally:
            self.release(nbytes)


class ExportSizes:
    """What to count for a gRPC Export before it is read: the largest of the last ``window``
    Exports' sizes (``first`` before there are that many).

    gRPC tells an Export's size only once its handler has read the message whole. Counting
    nothing until then let each of serve's handler threads hold one Export past the limit (15-16
    MB Exports from 96 senders: up to 32 of them, uncounted); counting the largest recent size
    bounds what reads take to the limit, and senders of the same Exports as before see no
    difference. An Export bigger than any recent one is counted in full as soon as it is read.

    >>> sizes = ExportSizes(first=100, window=2)
    >>> sizes.estimate(), sizes.add(10), sizes.estimate(), sizes.add(20), sizes.estimate()
    (100, None, 100, None, 20)
    """

    def __init__(self, first: int, window: int = 64) -> None:
        self._sizes = [first] * window
        self._next = 0
        self._max = first
        self._lock = threading.Lock()

    def estimate(self) -> int:
        return self._max

    def add(self, nbytes: int) -> None:
        with self._lock:
            old, self._sizes[self._next] = self._sizes[self._next], nbytes
            self._next = (self._next + 1) % len(self._sizes)
            if nbytes >= self._max:
                self._max = nbytes
            elif old == self._max:
                self._max = max(self._sizes)


__all__ = ["ExportSizes", "MemoryLimit", "return_freed_heap"]


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, where the C library has one (not musl, not macOS)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM = _malloc_trim()


def return_freed_heap() -> None:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``; nothing where
    there is no such call).

    What Exports hold is freed after their insert, but glibc keeps what it frees in its arenas
    (one per thread, up to eight per core) for the next allocation of the thread that freed it:
    under Exports of prompt-sized spans, decoded by 32 handler threads, the arenas of serve held
    up to 940 MiB free that way, more than the limit itself. Trimming returns it at the cost of
    a pass over the arenas' free chunks."""
    if _TRIM is not None:
        _TRIM(0)
