"""How the answers read a window of attribution rows: the hours wholly inside it (or inside a
step) from the hourly rollup where it is up to date (``rollups.plan``), the rest from
``latscope_attribution``.

``summary``, ``tail`` and ``compare`` read the rest with ``FINAL`` (``plan_windows`` and
``planned_sources``, several windows in one query). The answers over time and across dimensions
split what they read raw once more, by hour (``prepare`` and ``sources``):

* **clean hours** are read without ``FINAL``. An hour is clean when its rollup is up to date and
  the rows stored for it (old versions and tombstones included; the ``hours_written``
  projection counts them in milliseconds) are exactly as many as its rollup counted after
  ``FINAL``: ``FINAL`` could only have removed rows, so it would remove none, and reading the
  hour as stored gives the same rows. Once merges have folded an hour's re-attributions, this
  skips ``FINAL``'s merge-on-read, which can cost more than reading the columns themselves (a
  week of 10 M requests: a count took 2.2 s with FINAL, 0.17 s without);
* every other hour (recent, not built, written to since its build, or holding versions not yet
  merged) is read with ``FINAL``, as every raw read is.

Templates given to ``sources`` and ``planned_sources`` name their variable parts as ``$NAME``
fragments (``latscope.sqltext``): ``$ROLLUP_WHERE`` (the rollup rows of the plan's hours),
``$RANGES`` (the raw ranges' condition), ``$FROM`` (the table, with ``FINAL`` or not) and
``$GROUP`` (the group expression).

>>> read = prepare(store, t0, t1, step_s=3600)  # doctest: +SKIP
>>> sources(read, ROLLUP_SQL, RAW_SQL)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from latscope.attribution import rollups
from latscope.attribution.rollups import HOUR_NS, HOUR_S, ROLLUP_TABLE, Plan
from latscope.sqltext import render
from latscope.storage import ATTRIBUTION_TABLE, Store

__all__ = [
    "PlannedWindow",
    "RawRanges",
    "WindowRead",
    "plan_windows",
    "planned_sources",
    "prepare",
    "raw_ranges",
    "raw_rows",
    "sources",
]

#: Rows stored per hour, versions and tombstones included (the hours_written projection).
STORED_SQL = f"""
SELECT toUInt32(toUnixTimestamp(toStartOfHour(Timestamp))) AS hour, count() AS n
FROM {ATTRIBUTION_TABLE}
WHERE toStartOfHour(Timestamp) >= toDateTime({{h0:UInt32}}, 'UTC')
  AND toStartOfHour(Timestamp) < toDateTime({{h1:UInt32}}, 'UTC')
GROUP BY hour
"""

#: Requests of each build of each hour, after FINAL (the whole-hour rollup row).
BUILT_COUNT_SQL = f"""
SELECT toUInt32(toUnixTimestamp(Timestamp)) AS hour, toUnixTimestamp64Micro(BuiltAt) AS built_us,
       sum(Requests) AS n
FROM {ROLLUP_TABLE}
WHERE Dims = 0
  AND Timestamp >= toDateTime({{h0:UInt32}}, 'UTC') AND Timestamp < toDateTime({{h1:UInt32}}, 'UTC')
