"""Hourly rollups of the attribution table (``latscope_attribution_hourly``, 004_rollups.sql).

A summary over a week of requests reads ~15 columns of millions of rows with FINAL: seconds. An
hour whose rows no longer change is summarised once, per group: exact counts and sums, and a
histogram of every figure the aggregates report, in bins 1 % wide. A query then takes the hours
wholly inside its window from the rollup and reads only the rest from the attribution table with
FINAL (``plan``): the partial hours at the window's edges, hours not built yet (the recent,
unsettled ones) and hours written to since their build.

Why a re-attributed request still counts once. A build reads its hours with FINAL, as the raw
queries do, and records a cutoff (``BuiltAt``): every row written (``AttributedAt``) up to the
cutoff was visible to it. A re-attribution writes a new row, plus a tombstone where the request's
key moved, with a later ``AttributedAt``; the ``hours_written`` projection gives each hour's newest
write, and an hour written to after its build's cutoff is read raw until the ``Rollups`` component
rebuilds it. The cutoff trails the store's clock by ``margin_s``, so an insert still in flight
during the build (visible later, with an earlier ``AttributedAt``) is not missed, provided inserts
become visible within that margin (the attributor's take well under a second).

Percentiles from the histograms are within ``ALPHA`` (0.5 %) of the exact ones (``quantiles``).

>>> Rollups(store).run_until_idle()  # doctest: +SKIP
>>> plan(store, since_ns=t0, until_ns=t1)  # doctest: +SKIP
Plan(hours=[(1763002800, 1763700000123456), ...], raw=[(t0, 1763002800000000000), ...])
"""

from __future__ import annotations

import bisect
import contextlib
import contextvars
import itertools
import logging
import math
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge

from latscope.attribution.table import BUCKET_COLUMN_LIST, BUCKET_COLUMNS
from latscope.metrics import REGISTRY
from latscope.parts import Poller
from latscope.storage import ATTRIBUTION_TABLE, Store

log = logging.getLogger(__name__)

ROLLUP_TABLE = "latscope_attribution_hourly"

HOUR_S = 3600
HOUR_NS = HOUR_S * 10**9

# -- bins -----------------------------------------------------------------------------------------

#: Relative accuracy: bin b >= 1 holds [GAMMA**(b-1), GAMMA**b) ns and reads as the one value
#: within ALPHA of all of them; bin 0 holds values below 1 ns (and nulls never enter) and reads
#: as 0. About 230 bins per decade of latency.
ALPHA = 0.005
GAMMA = (1 + ALPHA) / (1 - ALPHA)
_LN_GAMMA = math.log(GAMMA)
MAX_BIN = 4095
#: A histogram key is metric * KEY_STRIDE + bin (UInt16).
KEY_STRIDE = 4096

#: Figures with a histogram, in key order: name -> SQL expression over the attribution table.
METRICS: dict[str, str] = {
    "e2e": "E2eNs",
    **{bucket: column for bucket, column in BUCKET_COLUMNS.items()},
    "ttft": "coalesce(TtftClientNs, TtftServerNs)",
    "ttft_server": "TtftServerNs",
    "tpot": "TpotNs",
    "itl_p50": "ItlP50Ns",
    "itl_p99": "ItlP99Ns",
}


def bin_sql(expr: str) -> str:
    """The bin of a non-null value (SQL); the rollup and raw reads use this one expression. A
    NULL figure (network without a client span, TTFT without tokens) is in no bin."""
    return (
        f"if({expr} >= 1, toUInt16(least({MAX_BIN}, 1 + floor(log(toFloat64({expr})) / "
        f"{_LN_GAMMA!r}))), toUInt16(0))"
    )


#: Per attribution row: the histogram keys of its known figures (one lambda over the figures as
#: floats, which ClickHouse analyses once rather than once per figure).
HIST_KEYS_SQL = (
    "arrayFilter(k -> k != 65535, arrayMap((v, i) -> if(isNull(v), toUInt16(65535), "
    f"toUInt16(i * {KEY_STRIDE} + {bin_sql('assumeNotNull(v)')})), ["
    + ", ".join(f"toNullable(toFloat64({expr}))" for expr in METRICS.values())
    + f"], range({len(METRICS)})))"
)


