"""Every figure per time step (``timeseries``) and the latency heatmap (``heatmap``)."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from latscope.attribution.answers.models.base import (
    _BUCKET_STATS_EXAMPLE,
    WINDOW_EXAMPLE,
    Answer,
    Window,
)


class StepPercentiles(Answer):
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    mean: float | None = None


class StepBucket(Answer):
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    mean: float | None = None
    share: float | None = Field(None, description="the bucket's fraction of the step's e2e time")


class StepPoint(Answer):
    start_ns: int
    end_ns: int
    count: int
    e2e_ms: StepPercentiles
    buckets_ms: dict[str, StepBucket]
    ttft_ms: StepPercentiles
    tpot_ms: StepPercentiles


class Series(Answer):
    key: str = Field(description='the group ("" for the whole window)')
    count: int
    points: list[StepPoint]


class ReadSource(Answer):
    rollup_hours: int = Field(description="hours read from the hourly rollup")
    raw_ranges: int = Field(description="time ranges read from the attribution table")
    raw_final_ranges: int = Field(description="of those, ranges read with FINAL")


_POINT_EXAMPLE: dict[str, Any] = {
    "start_ns": 1767362400000000000,
    "end_ns": 1767362430000000000,
    "count": 40,
    "e2e_ms": {"p50": 940.0, "p90": 1800.0, "p95": 2300.0, "p99": 3900.0, "mean": 1063.0},
    "buckets_ms": {
        b: {k: v[k] for k in ("p50", "p95", "p99", "mean", "share")}
        for b, v in _BUCKET_STATS_EXAMPLE.items()
    },
    "ttft_ms": {"p50": 290.0, "p95": 700.0, "p99": 1100.0, "mean": 330.0},
    "tpot_ms": {"p50": 21.0, "p95": 30.0, "p99": 44.0, "mean": 22.0},
}


class Timeseries(Answer):
    """Every figure of the summary per time step, for the window and per group."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "window": WINDOW_EXAMPLE,
                    "step_s": 30,
                    "group_by": None,
                    "series": [{"key": "", "count": 40, "points": [_POINT_EXAMPLE]}],
                    "source": {"rollup_hours": 0, "raw_ranges": 1, "raw_final_ranges": 1},
                }
            ]
        },
    )

    window: Window
    step_s: int
    group_by: str | None
    series: list[Series]
    source: ReadSource


class HeatBin(Answer):
    row: int
    lo_ms: float
    hi_ms: float


class Heatmap(Answer):
    """Requests per time step (columns) and log-scaled latency bin (rows)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "window": WINDOW_EXAMPLE,
                    "metric": "e2e",
                    "step_s": 30,
                    "bins_per_decade": 10,
                    "times_ns": [1767362400000000000, 1767362430000000000],
                    "bins": [
                        {"row": 89, "lo_ms": 794.3, "hi_ms": 1000.0},
                        {"row": 90, "lo_ms": 1000.0, "hi_ms": 1258.9},
                    ],
                    "counts": [[12, 3], [10, 7]],
                    "zero_counts": [0, 0],
                    "count": 32,
                    "max_count": 12,
                    "source": {"rollup_hours": 0, "raw_ranges": 1, "raw_final_ranges": 1},
                }
            ]
        },
    )

    window: Window
    metric: str
    step_s: int
    bins_per_decade: int
    times_ns: list[int]
    bins: list[HeatBin]
    counts: list[list[int]] = Field(description="counts[step][bin]")
    zero_counts: list[int] = Field(description="per step, requests whose value is 0")
    count: int
    max_count: int
    source: ReadSource
