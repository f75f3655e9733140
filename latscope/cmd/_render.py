"""Terminal rendering shared by the query commands (rich): bucket colours, stacked bars,
tables, the waterfall and the token timeline."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Column, Table
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
#: Without colour (piped, ``NO_COLOR``) a bar cell is its bucket's glyph, so stacked bars and
#: legends still tell the buckets apart.
GLYPHS: dict[str, str] = {
    "network": "~",
    "queue": ".",
    "preprocess": ":",
    "prefill": "#",
    "decode": "=",
    "postprocess": "+",
    "other": "-",
}
BAR_WIDTH = 60
#: The narrowest a wrapping column gets for its longest word (ids, UUIDs are cut beyond it).
WORD_CAP = 16


def console() -> Console:
    return Console(highlight=False, soft_wrap=False)


def coloured(out: Console | None = None) -> bool:
    """Whether the output shows colour (a terminal without ``NO_COLOR``)."""
    out = out or console()
    return out.color_system is not None and not out.no_color


def fit(table: Table, drop: Sequence[str] = (), width: int | None = None) -> Table:
    """Lay ``table`` out for ``width`` (default: the terminal's) instead of cutting every cell.

    Columns that may wrap (``no_wrap=False``: names, values) share what the others leave, each
    at least its longest word (up to ``WORD_CAP``: a longer one is cut with an ellipsis); while
    even that is too wide, the columns named in ``drop`` are removed, in that order (the least
    useful first). Returns ``table``.
    """
    out = console()
    width = width or out.width
    options = out.options.update(width=width)

    def measure(column: Column) -> tuple[int, int]:
        least = most = column.min_width or 0
        for value in (column.header, *column.cells):
            m = Measurement.get(out, options, Text(value) if isinstance(value, str) else value)
            least = max(least, m.maximum if column.no_wrap else min(m.minimum, WORD_CAP))
            most = max(most, m.maximum)
        return least, most

    def room() -> int:
        left, right = table.padding[3], table.padding[1]
        gaps = (left + right) * (len(table.columns) - (0 if table.pad_edge else 1))
        return width - max(0, gaps)

    for header in [None, *drop]:
        if header is not None:
            table.columns[:] = [c for c in table.columns if c.header != header]
            for index, column in enumerate(table.columns):
                column._index = index  # rich pads by it: the last column has no right edge
        sizes = [measure(c) for c in table.columns]
        if sum(least for least, _ in sizes) <= room():
            break
    spare = room() - sum(least for least, _ in sizes)
    wanted = sum(most - least for least, most in sizes)
    if spare < wanted:  # not everything fits on one line: wrapping columns share the spare room
        for column, (least, most) in zip(table.columns, sizes, strict=True):
            if not column.no_wrap:
                column.max_width = least + (most - least) * spare // max(1, wanted)
    return table


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


def stacked_bar(
    parts: Mapping[str, float | None],
    width: int = BAR_WIDTH,
    *,
    colours: Mapping[str, str] = COLOURS,
    glyphs: Mapping[str, str] = GLYPHS,
) -> Text:
    """A bar of ``width`` cells split among the parts in proportion (largest remainder), in the
    order of ``colours``: in colour, else in each part's glyph."""
    values = {k: max(0.0, parts.get(k) or 0.0) for k in colours}
    total = sum(values.values())
    text = Text()
    if total <= 0:
        return text.append("·" * width, style="grey30")
    exact = {k: v / total * width for k, v in values.items()}
    cells = {k: int(x) for k, x in exact.items()}
    for k in sorted(exact, key=lambda k: exact[k] - cells[k], reverse=True)[
        : width - sum(cells.values())
    ]:
        cells[k] += 1
    colour = coloured()
    for k, n in cells.items():
        if n:
            text.append(("█" if colour else glyphs[k]) * n, style=colours[k])
    return text


def legend(colours: Mapping[str, str] = COLOURS, glyphs: Mapping[str, str] = GLYPHS) -> Text:
    text = Text()
    colour = coloured()
    for k, style in colours.items():
        text.append(("█" if colour else glyphs[k]) + " ", style=style).append(k + "  ")
    return text


def attribution_table(
    body: Mapping[str, Any], percentiles: Mapping[str, float | None] | None = None
) -> Table:
    """A request's buckets in ms and shares; with ``percentiles`` (a ``Standing``'s), the
    percentile rank of each among the request's peers too."""
    table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
    table.add_column("bucket")
    table.add_column("ms", justify="right")
    table.add_column("share", justify="right")
    if percentiles is not None:
        table.add_column("percentile", justify="right")

    def rank(name: str) -> list[str]:
        if percentiles is None:
            return []
        value = percentiles.get(name)
        return ["—" if value is None else f"p{value:.1f}"]

    e2e = body.get("e2e_ms") or 0.0
    for b in BUCKETS:
        v = body["buckets_ms"].get(b)
        share = None if v is None or not e2e else v / e2e
        table.add_row(Text(b, style=COLOURS[b]), ms(v), pct(share), *rank(b))
    table.add_row(Text("e2e", style="bold"), ms(e2e), "100.0%", *rank("e2e"))
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
    in_colour = coloured()
    for s in spans:
        start = max(0.0, s["start_ms"])
        lo = min(width, int(start * scale))
        hi = min(width, max(lo + 1, round((start + s["duration_ms"]) * scale)))
        phase = s.get("phase") or ""
        colour = COLOURS.get(phase, "white" if s["kind"] != "Client" else "blue")
        glyph = "▇" if in_colour else GLYPHS.get(phase, "▇")
        bar = Text(" " * lo).append(glyph * (hi - lo), style=colour).append(" " * (width - hi))
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
