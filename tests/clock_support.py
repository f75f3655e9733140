"""A hand-moved clock for the attributor's tests: the cadence and the settle window decided
without sleeping, so a loaded machine cannot change what a test sees."""

from __future__ import annotations

import time

import pyarrow as pa

from latscope.storage import ATTRIBUTION_TABLE, SPANS_TABLE, Store
from tests.attribution_support import span_rows

#: The newest time on the store's clock (us): its own now, or a span or row stamped later.
_HORIZON_SQL = f"""
SELECT greatest(toUnixTimestamp64Micro(now64(6)),
    (SELECT toUnixTimestamp64Micro(max(LatscopeIngestedAt)) FROM {SPANS_TABLE}),
    (SELECT toUnixTimestamp64Micro(max(SpansIngestedAt)) FROM {ATTRIBUTION_TABLE}))"""


class StoreClock:
    """The two clocks an ``Attributor`` reads, moved together by ``advance``: ``monotonic`` (s,
    its waits) and ``now_us`` (the store's clock, that of LatscopeIngestedAt). It starts after
    every time the shared store holds, and ``store`` stamps spans with its time, so the
    attributor's slices, settle bounds and waits all follow it.

    ``finish`` waits for the store's real clock to pass every time it gave out: the store is the
    process's, and a later test's attributor resumes from the newest row's time.

    >>> clock = StoreClock(store)  # doctest: +SKIP
    >>> Attributor(store, clock=clock.monotonic, store_clock_us=clock.now_us)  # doctest: +SKIP
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self.start_us = int(store.query_rows(_HORIZON_SQL)[0][0]) + 1000
        self._now_us = self.start_us

    def now_us(self) -> int:
        return self._now_us

    def monotonic(self) -> float:
        return (self._now_us - self.start_us) / 1e6

    def advance(self, seconds: float) -> None:
        self._now_us += round(seconds * 1e6)

    def stamp(self, rows: pa.Table) -> pa.Table:
        """Spans ``rows`` with their ingest time now on this clock."""
        stamps = pa.array([self._now_us] * rows.num_rows, pa.timestamp("us"))
        return rows.append_column("LatscopeIngestedAt", stamps)

    def store(self, trace_id: str, spans: list[dict]) -> float:
        """Store ``spans`` of ``trace_id`` ingested now on this clock; returns that time (s)."""
        self._store.insert_arrow(SPANS_TABLE, self.stamp(span_rows(trace_id, spans)))
        return self.monotonic()

    def finish(self, timeout_s: float = 120.0) -> None:
        """Wait until the store's own clock is past this one."""
        deadline = time.monotonic() + timeout_s
        while int(self._store.query_rows("SELECT toUnixTimestamp64Micro(now64(6))")[0][0]) <= (
            self._now_us
        ):
            if time.monotonic() > deadline:
                raise AssertionError(f"the store's clock never passed {self._now_us} us")
            time.sleep(0.05)
