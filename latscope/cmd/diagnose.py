"""``latscope diagnose``: the dominant bucket, the usual cause and its first fixes."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rich.text import Text

from latscope.cmd import _render as r
from latscope.cmd._source import add_filter_arguments, add_source_arguments, filters, run_query

if TYPE_CHECKING:
    from latscope.api.schemas import Diagnosis, VerdictWhere

HELP = "name the dominant bucket, its usual cause and first fixes, with the numbers"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_filter_arguments(parser)
    parser.add_argument("--percentile", type=float, default=99, help="tail percentile (99)")
    add_source_arguments(parser)


def _figure(key: str, value: Any) -> str:
    """One evidence figure as the rest of the output writes it: ms, shares, times, lists."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) and key.endswith("_ns"):
        return _when(value)
    if isinstance(value, float):
        if key.endswith("_ms"):
            return r.ms(value)
        if "share" in key:
            return r.pct(value)
        return f"{value:.3g}"
    if isinstance(value, Mapping):  # per bucket (or per part): the non-zero ones, largest first
        parts = sorted(((k, v) for k, v in value.items() if v), key=lambda kv: -abs(kv[1]))
        return "(" + ", ".join(f"{k} {_figure(key, v)}" for k, v in parts) + ")"
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    return str(value)


def _label(key: str) -> str:
    """``since_ns`` reads as ``since``: the unit is in the figure."""
    return key.removesuffix("_ns")


def _when(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def where_text(where: VerdictWhere) -> str:
    """``k8s.pod.name = llm-7 since 2026-01-02 14:05 UTC (81% of them, 9% of the others)``."""
    since = where.since_ns
    when = (
        datetime.fromtimestamp(since / 1e9, UTC).strftime(" since %Y-%m-%d %H:%M UTC")
        if since
        else ""
    )
    return (
        f"{where.dimension} = {where.value}{when} ({where.in_share * 100:.0f}% of "
        f"{where.selection}, {where.out_share * 100:.0f}% of the others)"
    )


def render(body: Diagnosis) -> None:
    out = r.console()
    if not body.count:
        out.print("no attributed requests in this window (widen it with --since)")
        return
    head = Text("diagnosis", style="bold").append(f"  {body.count} requests", style="")
    out.print(head)
    if body.dominant:
        out.print(
            Text("most time: ")
            .append(body.dominant, style="bold " + r.COLOURS.get(body.dominant, ""))
            .append("   most of the tail: ")
            .append(
                str(body.tail_dominant),
                style="bold " + r.COLOURS.get(body.tail_dominant or "", ""),
            )
        )
    if not body.verdicts:
        out.print("no known pattern stands out; look at `latscope tail` and `latscope report`")
        return
    for i, v in enumerate(body.verdicts, 1):
        out.print()
        out.print(Text(f"{i}. {v.cause}", style="bold"))
        out.print(Text(f"   bucket: {v.bucket}", style=r.COLOURS.get(v.bucket, "")))
        if v.where:
            out.print(Text("   where: ", style="bold").append(where_text(v.where)))
        out.print("   evidence: " + ", ".join(
            f"{_label(k)} {_figure(k, val)}" for k, val in v.evidence.items() if val is not None
        ))  # fmt: skip
        for fix in v.fixes:
            out.print(f"   → {fix}")


def main(args: argparse.Namespace) -> int:
    from latscope.api.schemas import Diagnosis

    return run_query(
        args,
        "diagnosing",
        lambda source: source.ask(
            Diagnosis, "diagnose", **filters(args), percentile=args.percentile
        ),
        render,
    )