def bin_index(value: float) -> int:
    """Python twin of ``bin_sql`` (for tests and reading): the bin a value falls in."""
    if value < 1:
        return 0
    return min(MAX_BIN, 1 + math.floor(math.log(value) / _LN_GAMMA))


def bin_floor(b: int) -> float:
    """The smallest value (ns) in bin ``b``."""
    return 0.0 if b <= 0 else math.exp((b - 1) * _LN_GAMMA)


def bin_value(b: int) -> float:
    """The value bin ``b`` reads as: within ALPHA of every value in it."""
    return 0.0 if b <= 0 else bin_floor(b) * 2 * GAMMA / (GAMMA + 1)


def quantiles(bins: Sequence[int], counts: Sequence[int], levels: Iterable[float]) -> list[float]:
    """Percentiles read off a histogram (``bins`` ascending, ``counts`` > 0), in ns.

    The same linear interpolation between order statistics as ``quantilesExactInclusive`` (and
    numpy's and polars' "linear"), with each order statistic taken as its bin's value; since both
    statistics are within ALPHA of their bin's value, so is the interpolation: every percentile is
    within 0.5 % of the exact one (values below 1 ns read as 0).

    >>> quantiles([bin_index(1e6), bin_index(3e6)], [1, 1], [0.5])  # exact: 2e6
    [2001280.229766284]
    """
    cumulative = list(itertools.accumulate(counts))
    n = cumulative[-1]

    def order_statistic(k: int) -> float:
        return bin_value(bins[bisect.bisect_right(cumulative, k)])

    out = []
    for q in levels:
        position = q * (n - 1)
        lo = math.floor(position)
        value = order_statistic(lo)
        if position > lo:
            value += (position - lo) * (order_statistic(lo + 1) - value)
        out.append(value)
    return out


def bin_of_rank(bins: Sequence[int], counts: Sequence[int], q: float, *, upper: bool) -> int:
    """The bin holding the order statistic below (``upper=False``) or above the ``q`` position."""
    cumulative = list(itertools.accumulate(counts))
    position = q * (cumulative[-1] - 1)
    k = math.ceil(position) if upper else math.floor(position)
    return bins[bisect.bisect_right(cumulative, k)]


# -- grouping levels ------------------------------------------------------------------------------

#: group_by / filter name -> its bit in ``Dims``.
DIM_BITS = {"service": 16, "model": 8, "route": 4, "operation": 2, "status": 1}
#: The levels a build writes (see 004_rollups.sql), and those with the tail arrays.
LEVELS = (0, 16, 8, 24, 28, 26, 25)
TAIL_LEVELS = (0, 16, 8, 24)


def level_for(dims: Iterable[str], *, tail: bool = False) -> int | None:
    """The cheapest built level grouped by at least ``dims`` (names of DIM_BITS), else None."""
    names = set(dims)
    if not names <= DIM_BITS.keys():
        return None
    mask = sum(DIM_BITS[name] for name in names)
    fits = [level for level in (TAIL_LEVELS if tail else LEVELS) if level & mask == mask]
    return min(fits, key=lambda level: (level.bit_count(), level)) if fits else None


# -- building -------------------------------------------------------------------------------------

#: Dims of a grouping-set row (see 004_rollups.sql): grouping() sets a bit per column the row is
#: NOT grouped by (the SQL standard's way, forced below), first argument highest.
_DIMS = "bitXor(31, grouping(ServiceName, Model, Route, Operation, StatusCode))"
_TAIL_DIMS = "bitXor(3, grouping(ServiceName, Model)) * 8"
_KEY_COLUMNS = "hour, Dims, ServiceName, Model, Route, Operation, StatusCode"
#: One grouping set per level of LEVELS, in that order.
_SETS = (
    "(hour)",
    "(hour, ServiceName)",
    "(hour, Model)",
    "(hour, ServiceName, Model)",
    "(hour, ServiceName, Model, Route)",
    "(hour, ServiceName, Model, Operation)",
    "(hour, ServiceName, Model, StatusCode)",
)


