"""``latscope why``: what is different about the slow requests (or an SLO's bad ones, or a time
range against the one before), dimension by dimension, and where their extra time went."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from latscope.cmd import _render as r
from latscope.cmd._source import (
    SourceError,
    add_filter_arguments,
    add_source_arguments,
    filters,
    run_query,
)

if TYPE_CHECKING:
    from latscope.api.schemas import Why

HELP = "what is different about the slowest requests: dimensions ranked, extra time by bucket"

#: Fewer requests than this on either side are too few to tell a pattern from chance.
FEW = 5
#: Dimensions shown, and values per dimension.
SHOW_DIMENSIONS = 6


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_filter_arguments(parser)
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument(
        "--percentile",
        type=float,
        default=None,
        help="the requests at or above this percentile of --metric (default: 99)",
    )
    chosen.add_argument(
        "--slo",
        metavar="METRIC:MS",
        help="an objective's bad requests, e.g. ttft:500 (TTFT above 500 ms)",
    )
    chosen.add_argument(
        "--before",
        action="store_true",
        help="the whole window against the window of the same length just before it",
    )
    chosen.add_argument(
        "--region",
        metavar="MIN_MS:MAX_MS",
        help="requests with --metric in [MIN_MS, MAX_MS) (either may be empty), started in "
        "--region-since..--region-until (default: the window): a rectangle of the heatmap",
    )
    parser.add_argument("--region-since", default=None, help="start of the region")
    parser.add_argument("--region-until", default=None, help="end of the region")
    parser.add_argument(
        "--metric",
        default="e2e",
        help="what the percentile or region is on: e2e, a bucket, ttft or tpot (default e2e)",
    )
    parser.add_argument(
        "--attribute",
        action="append",
        metavar="KEY",
        help="also rank this span attribute (e.g. tenant.id); repeat for several",
    )
    parser.add_argument(
        "--resource",
        action="append",
        metavar="KEY",
        help="also rank this resource attribute (beside service.instance.id, k8s.pod.name, "
        "host.name, cloud.availability_zone, ...); repeat for several",
    )
    parser.add_argument(
        "--values", type=int, default=3, help="values shown per dimension (default 3)"
    )
    add_source_arguments(parser)


def _when(ns: int | None) -> str:
    if ns is None:
        return "—"
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _selection(args: argparse.Namespace) -> dict[str, Any]:
    if args.slo:
        return {"selection": "slo", "objective": args.slo}
    if args.before:
        return {"selection": "before"}
    if args.region is not None:
        lo, _, hi = args.region.partition(":")
        try:
            bounds = {
                "min_ms": float(lo) if lo else None,
                "max_ms": float(hi) if hi else None,
            }
        except ValueError:
            raise SourceError(
                f"--region {args.region!r}: write MIN_MS:MAX_MS, e.g. 2000:8000 or 2000:",
                exit_code=2,
            ) from None
        return {
            "selection": "region",
            "metric": args.metric,
            "sel_since": args.region_since,
            "sel_until": args.region_until,
            **bounds,
        }
    return {"selection": "percentile", "metric": args.metric, "percentile": args.percentile}


def render(body: Why) -> None:
    out = r.console()
    sel, base = body.selection, body.baseline
    out.print(
        Text("what is different", style="bold").append(
            f"  {sel.count} requests: {sel.description}; against {base.count}: {base.description}",
            style="",
        )
    )
    if not sel.count or not base.count:
        out.print("nothing to compare in this window (widen it with --since)")
        return
    out.print(
        f"mean e2e {r.ms(sel.e2e_mean_ms)} against {r.ms(base.e2e_mean_ms)} "
        f"(+{r.ms(body.extra_e2e_ms)}), most of it {body.dominant or '—'}"
    )
    out.print(r.stacked_bar({b: v for b, v in dict(body.extra_buckets_ms).items() if v and v > 0}))
    top = body.top
    if top:
        out.print(
            Text("→ ", style="bold")
            .append(f"{top.dimension} = {top.value}", style="bold")
            .append(
                f": {top.in_share * 100:.0f}% of these requests against "
                f"{top.out_share * 100:.0f}% of the others; +{r.ms(top.extra_ms)} each, "
                f"mostly {top.dominant or '—'}; since {_when(top.since_ns)}"
            )
        )
    few = min(sel.count, base.count) < FEW
    if not body.dimensions:
        out.print(
            f"no dimension sets these {sel.count} requests apart from the other "
            f"{base.count}" + ("; too few to compare (widen it with --since)" if few else "")
        )
        return
    if few:
        out.print(
            f"only {sel.count} against {base.count} requests: too few to tell a pattern "
            "from chance (widen the window with --since)",
            style="yellow",
        )
    table = Table(header_style="bold", box=None, pad_edge=False)
    for col, justify in (
        ("dimension", "left"),
        ("value", "left"),
        ("here", "right"),
        ("rest", "right"),
        ("extra each", "right"),
        ("mostly", "left"),
    ):
        # The names wrap; the figures never do.
        table.add_column(col, justify=justify, no_wrap=col not in ("dimension", "value"))  # type: ignore[arg-type]
    for dim in body.dimensions[:SHOW_DIMENSIONS]:
        for i, v in enumerate(dim.values):
            table.add_row(
                Text(dim.dimension if i == 0 else "", style="bold" if i == 0 else ""),
                v.value or "(none)",
                f"{v.in_share * 100:.0f}%",
                f"{v.out_share * 100:.0f}%",
                r.ms(v.extra_ms),
                Text(v.dominant or "—", style=r.COLOURS.get(v.dominant or "", "")),
            )
    out.print(r.fit(table, drop=("mostly",)))
    if body.examples:
        out.print(
            "slowest of them: "
            + ", ".join(f"{e.trace_id} ({r.ms(e.e2e_ms)})" for e in body.examples[:3]),
            style="dim",
        )


def main(args: argparse.Namespace) -> int:
    from latscope.api.schemas import Why

    return run_query(
        args,
        "comparing the requests",
        lambda source: source.ask(
            Why,
            "why",
            **filters(args),
            attribute=args.attribute,
            resource=args.resource,
            limit_values=max(1, args.values),
            **_selection(args),
        ),
        render,
    )
