"""``latscope explain TRACE_ID``: one request's buckets, span waterfall and token timeline."""

from __future__ import annotations

import argparse
from typing import Any

from rich.text import Text

from latscope.cmd import _render as r
from latscope.cmd._source import Source, add_source_arguments, run_command

HELP = "one request: its latency buckets, span waterfall and token timeline"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace_id", metavar="TRACE_ID", help="32 hexadecimal characters")
    parser.add_argument(
        "--stall-ms",
        type=float,
        default=None,
        help="inter-token gaps longer than this are stalls (default: the attributor's, 250 ms)",
    )
    add_source_arguments(parser)


def render(body: dict[str, Any]) -> None:
    out = r.console()
    a, spans, tokens = body["attribution"], body["spans"], body["tokens"]
    e2e = a["e2e_ms"]
    header = Text(f"request {a['trace_id']}", style="bold")
    header.append(f"  {a['service']}  {a['model'] or '(no model)'}  e2e {r.ms(e2e)}")
    out.print(header)
    out.print(r.stacked_bar(a["buckets_ms"]))
    out.print(r.legend())
    out.print(r.attribution_table(a))
    if a["buckets_ms"].get("network") is None:
        out.print(Text("network unknown: no client span was seen", style="italic"))
    if a.get("clock_skew_ms"):
        out.print(f"server clock runs {r.ms(a['clock_skew_ms'])} ahead of the client's (adjusted)")
    out.print()
    out.print(Text("spans", style="bold"))
    out.print(r.waterfall(spans, e2e))
    out.print()
    out.print(Text("tokens", style="bold"))
    if not tokens["count"]:
        out.print("no token times recorded")
        return
    out.print(r.token_strip(tokens, e2e))
    itl = a["itl_ms"]
    out.print(
        f"{tokens['count']} tokens  TTFT {r.ms(a['ttft_ms'])}  TPOT {r.ms(a['tpot_ms'], 2)}\n"
        f"ITL p50 {r.ms(itl['p50'], 2)}  p99 {r.ms(itl['p99'], 2)}  max {r.ms(itl['max'], 2)}"
    )
    stalls = tokens["stalls"]
    threshold = r.ms(tokens["stall_threshold_ms"], 2)
    if stalls:
        out.print(Text(f"{len(stalls)} stall(s) over {threshold}:", style="bold red"))
        for s in stalls[:10]:
            out.print(f"  token {s['index']} at {r.ms(s['at_ms'])} after a {r.ms(s['gap_ms'])} gap")
        if len(stalls) > 10:
            out.print(f"  … and {len(stalls) - 10} more")
    else:
        out.print(f"no stalls (threshold {threshold})")


def main(args: argparse.Namespace) -> int:
    def body(source: Source) -> int:
        with r.progress(f"explaining {args.trace_id}"):
            answer = source.query("explain", request_id=args.trace_id, stall_ms=args.stall_ms)
        if args.json:
            r.print_json(answer)
        else:
            render(answer)
        return 0

    return run_command(args, body)
