"""``latscope span TRACE_ID SPAN_ID``: one span as stored, every attribute value whole (a prompt or
completion the trace's answers show cut), with its resource, events and links."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from latscope.cmd import _render as r
from latscope.cmd._source import add_source_arguments, run_query

if TYPE_CHECKING:
    from latscope.api.schemas import StoredSpan

HELP = "one span as stored: every attribute value whole, its resource, events and links"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace_id", metavar="TRACE_ID", help="32 hexadecimal characters")
    parser.add_argument(
        "span_id",
        metavar="SPAN_ID",
        help="16 hexadecimal characters (`latscope explain --json` and /v1/traces/{id}/spans "
        "list a trace's spans)",
    )
    add_source_arguments(parser)


def _when(ns: int) -> str:
    at = datetime.fromtimestamp(ns // 10**9, UTC).strftime("%Y-%m-%d %H:%M:%S")
    return f"{at}.{ns % 10**9:09d} UTC"


def _pairs(title: str, values: dict[str, str]) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold", box=None, pad_edge=False)
    table.add_column("key", style="cyan", no_wrap=True)
    table.add_column("value", overflow="fold")
    for key, value in sorted(values.items()):
        table.add_row(key, value)
    return table


def render(span: StoredSpan) -> None:
    out = r.console()
    header = Text(f"span {span.span_id}", style="bold")
    header.append(f"  {span.name}  {span.kind}  {span.service}", style="")
    out.print(header)
    out.print(f"trace {span.trace_id}  parent {span.parent_span_id or '(root)'}")
    out.print(f"start {_when(span.start_unix_ns)}  duration {r.ms(span.duration_ms)}")
    status = span.status + (f": {span.status_message}" if span.status_message else "")
    out.print(f"status {status}")
    out.print(_pairs("attributes", span.attributes))
    out.print(_pairs("resource", span.resource))
    for event in span.events:
        out.print(_pairs(f"event {event['name']} at {_when(event['at_unix_ns'])}",
                         event["attributes"]))  # fmt: skip
    for link in span.links:
        out.print(_pairs(f"link to {link['trace_id']}-{link['span_id']}", link["attributes"]))


def main(args: argparse.Namespace) -> int:
    from latscope.api.schemas import StoredSpan

    return run_query(
        args,
        "reading the span",
        lambda source: source.ask(StoredSpan, "span", trace_id=args.trace_id, span_id=args.span_id),
        render,
    )
