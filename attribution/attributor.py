"""The continuous attributor: settled traces -> rows of the attribution table, in bounded batches.

How it finds work. Every span carries ``LatscopeIngestedAt`` (when it reached the store, on the
store's clock). The attributor keeps a watermark on that time and, each poll, takes the traces
that received spans after the watermark and none in the last ``settle_s`` seconds (the trace has
settled: its root ended and nothing more came for a while), at most ``batch_traces`` at a time, in
ingest order. It loads every span of those traces, attributes them with the batch engine and
writes one row per request. A late span (say the client span, exported after the server's) is a
new span after the watermark: its trace is attributed again from all its spans and the new row,
with a higher Version, replaces the old one.

Idempotent: Version is the number of distinct spans the row was computed from, so a re-run over
the same spans writes an identical row with the same Version. When re-attribution moves a
request to another sorting key (a late client span changes the start time, and so the hour, or
the model), the old key gets a tombstone (IsDeleted = 1, new Version), so no stale duplicate
survives ``FINAL``.

Memory stays bounded: one batch of traces at a time. Each row records in SpansIngestedAt the
watermark its batch brought the attributor to; after a restart the watermark resumes from the
largest one (work after it is redone, harmlessly).
A span whose insert took longer than ``settle_s`` to become visible can be passed by the
watermark; it is attributed with its trace's next span (or by re-running from an older watermark).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import polars as pl
import pyarrow as pa
from prometheus_client import Counter, Gauge

from latscope.attribution.batch import (
    BATCH_SPANS_SQL,
    attribute_frame,
    finish_rows,
    frame_from_arrow,
    to_arrow,
)
from latscope.attribution.engine import DEFAULT_STALL_NS
from latscope.attribution.rollups import NOW_US_SQL, Rollups
from latscope.attribution.table import ATTRIBUTION_SCHEMA
from latscope.config import Settings
from latscope.metrics import REGISTRY
from latscope.parts import Parts, Poller
from latscope.storage import ATTRIBUTION_TABLE, SPANS_TABLE, Store, StoreError

log = logging.getLogger(__name__)

_HOUR_NS = 3600 * 10**9

#: How far apart (span start times) the spans of one trace may be: a day covers hour-long
#: streams and any clock skew latscope corrects, and still prunes the spans table to ~3 days.
SPAN_REACH_NS = 24 * _HOUR_NS


#: Where the watermark restarts after a restart.
RESUME_SQL = f"SELECT toUnixTimestamp64Micro(max(SpansIngestedAt)) FROM {ATTRIBUTION_TABLE}"

#: Traces with spans ingested in (after, upto], by their newest such span, oldest first. WITH
#: TIES keeps every trace whose newest span shares the cutoff, so the next watermark (the cutoff)
#: misses none. Traces still receiving spans (any in the settle window, after ``settled``) wait:
#: they come back with those spans. The range is at most ``step_s`` wide, so each query reads a
#: bounded slice of the spans table (the minmax index on LatscopeIngestedAt skips the rest)
#: however far behind the attributor is.
READY_SQL = f"""
SELECT TraceId, toUnixTimestamp64Micro(max(LatscopeIngestedAt)) AS last_us,
       toUnixTimestamp64Nano(min(Timestamp)) AS first_ns, toUnixTimestamp64Nano(max(Timestamp))
FROM {SPANS_TABLE}
WHERE LatscopeIngestedAt > fromUnixTimestamp64Micro({{after_us:Int64}})
  AND LatscopeIngestedAt <= fromUnixTimestamp64Micro({{upto_us:Int64}})
  AND TraceId NOT IN (
      SELECT TraceId FROM {SPANS_TABLE}
      WHERE LatscopeIngestedAt > fromUnixTimestamp64Micro({{settled_us:Int64}})
  )
