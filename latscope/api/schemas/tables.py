"""The heatmap as a table (the MCP server's heatmap tool)."""

from __future__ import annotations

from pydantic import Field

from latscope.attribution.answers.models.base import WINDOW_EXAMPLE, Answer, Window, _example


class HeatmapRow(Answer):
    start_ns: int = Field(description="the time step's start, ns since the epoch")
    counts: list[int] = Field(description="requests per column")
    total: int


class HeatmapTable(Answer):
    """A heatmap as a compact table: a row per time step with requests, a column per latency
    bin with requests (``0 ms`` first when some requests took none), counts in the cells."""

    model_config = _example(
        {
            "window": WINDOW_EXAMPLE,
            "metric": "e2e",
            "step_s": 300,
            "count": 32,
            "columns": ["794.3-1000 ms", "1000-1259 ms"],
            "rows": [{"start_ns": 1767362400000000000, "counts": [12, 10], "total": 22},
                     {"start_ns": 1767362700000000000, "counts": [3, 7], "total": 10}],
        }
    )  # fmt: skip

    window: Window
    metric: str
    step_s: int
    count: int
    columns: list[str]
    rows: list[HeatmapRow]

    def as_text(self) -> str:
        """The table in fixed-width text: the time (UTC) and a count per column."""
        from datetime import UTC, datetime

        head = ["time (UTC)", *self.columns, "total"]
        lines = [head]
        for row in self.rows:
            at = datetime.fromtimestamp(row.start_ns / 1e9, UTC).strftime("%m-%d %H:%M:%S")
            lines.append([at, *(str(c) for c in row.counts), str(row.total)])
        widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
        text = [
            f"{self.metric} heatmap, {self.count} requests, steps of {self.step_s} s "
            f"({self.window.since} → {self.window.until})"
        ]
        text += ["  ".join(cell.rjust(w) for cell, w in zip(line, widths, strict=True))
                 for line in lines]  # fmt: skip
        return "\n".join(text)
