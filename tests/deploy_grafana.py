"""What Grafana and its ClickHouse plugin do to a dashboard query before ClickHouse sees it.

Two steps, in Grafana's order: the frontend interpolates template variables (``${var}``,
``${var:singlequote}``, ``$var``; an "All" selection of a variable without a custom all-value
becomes every value), then the plugin's backend expands its macros (``$__timeFilter(col)``,
``$__fromTime``, ``$__timeInterval(col)``, ...) the way its ``pkg/macros`` does. Anything else
that starts with ``$`` is an error here, so a dashboard cannot use a macro these tests do not run.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

#: Grafana rounds the auto interval (range / max data points) to one of these, in seconds.
_NICE_INTERVALS = (1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 900, 1200, 1800, 3600, 7200)
_VARIABLE = re.compile(r"\$\{(\w+)(?::(\w+))?\}|\$(?!__)(\w+)")
_MACRO = re.compile(r"\$__(\w+)")


def auto_interval(start: datetime, end: datetime, max_data_points: int = 1000) -> int:
    """Grafana's ``$__interval`` in seconds for a panel ``max_data_points`` wide."""
    raw = (end - start).total_seconds() / max_data_points
    return max([n for n in _NICE_INTERVALS if n <= raw] or [1])


def parse_relative(expr: str, now: datetime) -> datetime:
    """``now``, ``now-3h``, ``now-15m``, ``now-7d`` as Grafana's time picker reads them."""
    match = re.fullmatch(r"now(?:-(\d+)([smhd]))?", expr)
    if not match:
        raise ValueError(f"unsupported time expression {expr!r}")
    if not match.group(1):
        return now
    unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[match.group(2)]
    return now - timedelta(**{unit: int(match.group(1))})


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def interpolate(sql: str, variables: dict[str, list[str]]) -> str:
    """Template variables -> text, as Grafana's template service formats them for SQL."""

    def sub(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3)
        fmt = match.group(2)
        if name not in variables:
            raise KeyError(f"query uses undefined variable ${name}")
        values = variables[name]
        if fmt == "singlequote":
            return ",".join(_quote(v) for v in values) if values else "''"
        if fmt in (None, "raw", "csv"):
            if fmt is None and len(values) != 1:
                raise ValueError(f"multi-value ${name} needs a format such as :singlequote")
            return ",".join(values)
        raise ValueError(f"format :{fmt} of ${name} is not one the dashboard should use")

    return _VARIABLE.sub(sub, sql)


def _args(sql: str, open_at: int) -> tuple[list[str], int]:
    """Split the balanced ``(...)`` at ``open_at`` on top-level commas; returns args, end."""
    depth, start, args = 0, open_at + 1, []
    for i in range(open_at, len(sql)):
        c = sql[i]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                args.append(sql[start:i].strip())
                return [a for a in args if a], i + 1
        elif c == "," and depth == 1:
            args.append(sql[start:i].strip())
            start = i + 1
    raise ValueError(f"unbalanced parentheses after {sql[:open_at]!r}")


def expand_macros(sql: str, *, start: datetime, end: datetime, interval_s: int) -> str:
    """The plugin's backend macros (grafana/clickhouse-datasource pkg/macros)."""
    f_s, t_s = int(start.timestamp()), int(end.timestamp())
    f_ms, t_ms = int(start.timestamp() * 1000), int(end.timestamp() * 1000)
    interval_s = max(interval_s, 1)

    def one_arg(fn: Callable[[str], str]) -> Callable[[list[str]], str]:
        def call(args: list[str]) -> str:
            if len(args) != 1:
                raise ValueError(f"expected 1 argument, got {len(args)}")
            return fn(args[0])

        return call

    macros: dict[str, Callable[[list[str]], str]] = {
        "fromTime": lambda _: f"toDateTime({f_s})",
        "toTime": lambda _: f"toDateTime({t_s})",
        "fromTime_ms": lambda _: f"fromUnixTimestamp64Milli({f_ms})",
        "toTime_ms": lambda _: f"fromUnixTimestamp64Milli({t_ms})",
        "timeFilter": one_arg(lambda c: f"{c} >= toDateTime({f_s}) AND {c} <= toDateTime({t_s})"),
        "timeFilter_ms": one_arg(
            lambda c: (
                f"{c} >= fromUnixTimestamp64Milli({f_ms}) "
                f"AND {c} <= fromUnixTimestamp64Milli({t_ms})"
            )
        ),
        "dateFilter": one_arg(
            lambda c: f"{c} >= toDate('{start:%Y-%m-%d}') AND {c} <= toDate('{end:%Y-%m-%d}')"
        ),
        "timeInterval": one_arg(
            lambda c: f"toStartOfInterval(toDateTime({c}), INTERVAL {interval_s} second)"
        ),
        "timeInterval_ms": one_arg(
            lambda c: (
                f"toStartOfInterval(toDateTime64({c}, 3), INTERVAL {interval_s * 1000} millisecond)"
            )
        ),
        "interval_s": lambda _: str(interval_s),
    }
    out, pos = [], 0
    while match := _MACRO.search(sql, pos):
        name = match.group(1)
        if name not in macros:
            raise ValueError(f"unknown macro $__{name}")
        out.append(sql[pos : match.start()])
        end_at = match.end()
        args: list[str] = []
        if end_at < len(sql) and sql[end_at] == "(":
            args, end_at = _args(sql, end_at)
        out.append(macros[name](args))
        pos = end_at
    out.append(sql[pos:])
    return "".join(out)


def grafana_sql(
    sql: str,
    *,
    start: datetime,
    end: datetime,
    variables: dict[str, list[str]],
    interval_s: int | None = None,
) -> str:
    """A dashboard query as ClickHouse receives it."""
    if interval_s is None:
        interval_s = auto_interval(start, end)
    return expand_macros(interpolate(sql, variables), start=start, end=end, interval_s=interval_s)


def resolve_variables(
    templating: Sequence[dict[str, Any]],
    run: Callable[[str], list[tuple]],
    *,
    start: datetime,
    end: datetime,
) -> dict[str, list[str]]:
    """Each variable's selected values, in dashboard order, as Grafana picks them on load.

    Query variables run their SQL (with the variables before them filled in); "All" is selected
    where ``includeAll`` is set, else the first value. Other kinds keep their saved ``current``.
    """
    values: dict[str, list[str]] = {}
    for var in templating:
        name, kind = var["name"], var["type"]
        if kind == "query":
            sql = var["query"]["rawSql"] if isinstance(var["query"], dict) else var["query"]
            rows = run(grafana_sql(sql, start=start, end=end, variables=values))
            options = [str(r[0]) for r in rows]
            if not options:
                raise AssertionError(f"variable ${name} has no values")
            values[name] = options if var.get("includeAll") else options[:1]
        elif kind in ("custom", "textbox", "constant"):
            current = var["current"]["value"]
            values[name] = current if isinstance(current, list) else [str(current)]
        else:
            raise ValueError(f"variable ${name}: type {kind} is not handled here")
    return values


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value))