def _sets(extra: str, count: int = len(_SETS)) -> str:
    return ", ".join(s[:-1] + f", {extra})" for s in _SETS[:count])


#: The attribution rows of the hours being built, deduplicated like every raw read.
_BUILD_ROWS = f"""(
        SELECT toStartOfHour(Timestamp) AS hour, ServiceName, Model, Route, Operation, StatusCode,
               HasClient, E2eNs, {BUCKET_COLUMN_LIST}, TtftClientNs,
               TtftServerNs, TpotNs, ItlP50Ns, ItlP99Ns, ItlMaxNs, Stalls
        FROM {ATTRIBUTION_TABLE} FINAL
        WHERE Timestamp >= fromUnixTimestamp64Nano({{lo_ns:Int64}})
          AND Timestamp < fromUnixTimestamp64Nano({{hi_ns:Int64}})
    )"""

#: bucket -> the rollup column holding its sum (``"prefill"`` -> ``"PrefillSum"``).
BUCKET_SUMS: dict[str, str] = {bucket: f"{bucket.capitalize()}Sum" for bucket in BUCKET_COLUMNS}

#: Per-group figures: aggregates over attribution rows named as the rollup's columns, so raw
#: reads and rollup rows union. Network is unknown (NULL) without a client span: its sum counts
#: 0 for those and ``NetworkCount`` says how many knew it.
SCALARS_SQL = (
    """
    count() AS Requests,
    countIf(HasClient) AS WithClient,
    sum(E2eNs) AS E2eSum,
    ifNull(sum(NetworkNs), 0) AS NetworkSum,
    count(NetworkNs) AS NetworkCount,
"""
    + "".join(
        f"    sum({column}) AS {BUCKET_SUMS[bucket]},\n"
        for bucket, column in BUCKET_COLUMNS.items()
        if bucket != "network"
    )
    + """    ifNull(sum(coalesce(TtftClientNs, TtftServerNs)), 0) AS TtftSum,
    count(coalesce(TtftClientNs, TtftServerNs)) AS TtftCount,
    ifNull(sum(TpotNs), 0) AS TpotSum,
    count(TpotNs) AS TpotCount,
    max(ItlMaxNs) AS ItlMax,
    sum(Stalls) AS StallsSum,
    countIf(Stalls > 0) AS StalledRequests"""
)
SCALAR_COLUMNS = [
    line.strip().rstrip(",").rsplit(" AS ", 1)[1] for line in SCALARS_SQL.strip().splitlines()
]

#: Per e2e bin: requests, and the sums of e2e and of each bucket (network 0 when unknown, so the
#: buckets add up to e2e). Names as in TAIL_SUM_NAMES; rollup columns in TAIL_COLUMNS.
TAIL_SUM_NAMES = ["n", "e2e", *BUCKET_COLUMNS]
TAIL_COLUMNS = ["TailRequests", "TailE2e", *(f"Tail{b.capitalize()}" for b in BUCKET_COLUMNS)]
TAIL_SUMS_SQL = ", ".join(
    ["count() AS n", "sum(E2eNs) AS e2e"]
    + [
        f"sum({'ifNull(NetworkNs, 0)' if column == 'NetworkNs' else column}) AS {bucket}"
        for bucket, column in BUCKET_COLUMNS.items()
    ]
)
#: The tail tuples (bin, n, e2e, buckets...) split into the rollup's arrays.
_TAIL_ARRAYS = ", ".join(
    f"arrayMap(x -> {'toUInt32(x.2)' if i == 0 else f'x.{i + 2}'}, tail)"
    for i in range(len(TAIL_SUM_NAMES))
)

