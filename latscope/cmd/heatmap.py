"""``latscope heatmap``: requests per time step and latency bin, as a compact table."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from latscope.cmd import _render as r
from latscope.cmd._source import add_filter_arguments, add_source_arguments, filters, run_query
from latscope.cmd.timeline import step_for, step_label
from latscope.windows import HEATMAP_METRICS

if TYPE_CHECKING:
    from latscope.api.schemas import Heatmap

HELP = "a latency heatmap: requests per time step and latency bin (e2e, a bucket, ttft, tpot)"
#: Darker is more requests: a cell's share of the busiest cell, in eighths.
SHADES = " ·░░▒▒▓▓█"
#: Bins shown at most, the busiest range of them (the API's bins run a decade per 10 rows).
MAX_ROWS = 24
#: What the label columns (the bin's range) leave of the terminal for the time steps.
LABEL_COLUMNS = 24


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_filter_arguments(parser)
    parser.add_argument(
        "--metric", default="e2e", choices=HEATMAP_METRICS, help="what to bin (default e2e)"
    )
    parser.add_argument(
        "--step", default=None, help="time step: 30s, 5m, 1h (default: what fits the terminal)"
    )
    add_source_arguments(parser)


def _range(lo: float, hi: float) -> str:
    return f"{r.ms(lo, 0 if lo >= 10 else 1)} – {r.ms(hi, 0 if hi >= 10 else 1)}"


def render(body: Heatmap) -> None:
    out = r.console()
    window = body.window
    out.print(
        Text(f"{body.metric} heatmap", style="bold").append(
            f"  {body.count} requests, {len(body.times_ns)} steps of {body.step_s} s",
            style="",
        )
    )
    out.print(f"{window.since} → {window.until}", style="dim")
    if not body.count:
        out.print("no attributed requests in this window (widen it with --since)")
        return
    counts, bins = body.counts, body.bins
    used = [j for j in range(len(bins)) if any(step[j] for step in counts)]
    # The rows that hold requests, at most MAX_ROWS of them around the busiest.
    lo, hi = used[0], used[-1]
    while hi - lo + 1 > MAX_ROWS:
        weight = [sum(step[j] for step in counts) for j in (lo, hi)]
        lo, hi = (lo + 1, hi) if weight[0] <= weight[1] else (lo, hi - 1)
    peak = body.max_count or 1
    table = Table(box=None, pad_edge=False, padding=0, show_header=False)
    table.add_column("bin", justify="right", no_wrap=True)
    table.add_column("cells", no_wrap=True)
    table.add_column("n", justify="right", no_wrap=True)
    for j in range(hi, lo - 1, -1):  # slowest on top, as the web page draws it
        cells = Text()
        for step in counts:
            n = step[j]
            cells.append(SHADES[min(8, -(-n * 8 // peak))] if n else " ", style="magenta")
        total = sum(step[j] for step in counts)
        table.add_row(f"{_range(bins[j].lo_ms, bins[j].hi_ms)} │", cells, f" {total}")
    out.print(table)
    times = body.times_ns
    first, last = step_label(times[0], body.step_s), step_label(times[-1], body.step_s)
    width = len(times)
    axis = first + " " * max(1, width - len(first) - len(last)) + last if width > 24 else first
    label = max(len(_range(bins[j].lo_ms, bins[j].hi_ms)) for j in range(lo, hi + 1))
    out.print(" " * (label + 2) + axis, style="dim")
    hidden = sum(sum(step[j] for j in range(len(bins)) if not lo <= j <= hi) for step in counts)
    note = f"darker: more requests (busiest cell {peak}); UTC"
    if hidden:
        note += f"; {hidden} requests in rows not shown"
    if any(body.zero_counts):
        note += f"; {sum(body.zero_counts)} at 0 ms"
    out.print(note, style="dim")


def main(args: argparse.Namespace) -> int:
    from latscope.api.schemas import Heatmap

    return run_query(
        args,
        "binning the window",
        lambda source: source.ask(
            Heatmap,
            "heatmap",
            **filters(args),
            metric=args.metric,
            step=step_for(args, r.console().width - LABEL_COLUMNS + 34),
        ),
        render,
    )
