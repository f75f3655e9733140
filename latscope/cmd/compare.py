"""``latscope compare``: two windows (e.g. before and after a deploy), bucket by bucket."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from latscope.cmd import _render as r
from latscope.cmd._source import add_filter_arguments, add_source_arguments, filters, run_query
from latscope.semconv import BUCKETS

if TYPE_CHECKING:
    from latscope.api.schemas import Compare, Delta

HELP = "compare two windows bucket by bucket and name the biggest mover"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--after-since", default="1h", help="window under study: start (1h)")
    parser.add_argument("--after-until", default=None, help="window under study: end (now)")
    parser.add_argument(
        "--before-since", default=None, help="baseline start (default: same length just before)"
    )
    parser.add_argument("--before-until", default=None, help="baseline end")
    add_filter_arguments(parser, window=False)
    parser.add_argument(
        "--exact", action="store_true", help="exact percentiles (slower over many requests)"
    )
    add_source_arguments(parser)


def _num(value: float | None, *, share: bool = False) -> str:
    if value is None:
        return "—"
    return f"{value * 100:.1f}%" if share else f"{value:.1f}"


def _change(value: float | None, *, share: bool = False) -> Text:
    if value is None:
        return Text("—")
    text = ("+" if value > 0 else "") + _num(value, share=share)
    return Text(text, style="red" if value > 0 else "green" if value < 0 else "")


def render(body: Compare) -> None:
    out = r.console()
    b, a = body.before, body.after
    out.print(Text("compare", style="bold"))
    out.print(f"before {b.since} → {b.until}  {b.count} requests")
    out.print(f"after  {a.since} → {a.until}  {a.count} requests")
    if not (a.count and b.count):
        out.print("one of the windows has no attributed requests")
        return
    table = Table(header_style="bold", box=None, pad_edge=False)
    table.add_column("ms", no_wrap=True, min_width=11)
    for col in ("p50 was", "p50 now", "Δp50", "p99 was", "p99 now", "Δp99", "Δmean", "Δshare"):
        table.add_column(col, justify="right", no_wrap=True)

    def row(name: Text, d: dict[str, Delta], share: Delta | None) -> None:
        table.add_row(
            name,
            _num(d["p50"].before),
            _num(d["p50"].after),
            _change(d["p50"].delta),
            _num(d["p99"].before),
            _num(d["p99"].after),
            _change(d["p99"].delta),
            _change(d["mean"].delta),
            _change(share.delta, share=True) if share else Text(""),
        )

    row(Text("e2e", style="bold"), body.e2e_ms, None)
    for bucket in BUCKETS:
        d = body.buckets_ms[bucket]
        style = "bold " + r.COLOURS[bucket] if bucket == body.mover else r.COLOURS[bucket]
        row(Text(bucket, style=style), d, d["share"])
    # Narrow terminals keep the changes and drop what they were first.
    out.print(r.fit(table, drop=("p50 was", "p99 was", "Δshare", "p50 now")))
    if body.mover:
        out.print(
            Text(
                f"biggest mover: {body.mover} ({r.ms(body.mover_delta_ms)} on the mean)",
                style="bold",
            )
        )


def main(args: argparse.Namespace) -> int:
    from latscope.api.schemas import Compare

    return run_query(
        args,
        "comparing windows",
        lambda source: source.ask(
            Compare,
            "compare",
            after_since=args.after_since,
            after_until=args.after_until,
            before_since=args.before_since,
            before_until=args.before_until,
            **filters(args),
            exact=args.exact or None,
        ),
        render,
    )
