"""``latscope coldstart``: replicas that appeared, their warm-up requests, and warm-up against
warm latency bucket by bucket."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from latscope.cmd import _render as r
from latscope.cmd._source import add_filter_arguments, add_source_arguments, filters, run_query
from latscope.semconv import BUCKETS

if TYPE_CHECKING:
    from latscope.api.schemas import ColdStart

HELP = "cold starts: replicas that appeared, their warm-up requests against warm, by bucket"
#: Replicas listed at most (the newest first); the figures cover every replica.
SHOW_REPLICAS = 12


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_filter_arguments(parser)
    parser.add_argument(
        "--warmup-requests",
        type=int,
        default=None,
        metavar="N",
        help="a new replica warms up for its first N requests (default: the server's rule)",
    )
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=None,
        metavar="S",
        help="...and its first S seconds (default: the server's rule)",
    )
    add_source_arguments(parser)


def _when(ns: int | None) -> str:
    if not ns:
        return "—"
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S")


def render(body: ColdStart) -> None:
    out = r.console()
    rule = body.rule
    firsts = [
        f"{rule.warmup_requests} requests" if rule.warmup_requests else "",
        f"{rule.warmup_s:g} s" if rule.warmup_s else "",
    ]
    out.print(
        Text("cold starts", style="bold").append(
            f"  {body.appeared} of {body.replica_count} replicas appeared in the window; "
            f"warm-up: a new replica's first {' and '.join(f for f in firsts if f)}",
            style="",
        )
    )
    if not body.replica_count:
        out.print(
            "no request names its replica (service.instance.id, k8s.pod.name or host.name)"
            if body.unidentified
            else "no attributed requests in this window (widen it with --since)"
        )
        return
    for up in body.scale_ups:
        out.print(
            f"scale-up at {_when(up.at_ns)} UTC: {up.count} replica(s) "
            f"({', '.join(up.replicas)}), warm {up.warmup_s:.1f} s later"
        )
    warmup, warm = body.warmup, body.warm
    if not warmup.count:
        out.print("no warm-up requests in this window: every replica served warm")
    else:
        table = Table(header_style="bold", box=None, pad_edge=False)
        table.add_column("mean", no_wrap=True)
        for col in ("warm-up", "warm", "extra"):
            table.add_column(col, justify="right", no_wrap=True)
        extra = body.extra_buckets_ms
        table.add_row(
            Text("e2e", style="bold"),
            r.ms(warmup.e2e_mean_ms),
            r.ms(warm.e2e_mean_ms),
            r.ms(body.extra_e2e_ms),
        )
        for b in BUCKETS:
            style = "bold " + r.COLOURS[b] if b == body.dominant else r.COLOURS[b]
            table.add_row(
                Text(b, style=style),
                r.ms(getattr(warmup.buckets_ms, b)),
                r.ms(getattr(warm.buckets_ms, b)),
                r.ms(getattr(extra, b)),
            )
        out.print(f"{warmup.count} warm-up requests against {warm.count} warm")
        out.print(r.fit(table))
        if body.dominant:
            out.print(f"a warm-up request's extra time is mostly {body.dominant}")
    replicas = Table(header_style="bold", box=None, pad_edge=False)
    for col in ("replica", "first seen (UTC)", "new", "requests", "warm-up", "warm-up mean",
                "warm mean"):  # fmt: skip
        name = col == "replica"
        replicas.add_column(col, justify="left" if name or col in ("new", "first seen (UTC)")
                            else "right", no_wrap=not name)  # fmt: skip
    for rep in body.replicas[:SHOW_REPLICAS]:
        replicas.add_row(
            f"{rep.service}/{rep.replica}",
            _when(rep.first_seen_ns),
            Text("yes", style="bold") if rep.appeared else "",
            str(rep.requests),
            str(rep.warmup_requests),
            r.ms(rep.warmup_e2e_mean_ms),
            r.ms(rep.warm_e2e_mean_ms),
        )
    out.print()
    out.print(r.fit(replicas, drop=("warm-up mean", "first seen (UTC)", "requests")))
    if len(body.replicas) > SHOW_REPLICAS:
        out.print(f"  … and {len(body.replicas) - SHOW_REPLICAS} more")


def main(args: argparse.Namespace) -> int:
    from latscope.api.schemas import ColdStart

    return run_query(
        args,
        "looking for cold starts",
        lambda source: source.ask(
            ColdStart,
            "coldstart",
            **filters(args),
            warmup_requests=args.warmup_requests,
            warmup_s=args.warmup_s,
        ),
        render,
    )