GROUP BY TraceId
ORDER BY last_us
LIMIT {{limit:UInt32}} WITH TIES
"""

#: After an empty slice: where the next span after the watermark is (to skip idle time).
NEXT_SQL = f"""
SELECT toUnixTimestamp64Micro(min(LatscopeIngestedAt)), count()
FROM {SPANS_TABLE}
WHERE LatscopeIngestedAt > fromUnixTimestamp64Micro({{after_us:Int64}})
"""

#: Live keys already written for a batch of traces (to tombstone those that moved).
EXISTING_KEYS_SQL = f"""
SELECT DISTINCT TraceId, ServiceName, Model, toUnixTimestamp64Nano(Timestamp) AS ts
FROM {ATTRIBUTION_TABLE}
WHERE TraceId IN {{trace_ids:Array(String)}} AND IsDeleted = 0
"""

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
BATCH_ERRORS = Counter(
    "latscope_attribution_errors",
    "Attribution batches that failed; 'store' ones are retried, 'skipped' ones are dropped",
    ["kind"],
    registry=REGISTRY,
)
LAG = Gauge(
    "latscope_attribution_lag_seconds",
    "Store time minus the attributor's watermark (includes the settle window)",
    registry=REGISTRY,
)


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
        batch_traces: int = 5000,
        stall_threshold_ns: int = DEFAULT_STALL_NS,
        step_s: float = 60.0,
    ) -> None:
        self.store = store
        self.settle_us = int(settle_s * 1e6)
        self.step_us = max(1, int(step_s * 1e6))
        super().__init__(poll_s)
        self.batch_traces = batch_traces
        self.stall_threshold_ns = stall_threshold_ns
        self.watermark_us: int | None = None

    def failed(self, exc: Exception) -> None:
        BATCH_ERRORS.labels("store").inc()

    # -- work --------------------------------------------------------------------------------

    def _now_us(self) -> int:
        return int(self.store.query_rows(NOW_US_SQL)[0][0])

    def _resume(self) -> int:
        value = self.store.query_rows(RESUME_SQL)[0][0]
        # An empty table answers the epoch: start from the beginning of the spans table.
        return int(value or 0)

    def run_until_idle(self, *, max_batches: int = 1000) -> int:
        """Attribute every settled trace up to now (bounded batches); returns requests written."""
        if self.watermark_us is None:
            self.watermark_us = self._resume()
        upto = self._now_us() - self.settle_us
        written = 0
        for _ in range(max_batches):
            if self.watermark_us >= upto or (self.stopping and written):
                break
            # A trace whose spans straddle the slice's end (but have all settled) is attributed
            # now from what is there and again when the slice reaches its later spans.
            hi = min(upto, self.watermark_us + self.step_us)
            rows = self.store.query_rows(
                READY_SQL,
                {
                    "after_us": self.watermark_us,
                    "upto_us": hi,
                    "settled_us": upto,
                    "limit": self.batch_traces,
                },
            )
            if not rows:
                self.watermark_us = hi
                if hi < upto:  # skip the idle time to the next span, if any
                    first_us, count = self.store.query_rows(
                        NEXT_SQL, {"after_us": self.watermark_us}
                    )[0]
                    nxt = int(first_us) - 1 if int(count) else upto
                    self.watermark_us = max(hi, min(nxt, upto))
                continue
            trace_ids = [r[0] for r in rows]
            # A trace's other spans sit within SPAN_REACH of its new ones (on any sane clock).
            around = (
                min(r[2] for r in rows) - SPAN_REACH_NS,
                max(r[3] for r in rows) + SPAN_REACH_NS,
            )
            try:
                through = int(rows[-1][1]) if len(rows) >= self.batch_traces else hi
                written += self.attribute(trace_ids, around, through_us=through)
            except StoreError:
                raise  # retried from the same watermark on the next poll
            except Exception:
                # A batch the engine cannot process would block every later one: count it, log
                # it, and move on.
                BATCH_ERRORS.labels("skipped").inc()
                log.exception("attribution batch of %d traces failed; skipped", len(trace_ids))
            self.watermark_us = int(rows[-1][1]) if len(rows) >= self.batch_traces else hi
        LAG.set(max(0.0, (self._now_us() - self.watermark_us) / 1e6))
        return written

    def attribute(
        self,
        trace_ids: list[str],
        around: tuple[int, int] | None = None,
        *,
        through_us: int | None = None,
    ) -> int:
        """Attribute these traces from their stored spans (started within ``around``, ns) and
        write their rows; ``through_us`` is the watermark once this batch is written (recorded
        as SpansIngestedAt, where a restarted attributor resumes)."""
        lo, hi = around or (0, 2**63 - 1)
        params = {"trace_ids": trace_ids, "from_ns": max(0, lo), "to_ns": min(hi, 2**63 - 1)}
        spans = frame_from_arrow(self.store.query_arrow(BATCH_SPANS_SQL, params))
        frame = finish_rows(attribute_frame(spans, stall_threshold_ns=self.stall_threshold_ns))
        if through_us is not None:
            frame = frame.with_columns(SpansIngestedAt=pl.lit(through_us, pl.Int64))
        if frame.height == 0:
            return 0
        table = to_arrow(frame)
        tombstones = self._tombstones(frame)
        if tombstones is not None:
            table = pa.concat_tables([table, tombstones])
            TOMBSTONES.inc(tombstones.num_rows)
        digest = hashlib.sha256()
        for trace_id, version in zip(
            frame["TraceId"].to_list(), frame["Version"].to_list(), strict=True
        ):
            digest.update(f"{trace_id}:{version};".encode())
        self.store.insert_arrow(ATTRIBUTION_TABLE, table, dedup_token=digest.hexdigest())
        ATTRIBUTED.inc(frame.height)
        return frame.height

    def _tombstones(self, frame: pl.DataFrame) -> pa.Table | None:
        old = self.store.query_arrow(EXISTING_KEYS_SQL, {"trace_ids": frame["TraceId"].to_list()})
        if old.num_rows == 0:
            return None
        old_df = pl.from_arrow(old)
        assert isinstance(old_df, pl.DataFrame)
        new = frame.select(
            "TraceId",
            "Version",
            new_service="ServiceName",
            new_model="Model",
            new_hour=pl.col("Timestamp").cast(pl.Int64) // _HOUR_NS,
        )
        moved = (
            old_df.join(new, on="TraceId")
            .with_columns(hour=pl.col("ts").cast(pl.Int64) // _HOUR_NS)
            .filter(
                (pl.col("ServiceName") != pl.col("new_service"))
                | (pl.col("Model") != pl.col("new_model"))
                | (pl.col("hour") != pl.col("new_hour"))
            )
        )
        if moved.height == 0:
            return None
        rows: dict[str, Any] = {
            "Timestamp": moved["ts"].cast(pl.Int64).to_list(),
            "TraceId": moved["TraceId"].to_list(),
            "ServiceName": moved["ServiceName"].to_list(),
            "Model": moved["Model"].to_list(),
            "Version": moved["Version"].to_list(),
            "IsDeleted": [1] * moved.height,
        }
        n = moved.height
        cols = {}
        for field in ATTRIBUTION_SCHEMA:
            if field.name in rows:
                cols[field.name] = pa.array(rows[field.name]).cast(field.type)
            elif pa.types.is_map(field.type):
                cols[field.name] = pa.array([[] for _ in range(n)], type=field.type)
            elif field.nullable and field.name in ("NetworkNs", "TtftClientNs", "TtftServerNs"):
                cols[field.name] = pa.nulls(n, field.type)
            elif pa.types.is_string(field.type):
                cols[field.name] = pa.array([""] * n, type=field.type)
            else:
                cols[field.name] = pa.array([0] * n).cast(field.type)
        return pa.table(cols, schema=ATTRIBUTION_SCHEMA)


def attributor_parts(settings: Settings, store: Store) -> Parts:
    """The attributor as a background component of ``latscope serve`` / ``collector``, with the
    rollup builder beside it: the process that writes attribution rows keeps their hourly
    rollups fresh (latscope.attribution.rollups)."""
    return Parts(
        components=[
            Attributor(
                store,
                settle_s=settings.attribution_settle_s,
                poll_s=settings.attribution_poll_s,
                batch_traces=settings.attribution_batch_traces,
                stall_threshold_ns=int(settings.stall_threshold_ms * 1e6),
            ),
            Rollups(store),
        ]
    )
