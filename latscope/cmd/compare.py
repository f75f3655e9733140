"""``latscope compare``: two windows (e.g. before and after a deploy), bucket by bucket."""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table
from rich.text import Text

from latscope.cmd import _render as r
from latscope.cmd._source import Source, add_filter_arguments, add_source_arguments, run_command
from latscope.semconv import BUCKETS

HELP = "compare two windows bucket by bucket and name the biggest mover"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--after-since", default="1h", help="window under study: start (1h)")
    parser.add_argument("--after-until", default=None, help="window under study: end (now)")
    parser.add_argument(
        "--before-since", default=None, help="baseline start (default: same length just before)"
    )
    parser.add_argument("--before-until", default=None, help="baseline end")
    add_filter_arguments(parser, window=False)
    add_source_arguments(parser)


def _delta(d: dict[str, Any], *, share: bool = False) -> Text:
    fmt = r.pct if share else r.ms
    before, after, delta = d.get("before"), d.get("after"), d.get("delta")
    text = Text(f"{fmt(before)} → {fmt(after)} ")
    if delta is not None:
        sign = "+" if delta > 0 else ""
        text.append(f"({sign}{fmt(delta)})", style="red" if delta > 0 else "green")
    return text


def render(body: dict[str, Any]) -> None:
    out = r.console()
    b, a = body["before"], body["after"]
    out.print(Text("compare", style="bold"))
    out.print(f"before {b['since']} → {b['until']}  {b['count']} requests")
    out.print(f"after  {a['since']} → {a['until']}  {a['count']} requests")
    if not (a["count"] and b["count"]):
        out.print("one of the windows has no attributed requests")
        return
    table = Table(header_style="bold", box=None, pad_edge=False)
    for col in ("bucket", "p50", "p99", "mean", "share"):
        table.add_column(col)
    e2e = body["e2e_ms"]
    table.add_row(
        Text("e2e", style="bold"), _delta(e2e["p50"]), _delta(e2e["p99"]), _delta(e2e["mean"]), ""
    )
    for bucket in BUCKETS:
        d = body["buckets_ms"][bucket]
        style = "bold " + r.COLOURS[bucket] if bucket == body["mover"] else r.COLOURS[bucket]
        table.add_row(
            Text(bucket, style=style),
            _delta(d["p50"]),
            _delta(d["p99"]),
            _delta(d["mean"]),
            _delta(d["share"], share=True),
        )
    out.print(table)
    if body["mover"]:
        out.print(
            Text(
                f"biggest mover: {body['mover']} ({r.ms(body['mover_delta_ms'])} on the mean)",
                style="bold",
            )
        )


def main(args: argparse.Namespace) -> int:
    def body(source: Source) -> int:
        with r.progress("comparing windows"):
            answer = source.query(
                "compare",
                after_since=args.after_since,
                after_until=args.after_until,
                before_since=args.before_since,
                before_until=args.before_until,
                service=args.service,
                model=args.model,
            )
        if args.json:
            r.print_json(answer)
        else:
            render(answer)
        return 0

    return run_command(args, body)