GROUP BY hour, built_us
"""

#: Past this many ranges (hours alternating clean and not) everything is read with FINAL.
MAX_RANGES = 24


@dataclass(frozen=True)
class RawRanges:
    """Raw ranges [lo, hi) ns to read as stored (``clean``) and with FINAL (``final``)."""

    clean: list[tuple[int, int]]
    final: list[tuple[int, int]]


def clean_hours(store: Store, h0: int, h1: int) -> set[int]:
    """Hours in [h0, h1) (s since the epoch) whose stored rows are their rows after FINAL."""
    if h1 <= h0:
        return set()
    states = rollups.hour_states(store, h0, h1)
    usable = {h: s.built_us for h, s in states.items() if s.usable and s.built_us is not None}
    if not usable:
        return set()
    lo, hi = min(usable), max(usable) + HOUR_S
    stored = {int(h): int(n) for h, n in rollups.hour_rows(store, STORED_SQL, lo, hi)}
    built = {
        (int(h), int(b)): int(n) for h, b, n in rollups.hour_rows(store, BUILT_COUNT_SQL, lo, hi)
    }
    return {
        h for h, built_us in usable.items() if built.get((h, built_us)) == stored.get(h, -1) > 0
    }


def raw_ranges(store: Store, ranges: Sequence[tuple[int, int]]) -> RawRanges:
    """Split ``ranges`` at hour boundaries into what may be read as stored and what needs
    FINAL; neighbours of the same kind are merged."""
    if not ranges:
        return RawRanges([], [])
    h0 = min(lo for lo, _ in ranges) // HOUR_NS * HOUR_S
    h1 = -(-max(hi for _, hi in ranges) // HOUR_NS) * HOUR_S
    clean = clean_hours(store, h0, h1)
    if not clean:
        return RawRanges([], list(ranges))
    out: dict[bool, list[tuple[int, int]]] = {True: [], False: []}
    last_kind = None
    for lo, hi in ranges:
        cursor = lo
        while cursor < hi:
            hour_end = (cursor // HOUR_NS + 1) * HOUR_NS
            end = min(hi, hour_end)
            kind = (cursor // HOUR_NS) * HOUR_S in clean
            into = out[kind]
            if into and into[-1][1] == cursor and last_kind == kind:
                into[-1] = (into[-1][0], end)
            else:
                into.append((cursor, end))
            last_kind = kind
            cursor = end
    if len(out[True]) + len(out[False]) > MAX_RANGES:
        return RawRanges([], list(ranges))
    return RawRanges(out[True], out[False])


def raw_rows(
    split: RawRanges, params: dict[str, Any], select: str, where: str, prefix: str = ""
) -> str:
    """``SELECT {select} ... WHERE {where}`` over the split's ranges: UNION ALL of the clean
    ranges read as stored and the others with FINAL (an empty read when there are none).
    Parameter names start with ``prefix``."""
    parts = []
    for kind, ranges, table in (
        ("c_", split.clean, ATTRIBUTION_TABLE),
        ("f_", split.final, f"{ATTRIBUTION_TABLE} FINAL"),
    ):
        if ranges:
            cond = rollups.raw_where(ranges, params, prefix + kind)
            parts.append(f"SELECT {select} FROM {table} WHERE {cond} AND {where}")
    if not parts:
        parts.append(f"SELECT {select} FROM {ATTRIBUTION_TABLE} WHERE 0")
    return "\n        UNION ALL\n        ".join(parts)


@dataclass(frozen=True)
class WindowRead:
    """How to read a window: the rollup plan and level (``dims``: None reads nothing from the
    rollup), the raw ranges split by ``raw_ranges``, the group expression and the parameters."""

    plan: Plan
    dims: int | None
    raw: RawRanges
    group: str
    params: dict[str, Any]


def prepare(
    store: Store,
    since_ns: int,
    until_ns: int,
    *,
    step_s: int,
    params: dict[str, Any],
    wanted: Sequence[str] = (),
    group: str = "''",
    use_rollups: bool = True,
) -> WindowRead:
    """The plan for ``[since_ns, until_ns)`` cut in steps of ``step_s``: rollup hours at the
    cheapest level holding ``wanted`` (filters and group), when steps hold whole hours."""
    dims = rollups.level_for(wanted)
    # Only a step of whole hours holds whole rollup hours (steps line up with the epoch).
    if use_rollups and dims is not None and step_s % HOUR_S == 0:
        plan = rollups.plan(store, since_ns=since_ns, until_ns=until_ns)
    else:
        plan = Plan([], [(since_ns, until_ns)])
    split = raw_ranges(store, plan.raw) if use_rollups else RawRanges([], plan.raw)
    return WindowRead(plan, dims if plan.hours else None, split, group, params)


def sources(
    read: WindowRead,
    rollup_sql: str,
    raw_sql: str,
    prefix: str = "",
    fragments: Mapping[str, str] | None = None,
) -> str:
    """UNION ALL of the rollup rows of the plan's hours and raw reads of the rest: ``raw_sql``
    once for the clean ranges and once for the others, ``$FROM`` the table (with FINAL for
    those) and ``$RANGES`` their condition; ``$GROUP`` is the read's group in both, and
    ``fragments`` fill any other names the templates use. Parameter names start with
    ``prefix``, so one query can hold several reads."""
    common = {**(fragments or {}), "GROUP": read.group}
    parts = []
    if read.plan.hours and read.dims is not None:
        where = rollups.rollup_where(read.plan, read.dims, read.params, prefix)
        parts.append(render(rollup_sql, {**common, "ROLLUP_WHERE": where}))
    for kind, ranges, table in (
        ("c_", read.raw.clean, ATTRIBUTION_TABLE),
        ("f_", read.raw.final, f"{ATTRIBUTION_TABLE} FINAL"),
    ):
        if ranges:
            cond = rollups.raw_where(ranges, read.params, prefix + kind)
            parts.append(render(raw_sql, {**common, "RANGES": cond, "FROM": table}))
    return "\n    UNION ALL\n    ".join(parts)


# -- several windows, raw reads with FINAL (summary, tail, compare) -------------------------------


@dataclass(frozen=True)
class PlannedWindow:
    """A window to read: its plan and its bounds (ns)."""

    plan: Plan
    since_ns: int
    until_ns: int


def plan_windows(
    store: Store, bounds: Sequence[tuple[int, int]], use_rollups: bool
) -> list[PlannedWindow]:
    """The windows to read, each with its plan (all raw when ``use_rollups`` is False)."""
    found = rollups.plans(store, bounds) if use_rollups else [Plan([], [b]) for b in bounds]
    return [PlannedWindow(p, lo, hi) for p, (lo, hi) in zip(found, bounds, strict=True)]


def planned_sources(
    windows: Sequence[PlannedWindow],
    dims: int | None,
    params: dict[str, Any],
    group: str,
    rollup_sql: str,
    raw_sql: Mapping[bool, str],
) -> str:
    """UNION ALL of each window's rollup rows (its usable hours at level ``dims``) and raw reads
    of the rest with FINAL (all of it when ``dims`` is None: no level has what the query
    needs). ``rollup_sql`` has ``$ROLLUP_WHERE`` and ``$GROUP``; ``raw_sql`` (by whether the
    group is a literal) ``$RANGES`` and ``$GROUP``. With several windows, ``grp`` is the
    window's index instead of ``group``."""
    parts = []
    for i, w in enumerate(windows):
        tag = group if len(windows) == 1 else f"'{i}'"
        rollup = bool(w.plan.hours) and dims is not None
        ranges = w.plan.raw if rollup else [(w.since_ns, w.until_ns)]
        if rollup:
            where = rollups.rollup_where(w.plan, int(dims or 0), params, f"w{i}_")
            parts.append(render(rollup_sql, {"ROLLUP_WHERE": where, "GROUP": tag}))
        if ranges:
            where = rollups.raw_where(ranges, params, f"w{i}_")
            raw = raw_sql[tag.startswith("'")]
            parts.append(render(raw, {"RANGES": where, "GROUP": tag}))
    return "\n    UNION ALL\n    ".join(parts)
