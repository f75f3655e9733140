"""``latscope report``: the latency budget over a window — percentiles per bucket and a stacked
bar of where the time went, overall and per service or model."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from latscope.cmd import _render as r
from latscope.cmd._source import add_filter_arguments, add_source_arguments, filters, run_query
from latscope.semconv import BUCKETS

if TYPE_CHECKING:
    from latscope.api.schemas import Summary, SummaryGroup

HELP = "the latency budget: percentiles per bucket and a stacked bar per service/model"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_filter_arguments(parser)
    parser.add_argument(
        "--group-by",
        default="model",
        help="one bar per service, model, route, operation, status or resource.<key> "
        "(default model; 'none' for no groups)",
    )
    parser.add_argument(
        "--exact", action="store_true", help="exact percentiles (slower over many requests)"
    )
    add_source_arguments(parser)


def _shares(section: Summary | SummaryGroup) -> dict[str, float | None]:
    return {b: section.buckets_ms[b].share for b in BUCKETS}


def render(body: Summary) -> None:
    out = r.console()
    window = body.window
    out.print(Text("latency budget", style="bold").append(f"  {body.count} requests", style=""))
    out.print(f"{window.since} → {window.until}", style="dim")
    if not body.count:
        out.print("no attributed requests in this window (widen it with --since)")
        return
    e2e = body.e2e_ms
    out.print(
        "e2e  "
        + "  ".join(f"{k} {r.ms(getattr(e2e, k))}" for k in ("p50", "p90", "p95", "p99", "mean"))
    )
    out.print()
    rows = [("all", body.count, _shares(body), e2e.p99)] + [
        (g.key or "(none)", g.count, _shares(g), g.e2e_ms.p99) for g in body.groups
    ]
    # The labels whole where they fit; the bars take what is left (10 to 40 cells).
    labels = max(len(row[0]) for row in rows)
    figures = max(len(str(row[1])) for row in rows) + max(len(r.ms(row[3])) for row in rows)
    bar = max(10, min(40, out.width - labels - figures - 6))
    bars = Table(box=None, pad_edge=False, show_header=False)
    bars.add_column("group", overflow="fold")
    bars.add_column("n", justify="right", no_wrap=True)
    bars.add_column("bar", no_wrap=True)
    bars.add_column("p99", justify="right", no_wrap=True)
    for key, count, shares, p99 in rows:
        bars.add_row(key, str(count), r.stacked_bar(shares, bar), r.ms(p99))
    out.print(bars)
    out.print(r.legend())
    out.print()
    table = Table(header_style="bold", box=None, pad_edge=False)
    table.add_column("bucket")
    for col in ("p50", "p95", "p99", "mean", "share"):
        table.add_column(col, justify="right")
    for b in BUCKETS:
        s = body.buckets_ms[b]
        table.add_row(
            Text(b, style=r.COLOURS[b]),
            r.ms(s.p50),
            r.ms(s.p95),
            r.ms(s.p99),
            r.ms(s.mean),
            r.pct(s.share),
        )
    out.print(table)
    streaming = body.streaming
    out.print()
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_p99_ms", "ITL p99")):
        figs = getattr(streaming, key)
        levels = ("p50", "p95", "p99")
        out.print(f"{label:8}" + "  ".join(f"{k} {r.ms(getattr(figs, k), 2)}" for k in levels))
    if streaming.stalled_requests:
        out.print(
            f"{streaming.stalled_requests} request(s) had inter-token stalls "
            f"({streaming.stalls} stalls)"
        )


def main(args: argparse.Namespace) -> int:
    from latscope.api.schemas import Summary

    group_by = None if args.group_by in ("", "none") else args.group_by
    return run_query(
        args,
        "summarising",
        lambda source: source.ask(
            Summary, "summary", **filters(args), exact=args.exact or None, group_by=group_by
        ),
        render,
    )