#: Builds the hours in [lo_ns, hi_ns) (whole hours): every level's rows with cutoff ``built_us``,
#: each with its hour's row count (so a reader can tell a complete build from a cut-short one).
BUILD_SQL = f"""
INSERT INTO {ROLLUP_TABLE} (Timestamp, Dims, ServiceName, Model, Route, Operation, StatusCode,
    BuiltAt, BuildRows, {", ".join(SCALAR_COLUMNS)}, HistKeys, HistCounts,
    TailBins, {", ".join(TAIL_COLUMNS)})
SELECT hour, Dims, ServiceName, Model, Route, Operation, StatusCode,
    fromUnixTimestamp64Micro({{built_us:Int64}}),
    toUInt32(count() OVER (PARTITION BY hour)),
    {", ".join(SCALAR_COLUMNS)},
    arrayMap(x -> x.1, hist), arrayMap(x -> toUInt32(x.2), hist),
    arrayMap(x -> x.1, tail), {_TAIL_ARRAYS}
FROM (
    SELECT hour, {_DIMS} AS Dims, ServiceName, Model, Route, Operation, StatusCode, {SCALARS_SQL}
    FROM {_BUILD_ROWS}
    GROUP BY GROUPING SETS ({", ".join(_SETS)})
) AS scalars
LEFT JOIN (
    SELECT {_KEY_COLUMNS}, arraySort(groupArray((key, c))) AS hist
    FROM (
        SELECT hour, {_DIMS} AS Dims, ServiceName, Model, Route, Operation, StatusCode, key,
               count() AS c
        FROM {_BUILD_ROWS}
        ARRAY JOIN {HIST_KEYS_SQL} AS key
        GROUP BY GROUPING SETS ({_sets("key")})
    )
    GROUP BY {_KEY_COLUMNS}
) AS histograms USING ({_KEY_COLUMNS})
LEFT JOIN (
    SELECT {_KEY_COLUMNS}, arraySort(groupArray((bin, {", ".join(TAIL_SUM_NAMES)}))) AS tail
    FROM (
        SELECT hour, {_TAIL_DIMS} AS Dims, ServiceName, Model,
               toLowCardinality('') AS Route, toLowCardinality('') AS Operation,
               toLowCardinality('') AS StatusCode, {bin_sql("E2eNs")} AS bin, {TAIL_SUMS_SQL}
        FROM {_BUILD_ROWS}
        GROUP BY GROUPING SETS ({_sets("bin", len(TAIL_LEVELS))})
    )
    GROUP BY {_KEY_COLUMNS}
) AS tails USING ({_KEY_COLUMNS})
SETTINGS do_not_merge_across_partitions_select_final = 1, group_by_use_nulls = 0,
    force_grouping_standard_compatibility = 1, join_use_nulls = 0
"""

# -- reading --------------------------------------------------------------------------------------

#: Each hour's newest write (the hours_written projection answers it from a few rows per part).
WRITTEN_SQL = f"""
SELECT toUInt32(toUnixTimestamp(toStartOfHour(Timestamp))) AS hour,
       toUnixTimestamp64Micro(max(AttributedAt)) AS last_us
FROM {ATTRIBUTION_TABLE}
WHERE toStartOfHour(Timestamp) >= toDateTime({{h0:UInt32}}, 'UTC')
  AND toStartOfHour(Timestamp) < toDateTime({{h1:UInt32}}, 'UTC')
GROUP BY hour
"""

#: Each hour's builds: cutoff, rows written and rows present.
BUILDS_SQL = f"""
SELECT toUInt32(toUnixTimestamp(Timestamp)) AS hour, toUnixTimestamp64Micro(BuiltAt) AS built_us,
       any(BuildRows) AS want, count() AS have
FROM {ROLLUP_TABLE}
WHERE Timestamp >= toDateTime({{h0:UInt32}}, 'UTC') AND Timestamp < toDateTime({{h1:UInt32}}, 'UTC')
GROUP BY hour, built_us
"""

#: The store's clock, in µs (the clock AttributedAt and LatscopeIngestedAt default to).
NOW_US_SQL = "SELECT toUnixTimestamp64Micro(now64(6))"


@dataclass(frozen=True)
class HourState:
    """What the store says about one hour."""

    last_us: int | None  #: newest AttributedAt of its rows (None: no rows)
    built_us: int | None  #: cutoff of its newest complete build (None: none)

    @property
    def usable(self) -> bool:
        """Built, and nothing written to it since: its rollup rows are its FINAL rows' summary."""
        return (
            self.built_us is not None and self.last_us is not None and self.last_us <= self.built_us
        )


