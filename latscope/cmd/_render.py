"""Terminal rendering shared by the query commands (rich): bucket colours, stacked bars,
tables, the waterfall and the token timeline."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from latscope.semconv import BUCKETS

#: One colour per bucket, the same order and hues as the web page.
COLOURS: dict[str, str] = {
    "network": "blue",
    "queue": "dark_orange",
    "preprocess": "cyan",
    "prefill": "magenta",
    "decode": "green",
    "postprocess": "yellow",
    "other": "grey50",
}
BAR_WIDTH = 60


def console() -> Console:
    return Console(highlight=False, soft_wrap=False)


@contextmanager
def progress(message: str) -> Iterator[None]:
    """A spinner on stderr while a query runs (only on a terminal, so scripts stay clean)."""
    err = Console(stderr=True)
    if not err.is_terminal:
        yield
        return
    with err.status(message, spinner="dots"):
        yield


def print_json(body: Any) -> None:
    sys.stdout.write(json.dumps(body, indent=2, sort_keys=False) + "\n")


def ms(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "—"
    if abs(value) >= 10_000:
        return f"{value / 1000:.2f} s"
    return f"{value:.{digits}f} ms"


def pct(value: float | None) -> str:
    if value is None:
        return "—"
    text = f"{value * 100:.1f}%"
    return "0.0%" if text == "-0.0%" else text  # a tiny negative share is nothing, not minus


def stacked_bar(parts: Mapping[str, float | None], width: int = BAR_WIDTH) -> Text:
    """A bar of ``width`` cells split among the buckets in proportion (largest remainder)."""
    values = {b: max(0.0, parts.get(b) or 0.0) for b in BUCKETS}
    total = sum(values.values())
    text = Text()
    if total <= 0:
        return text.append("·" * width, style="grey30")
    exact = {b: v / total * width for b, v in values.items()}
    cells = {b: int(x) for b, x in exact.items()}
    for b in sorted(exact, key=lambda b: exact[b] - cells[b], reverse=True)[
        : width - sum(cells.values())
    ]:
        cells[b] += 1
    for b in BUCKETS:
        if cells[b]:
            text.append("█" * cells[b], style=COLOURS[b])
    return text


def legend() -> Text:
    text = Text()
    for b in BUCKETS:
        text.append("█ ", style=COLOURS[b]).append(b + "  ")
    return text


def attribution_table(body: Mapping[str, Any]) -> Table:
    table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
    table.add_column("bucket")
    table.add_column("ms", justify="right")
    table.add_column("share", justify="right")
    e2e = body.get("e2e_ms") or 0.0
    for b in BUCKETS:
        v = body["buckets_ms"].get(b)
        share = None if v is None or not e2e else v / e2e
        table.add_row(Text(b, style=COLOURS[b]), ms(v), pct(share))
    table.add_row(Text("e2e", style="bold"), ms(e2e), "100.0%")
    return table


def waterfall(
    spans: Sequence[Mapping[str, Any]],
    total_ms: float,
    width: int | None = None,
    *,
    marks: Mapping[str, str] | None = None,
) -> Table:
    """One row per span: indented name, service, a bar placed on the request's time axis.
    ``marks`` (span id -> label, e.g. "call 2") labels the spans of a trace's calls."""
    marks = marks or {}
    mark_width = max((len(m) for m in marks.values()), default=0)
    if width is None:  # what is left of the terminal after the text columns
        width = max(16, console().width - 28 - 16 - 2 * 9 - 5 - (mark_width + 1 if marks else 0))
    table = Table(box=None, pad_edge=False, header_style="bold")
    if marks:
        table.add_column("call", no_wrap=True, min_width=mark_width)
    table.add_column("span", no_wrap=True, max_width=28)
    table.add_column("service", no_wrap=True, max_width=16)
    table.add_column("start ms", justify="right", no_wrap=True)
    table.add_column("dur ms", justify="right", no_wrap=True)
    table.add_column("timeline", no_wrap=True)
    scale = width / total_ms if total_ms > 0 else 0.0
    for s in spans:
        start = max(0.0, s["start_ms"])
        lo = min(width, int(start * scale))
        hi = min(width, max(lo + 1, round((start + s["duration_ms"]) * scale)))
        colour = COLOURS.get(s.get("phase") or "", "white" if s["kind"] != "Client" else "blue")
        bar = Text(" " * lo).append("▇" * (hi - lo), style=colour).append(" " * (width - hi))
        name = "  " * s.get("depth", 0) + s["name"]
        cells = [name, s["service"], f"{s['start_ms']:.1f}", f"{s['duration_ms']:.1f}", bar]
        if marks:
            label = marks.get(s["span_id"], "")
            cells.insert(0, Text(label, style="bold") if label else Text(""))
        table.add_row(*cells)
    return table


def token_strip(tokens: Mapping[str, Any], total_ms: float, width: int = BAR_WIDTH) -> Text:
    """Tokens per time cell on the request's axis; cells holding a stall are red."""
    times = tokens.get("times_ms") or []
    counts = [0] * width
    stalled = [False] * width
    scale = width / total_ms if total_ms > 0 else 0.0
    for t in times:
        counts[min(width - 1, max(0, int(t * scale)))] += 1
    for stall in tokens.get("stalls") or []:
        start = stall["at_ms"] - stall["gap_ms"]
        for cell in range(int(start * scale), int(stall["at_ms"] * scale) + 1):
            if 0 <= cell < width:
                stalled[cell] = True
    levels = " ▁▂▃▄▅▆▇█"
    peak = max(counts) or 1
    text = Text()
    for c, bad in zip(counts, stalled, strict=True):
        glyph = levels[min(8, -(-c * 8 // peak))] if c else ("─" if bad else " ")
        text.append(glyph, style="bold red" if bad else "green")
    return text


SPARKS = " ▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float | None], *, top: float | None = None) -> Text:
    """One cell per value, its height in eighths of ``top`` (default: the largest); a missing
    value is a dim dot."""
    known = [v for v in values if v is not None]
    peak = top if top is not None else max(known, default=0.0)
    text = Text()
    for v in values:
        if v is None:
            text.append("·", style="grey30")
        elif peak <= 0:
            text.append(SPARKS[0])
        else:
            text.append(SPARKS[min(8, max(1, round(v / peak * 8)))])
    return text
