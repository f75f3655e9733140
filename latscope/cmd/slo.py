"""``latscope slo``: error budget left and burn rates of latency objectives."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from latscope.cmd import _render as r
from latscope.cmd._source import add_filter_arguments, add_source_arguments, filters, run_query
from latscope.windows import ALERTS, BURN_WINDOWS_S

if TYPE_CHECKING:
    from latscope.api.schemas import ObjectiveStatus, Slo

HELP = "SLOs on TTFT / TPOT / e2e: error budget left and 5m/30m/1h/6h/3d burn rates"
#: A window's burn rate shows red above the highest limit of the alerts it takes part in.
_LIMITS = {
    window: max(limit for long, short, limit in ALERTS.values() if window in (long, short))
    for window in BURN_WINDOWS_S
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--objective",
        action="append",
        metavar="METRIC:MS:TARGET[:DAYS]",
        help="e.g. ttft:500:0.99:30 (99%% of requests TTFT <= 500 ms over 30 days); repeat "
        "for several (default: ttft:500:0.99:30, tpot:50:0.99:30, e2e:10000:0.99:30)",
    )
    parser.add_argument("--at", default=None, help="evaluate as of (default now)")
    add_filter_arguments(parser, window=False)
    add_source_arguments(parser)


def _rate(value: float | None, limit: float) -> Text:
    if value is None:
        return Text("—")
    return Text(f"{value:.1f}x", style="bold red" if value > limit else "")


def spent_on(objective: ObjectiveStatus) -> Text | None:
    """Where each burn window's budget went: the bucket of the bad requests' extra time."""
    spent = objective.budget_by_bucket or {}
    parts = [
        (window, figures.dominant, figures.extra_e2e_ms)
        for window in BURN_WINDOWS_S
        if (figures := spent.get(window)) and figures.bad and figures.dominant
    ]
    if not parts:
        return None
    text = Text(f"{objective.name}: the budget went to ")
    for i, (window, bucket, extra) in enumerate(parts):
        text.append(", " if i else "").append(bucket, style="bold " + r.COLOURS.get(bucket, ""))
        text.append(f" ({window}, +{r.ms(extra)} a bad request)")
    return text


def render(body: Slo) -> None:
    out = r.console()
    table = Table(header_style="bold", box=None, pad_edge=False)
    for col in ("objective", "n", "met", "budget", *BURN_WINDOWS_S, "alert"):
        text = col in ("objective", "alert")  # these wrap; the figures never do
        table.add_column(col, justify="left" if text else "right", no_wrap=not text)
    for o in body.objectives:
        rates = o.burn_rates
        alerts = [name for name, on in o.alerts.items() if on]
        met = "—" if o.met is None else ("yes" if o.met else "NO")
        table.add_row(
            o.name,
            str(o.total),
            Text(met, style="" if o.met is not False else "bold red"),
            r.pct(o.budget_left),
            *(_rate(rates.get(w), _LIMITS[w]) for w in BURN_WINDOWS_S),
            Text(", ".join(alerts) or "ok", style="bold red" if alerts else "green"),
        )
    out.print(Text(f"SLOs as of {body.at}", style="bold"))
    # Narrow terminals keep the fast-burn pair (1h, 5m) longest: what pages first; the
    # ticket's 3d goes first.
    out.print(r.fit(table, drop=("3d", "30m", "6h", "n", "5m")))
    for o in body.objectives:
        if (line := spent_on(o)) is not None:
            out.print(line)
    out.print(
        "budget: error budget left; 5m..3d: burn rates (1x spends the budget exactly over the "
        "window); the budget went to: the bucket where the requests that missed the objective "
        "spent their extra time; alerts: "
        + ", ".join(
            f"{name} = {long} and {short} over {limit:g}x"
            for name, (long, short, limit) in ALERTS.items()
        ),
        style="dim",
    )


def main(args: argparse.Namespace) -> int:
    from latscope.api.schemas import Slo

    return run_query(
        args,
        "computing burn rates",
        lambda source: source.ask(
            Slo, "slo", objective=args.objective, at=args.at, **filters(args)
        ),
        render,
    )