#: Answers of the hour-state queries within ``one_view`` (None outside one).
_VIEW: contextvars.ContextVar[dict[tuple[int, str, int, int], list[tuple]] | None] = (
    contextvars.ContextVar("latscope_rollup_view", default=None)
)


@contextlib.contextmanager
def one_view() -> Iterator[None]:
    """Within this block, each hour-state query (``hour_rows``) runs once per store and hours:
    an answer made of several reads of one window (the diagnosis) looks its hours up once
    instead of once per read (each lookup is a few small queries, ~10 ms each), and all its
    reads see the same plan."""
    token = _VIEW.set({}) if _VIEW.get() is None else None
    try:
        yield
    finally:
        if token is not None:
            _VIEW.reset(token)


def hour_rows(store: Store, sql: str, h0: int, h1: int) -> list[tuple]:
    """The rows of an hour-state query over hours [h0, h1) (once per ``one_view``)."""
    memo = _VIEW.get()
    if memo is None:
        return store.query_rows(sql, {"h0": h0, "h1": h1})
    key = (id(store), sql, h0, h1)
    if key not in memo:
        memo[key] = store.query_rows(sql, {"h0": h0, "h1": h1})
    return memo[key]


def hour_states(store: Store, h0: int, h1: int) -> dict[int, HourState]:
    """Hours in [h0, h1) (s since the epoch) that have rows or builds."""
    last = {int(h): int(t) for h, t in hour_rows(store, WRITTEN_SQL, h0, h1)}
    newest: dict[int, tuple[int, bool]] = {}
    for hour, built_us, want, have in hour_rows(store, BUILDS_SQL, h0, h1):
        hour, built_us = int(hour), int(built_us)
        if hour not in newest or built_us > newest[hour][0]:
            newest[hour] = (built_us, int(have) == int(want))
    return {
        hour: HourState(
            last.get(hour),
            newest[hour][0] if hour in newest and newest[hour][1] else None,
        )
        for hour in last.keys() | newest.keys()
    }


@dataclass(frozen=True)
class Plan:
    """How to read a window: rollup hours (hour start s, build cutoff µs) and raw [lo, hi) ns."""

    hours: list[tuple[int, int]]
    raw: list[tuple[int, int]]


#: Past this many raw ranges (a window full of stale hours) the whole window is read raw.
MAX_RAW_RANGES = 24


def plan(store: Store, *, since_ns: int, until_ns: int) -> Plan:
    """Split ``[since_ns, until_ns)`` into usable rollup hours and the ranges to read raw."""
    return plans(store, [(since_ns, until_ns)])[0]


