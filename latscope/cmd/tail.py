"""``latscope tail``: which bucket the slowest requests spend their extra time in."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from latscope.cmd import _render as r
from latscope.cmd._source import add_filter_arguments, add_source_arguments, filters, run_query
from latscope.semconv import BUCKETS

if TYPE_CHECKING:
    from latscope.api.schemas import Tail

HELP = "the tail: where requests above the pXX spend their extra time, against the median"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_filter_arguments(parser)
    parser.add_argument(
        "--percentile", type=float, default=99, help="the tail starts here (default 99)"
    )
    parser.add_argument(
        "--exact", action="store_true", help="exact percentiles (slower over many requests)"
    )
    add_source_arguments(parser)


def render(body: Tail) -> None:
    from latscope.api.schemas import TailBucket

    none = TailBucket(tail_mean=None, median_mean=None, extra=None, extra_share=None)
    out = r.console()
    if not body.count:
        out.print("no attributed requests in this window (widen it with --since)")
        return
    out.print(
        Text(f"tail above p{body.percentile:g}", style="bold").append(
            f"  {body.tail_count} of {body.count} requests ≥ {r.ms(body.threshold_ms)}"
            f"; mean {r.ms(body.tail_e2e_ms)} against {r.ms(body.median_e2e_ms)} "
            f"for the median requests (+{r.ms(body.extra_e2e_ms)})",
            style="",
        )
    )
    table = Table(header_style="bold", box=None, pad_edge=False)
    for col, justify in (
        ("bucket", "left"),
        ("tail mean", "right"),
        ("median mean", "right"),
        ("extra", "right"),
        ("of extra", "right"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for b in BUCKETS:
        s = body.buckets_ms.get(b) or none
        style = "bold " + r.COLOURS[b] if b == body.dominant else r.COLOURS[b]
        table.add_row(
            Text(b, style=style),
            r.ms(s.tail_mean),
            r.ms(s.median_mean),
            r.ms(s.extra),
            r.pct(s.extra_share),
        )
    out.print(table)
    shares = [(body.buckets_ms.get(b) or none).extra_share for b in BUCKETS]
    if any(s is not None and s > 1 for s in shares):
        out.print(
            "a share above 100% means the other buckets were faster in the tail than in the "
            "median requests: that bucket alone adds more than the whole difference"
        )
    extra = {b: (body.buckets_ms.get(b) or none).extra for b in BUCKETS}
    out.print(r.stacked_bar({b: v for b, v in extra.items() if v and v > 0}))
    if body.dominant:
        out.print(Text(f"most of the tail is {body.dominant}", style="bold"))


def main(args: argparse.Namespace) -> int:
    from latscope.api.schemas import Tail

    return run_query(
        args,
        "looking at the tail",
        lambda source: source.ask(
            Tail, "tail", **filters(args), exact=args.exact or None, percentile=args.percentile
        ),
        render,
    )
