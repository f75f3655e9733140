"""``latscope timeline``: since when — the window's figures per time step, as sparklines (or a
table with ``--table``): requests, e2e p50 and p99, each bucket's share, TTFT and TPOT."""

from __future__ import annotations

import argparse
import math
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from latscope.api.timerange import TimeRangeError, parse_range
from latscope.cmd import _render as r
from latscope.cmd._source import add_filter_arguments, add_source_arguments, filters, run_query
from latscope.semconv import BUCKETS
from latscope.windows import STEPS_S, choose_step

if TYPE_CHECKING:
    from latscope.api.schemas import StepPoint, Timeseries

HELP = "over time: e2e, each bucket's share, TTFT and TPOT per step, as sparklines"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_filter_arguments(parser)
    parser.add_argument(
        "--step", default=None, help="time step: 30s, 5m, 1h (default: from the window)"
    )
    parser.add_argument(
        "--group-by",
        default=None,
        help="also e2e p99 per service, model, route, operation, status or resource.<key>",
    )
    parser.add_argument(
        "--table", action="store_true", help="one row per step instead of sparklines"
    )
    add_source_arguments(parser)


#: Columns the sparklines leave for the labels and the peak.
LABEL_COLUMNS = 34


def step_for(args: argparse.Namespace, width: int) -> str | None:
    """The step that fits the window's sparklines in ``width`` columns (None: let the API
    choose, when the window cannot be read here; it then says what is wrong)."""
    if args.step:
        return str(args.step)
    try:
        window = parse_range(args.since, args.until)
    except TimeRangeError:
        return None
    seconds = (window.until - window.since).total_seconds()
    cells = max(20, width - LABEL_COLUMNS)
    fits = [s for s in STEPS_S if math.ceil(seconds / s) <= cells and s >= choose_step(seconds)]
    return f"{fits[0] if fits else STEPS_S[-1]}s"


def _clock(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%m-%d %H:%M:%S")


def step_label(ns: int, step_s: float) -> str:
    """A step's start as precise as the step: seconds below a minute, no time of day for days."""
    if step_s < 60:
        fmt = "%m-%d %H:%M:%S"
    elif step_s < 86_400:
        fmt = "%m-%d %H:%M"
    else:
        fmt = "%Y-%m-%d"
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime(fmt)


def _peak(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    return r.ms(max(known)) if known else "—"


def render(body: Timeseries, *, table: bool = False) -> None:
    out = r.console()
    total, *groups = body.series
    points = total.points
    window = body.window
    out.print(
        Text("over time", style="bold").append(
            f"  {total.count} requests, {len(points)} steps of {body.step_s} s", style=""
        )
    )
    out.print(f"{window.since} → {window.until}", style="dim")
    if not total.count:
        out.print("no attributed requests in this window (widen it with --since)")
        return
    if table:
        _table(out, points, body.step_s)
        return
    rows = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
    rows.add_column("figure", no_wrap=True)
    rows.add_column(f"{_clock(points[0].start_ns)} → {_clock(points[-1].end_ns)}")
    rows.add_column("peak", justify="right", no_wrap=True)

    def line(label: str, values: list[float | None], peak: str, style: str = "") -> None:
        rows.add_row(Text(label, style=style), r.sparkline(values), peak)

    line("requests", [p.count for p in points], str(max(p.count for p in points)))
    for name in ("p50", "p99"):
        values = [getattr(p.e2e_ms, name) for p in points]
        line(f"e2e {name}", values, _peak(values), "bold")
    for b in BUCKETS:
        shares = [p.buckets_ms[b].share for p in points]
        known = [s for s in shares if s is not None]
        line(f"{b} share", shares, r.pct(max(known)) if known else "—", r.COLOURS[b])
    for figure in ("ttft_ms", "tpot_ms"):
        values = [getattr(p, figure).p99 for p in points]
        line(f"{figure[:4]} p99", values, _peak(values))
    for group in groups:
        values = [p.e2e_ms.p99 for p in group.points]
        line(f"{group.key or '(none)'} p99", values, _peak(values))
    out.print(rows)


def _num(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _table(out: Any, points: list[StepPoint], step_s: float) -> None:
    grid = Table(header_style="bold", box=None, pad_edge=False)
    for col in ("step (UTC)", "n", "e2e p50", "e2e p99", "where the time went", "ttft p99",
                "tpot p99"):  # fmt: skip
        grid.add_column(col, justify="left" if col[0] in "sw" else "right", no_wrap=True)
    for p in points:
        shares = {b: p.buckets_ms[b].share for b in BUCKETS}
        grid.add_row(
            step_label(p.start_ns, step_s),
            str(p.count),
            _num(p.e2e_ms.p50),
            _num(p.e2e_ms.p99),
            r.stacked_bar(shares, 20),
            _num(p.ttft_ms.p99),
            _num(p.tpot_ms.p99, 1),
        )
    out.print(r.fit(grid, drop=("e2e p50", "tpot p99")))
    out.print("times in ms", style="dim")
    out.print(r.legend())


def main(args: argparse.Namespace) -> int:
    from latscope.api.schemas import Timeseries

    return run_query(
        args,
        "reading the window step by step",
        lambda source: source.ask(
            Timeseries,
            "timeseries",
            **filters(args),
            step=step_for(args, r.console().width) if not args.table else args.step,
            group_by=args.group_by,
        ),
        lambda answer: render(answer, table=args.table),
    )