def plans(store: Store, windows: Sequence[tuple[int, int]]) -> list[Plan]:
    """``plan`` for several windows, looking the hours up once."""
    spans = [(-(-lo // HOUR_NS), hi // HOUR_NS) for lo, hi in windows]  # whole hours inside
    whole = [(first, last) for first, last in spans if last > first]
    states = (
        hour_states(
            store, min(f for f, _ in whole) * HOUR_S, max(last for _, last in whole) * HOUR_S
        )
        if whole
        else {}
    )
    return [
        _plan_one(lo, hi, first, last, states)
        for (lo, hi), (first, last) in zip(windows, spans, strict=True)
    ]


def _plan_one(
    since_ns: int, until_ns: int, first: int, last: int, states: Mapping[int, HourState]
) -> Plan:
    hours = [
        (h, int(states[h].built_us or 0))
        for h in range(first * HOUR_S, last * HOUR_S, HOUR_S)
        if h in states and states[h].usable
    ]
    raw: list[tuple[int, int]] = []
    cursor = since_ns
    for hour, _ in hours:
        start = hour * 10**9
        if start > cursor:
            raw.append((cursor, start))
        cursor = start + HOUR_NS
    if cursor < until_ns:
        raw.append((cursor, until_ns))
    if len(raw) > MAX_RAW_RANGES:
        return Plan([], [(since_ns, until_ns)])
    return Plan(hours, raw)


def raw_where(ranges: Sequence[tuple[int, int]], params: dict[str, Any], prefix: str = "") -> str:
    """SQL condition for Timestamp in any of ``ranges``; binds their ends into ``params`` (names
    start with ``prefix``, so several windows can share one query)."""
    if not ranges:
        return "0"
    terms = []
    for i, (lo, hi) in enumerate(ranges):
        lo_name, hi_name = f"{prefix}raw_lo_{i}", f"{prefix}raw_hi_{i}"
        params[lo_name], params[hi_name] = int(lo), int(hi)
        terms.append(
            f"(Timestamp >= fromUnixTimestamp64Nano({{{lo_name}:Int64}}) "
            f"AND Timestamp < fromUnixTimestamp64Nano({{{hi_name}:Int64}}))"
        )
    return "(" + " OR ".join(terms) + ")"


#: Rollup rows of a plan's hours at one level (``hours``: (hour s, cutoff µs) pairs); parameter
#: names get a per-window prefix in ``rollup_where``.
ROLLUP_WHERE = """
    Dims = {dims:UInt8}
    AND Timestamp >= toDateTime({h0:UInt32}, 'UTC') AND Timestamp < toDateTime({h1:UInt32}, 'UTC')
    AND has({hours:Array(Tuple(UInt32, Int64))},
            (toUInt32(toUnixTimestamp(Timestamp)), toUnixTimestamp64Micro(BuiltAt)))
    AND ({service:String} = '' OR ServiceName = {service:String})
    AND ({model:String} = '' OR Model = {model:String})
"""


def rollup_where(p: Plan, dims: int, params: dict[str, Any], prefix: str = "") -> str:
    """ROLLUP_WHERE for the plan's hours, its values bound into ``params``."""
    bound = {
        "dims": dims,
        "hours": p.hours,
        "h0": min((h for h, _ in p.hours), default=0),
        "h1": max((h for h, _ in p.hours), default=0) + HOUR_S,
    }
    sql = ROLLUP_WHERE
    for name, value in bound.items():
        params[prefix + name] = value
        sql = sql.replace("{" + name + ":", "{" + prefix + name + ":")
    return sql


# -- keeping the rollup fresh ---------------------------------------------------------------------

#: Hours remembered as built empty (bounded; see Rollups.build).
_EMPTY_MAX = 10_000

HOURS_BUILT = Counter(
    "latscope_rollup_hours_built",
    "Hours of attribution rows summarised into the hourly rollup, rebuilds included",
    registry=REGISTRY,
)
HOURS_DUE = Gauge(
    "latscope_rollup_hours_due",
    "Settled hours without an up-to-date rollup at the builder's last pass (read raw meanwhile)",
    registry=REGISTRY,
)


class Rollups(Poller):
    """A ``latscope.parts.Component``: builds each hour once it settled, and rebuilds hours
    written to after their build (re-attributions, late requests).

    An hour is built once it ended ``settle_s`` ago and nothing was written to it during the
    last ``margin_s`` (the cutoff's margin for inserts still in flight). Builds run in the
    background every ``poll_s``; at most ``max_hours`` (within one day) per statement.

    >>> Rollups(store, settle_s=0, margin_s=0).run_until_idle()  # doctest: +SKIP
    168
    """

    name = "rollups"

    def __init__(
        self,
        store: Store,
        *,
        settle_s: float = 300.0,
        margin_s: float = 60.0,
        poll_s: float = 30.0,
        max_hours: int = 24,
    ) -> None:
        self.store = store
        self.settle_us = int(settle_s * 1e6)
        self.margin_us = int(margin_s * 1e6)
        super().__init__(poll_s)
        self.max_hours = max(1, max_hours)
        # Hours whose build wrote nothing (every row replaced or deleted): hour -> cutoff.
        self._empty: dict[int, int] = {}

    # -- work --------------------------------------------------------------------------------

    def due(self) -> tuple[list[int], int]:
        """Hours to build now (s since the epoch, ascending) and the cutoff to build them with."""
        now_us = int(self.store.query_rows(NOW_US_SQL)[0][0])
        cutoff = now_us - self.margin_us
        settled_s = (now_us - self.settle_us) // 10**6  # hours that ended by then are settled
        states = hour_states(self.store, 0, max(0, settled_s - HOUR_S + 1))
        hours = []
        for hour, state in sorted(states.items()):
            if state.last_us is None or state.usable or state.last_us > cutoff:
                continue  # no rows, fresh, or written too recently to build past
            if self._empty.get(hour, -1) >= state.last_us:
                continue  # built before, and nothing of it survived FINAL
            hours.append(hour)
        return hours, cutoff

    def poll(self) -> None:
        # Ingest and the API's queries first (Store.background).
        with self.store.background():
            self.run_until_idle()

    def run_until_idle(self) -> int:
        """Build every hour that is due (until stopped); returns how many hours were built."""
        hours, cutoff = self.due()
        left = len(hours)
        HOURS_DUE.set(left)
        for run in _runs(hours, self.max_hours):
            if self.stopping:
                break
            self.build(run, cutoff)
            HOURS_BUILT.inc(len(run))
            left -= len(run)
            HOURS_DUE.set(left)
        return len(hours) - left

    def build(self, hours: Sequence[int], cutoff_us: int) -> None:
        """Build consecutive ``hours`` (within one day) with cutoff ``cutoff_us``."""
        lo, hi = hours[0], hours[-1] + HOUR_S
        started = time.perf_counter()
        self.store.command(
            BUILD_SQL, {"lo_ns": lo * 10**9, "hi_ns": hi * 10**9, "built_us": cutoff_us}
        )
        built = {
            int(hour)
            for hour, built_us, _, _ in self.store.query_rows(BUILDS_SQL, {"h0": lo, "h1": hi})
            if int(built_us) == cutoff_us
        }
        for hour in hours:
            if hour not in built:
                self._empty[hour] = cutoff_us
        while len(self._empty) > _EMPTY_MAX:  # forgetting one costs one more (empty) build
            del self._empty[min(self._empty)]
        log.debug(
            "built %d rollup hours from %d in %.2f s", len(hours), lo, time.perf_counter() - started
        )


def _runs(hours: Sequence[int], max_hours: int) -> list[list[int]]:
    """Consecutive hours, split at day boundaries (one partition per INSERT) and at max_hours."""
    runs: list[list[int]] = []
    for hour in hours:
        if (
            runs
            and runs[-1][-1] + HOUR_S == hour
            and hour // 86_400 == runs[-1][0] // 86_400
            and len(runs[-1]) < max_hours
        ):
            runs[-1].append(hour)
        else:
            runs.append([hour])
    return runs


def histograms(
    rows: Iterable[Mapping[str, Any]],
) -> dict[tuple[bool, Any], dict[str, tuple[list[int], list[int]]]]:
    """(grp, total, key, c) rows, ordered by key within a group -> {(total, grp): {metric:
    (bins, counts)}}."""
    names = list(METRICS)
    out: dict[tuple[bool, Any], dict[str, tuple[list[int], list[int]]]] = {}
    for row in rows:
        key = int(row["key"])
        group = (bool(row["total"]), row["grp"])
        bins, counts = out.setdefault(group, {}).setdefault(names[key // KEY_STRIDE], ([], []))
        bins.append(key % KEY_STRIDE)
        counts.append(int(row["c"]))
    return out


def merge_histograms(
    parts: Iterable[Mapping[str, tuple[Sequence[int], Sequence[int]]]],
) -> dict[str, tuple[list[int], list[int]]]:
    """The sum of several groups' histograms (as ``histograms`` gives them), per metric."""
    summed: dict[str, dict[int, int]] = {}
    for part in parts:
        for metric, (bins, counts) in part.items():
            into = summed.setdefault(metric, {})
            for b, c in zip(bins, counts, strict=True):
                into[b] = into.get(b, 0) + c
    return {
        metric: (sorted(by_bin), [by_bin[b] for b in sorted(by_bin)])
        for metric, by_bin in summed.items()
    }
