"""The latency budget of a window (``summary``), its tail (``tail``) and two windows side by
side (``compare``)."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from latscope.attribution.answers.models.base import (
    _BUCKET_STATS_EXAMPLE,
    _E2E_EXAMPLE,
    _STREAMING_EXAMPLE,
    WINDOW_EXAMPLE,
    Answer,
    BucketStats,
    Percentiles,
    Streaming,
    Window,
)


class Stats(Answer):
    """The figures of a set of requests (``figures.row_stats``): what ``summary`` says of its
    window and of each group, and what ``compare`` sets side by side."""

    count: int
    with_client: int = Field(description="requests with a client span (network known)")
    e2e_ms: Percentiles
    buckets_ms: dict[str, BucketStats]
    streaming: Streaming


class SummaryGroup(Answer):
    key: str
    count: int
    with_client: int = Field(description="requests with a client span (network known)")
    e2e_ms: Percentiles
    buckets_ms: dict[str, BucketStats]
    streaming: Streaming


class Summary(Stats):
    """Percentiles of e2e and of each bucket over the window, and each bucket's share."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "count": 1200,
                    "with_client": 1100,
                    "e2e_ms": _E2E_EXAMPLE,
                    "buckets_ms": _BUCKET_STATS_EXAMPLE,
                    "streaming": _STREAMING_EXAMPLE,
                    "group_by": "model",
                    "groups": [
                        {
                            "key": "llama-3-8b",
                            "count": 700,
                            "with_client": 650,
                            "e2e_ms": _E2E_EXAMPLE,
                            "buckets_ms": _BUCKET_STATS_EXAMPLE,
                            "streaming": _STREAMING_EXAMPLE,
                        }
                    ],
                    "window": WINDOW_EXAMPLE,
                }
            ]
        },
    )

    group_by: str | None
    groups: list[SummaryGroup]
    window: Window


class TailBucket(Answer):
    tail_mean: float | None
    median_mean: float | None
    extra: float | None
    extra_share: float | None


class Tail(Answer):
    """Where requests above the percentile spend their extra time, against the median."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "percentile": 99,
                    "count": 1200,
                    "threshold_ms": 3900.0,
                    "tail_count": 12,
                    "tail_e2e_ms": 4500.0,
                    "median_e2e_ms": 940.0,
                    "extra_e2e_ms": 3560.0,
                    "buckets_ms": {
                        "queue": {
                            "tail_mean": 2600.0,
                            "median_mean": 80.0,
                            "extra": 2520.0,
                            "extra_share": 0.71,
                        }
                    },
                    "dominant": "queue",
                    "window": WINDOW_EXAMPLE,
                }
            ]
        },
    )

    percentile: float
    count: int
    threshold_ms: float | None
    tail_count: int
    tail_e2e_ms: float | None
    median_e2e_ms: float | None
    extra_e2e_ms: float | None
    buckets_ms: dict[str, TailBucket]
    dominant: str | None
    window: Window


class Delta(Answer):
    before: float | None
    after: float | None
    delta: float | None


class CompareWindow(Answer):
    since: str
    until: str
    since_ns: int
    until_ns: int
    count: int


class Compare(Answer):
    """Two windows bucket by bucket: before, after and the change; the biggest mover named."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "before": {**WINDOW_EXAMPLE, "count": 1100},
                    "after": {**WINDOW_EXAMPLE, "count": 1200},
                    "e2e_ms": {"p50": {"before": 900.0, "after": 1300.0, "delta": 400.0}},
                    "buckets_ms": {
                        "prefill": {"p50": {"before": 180.0, "after": 560.0, "delta": 380.0}}
                    },
                    "mover": "prefill",
                    "mover_delta_ms": 370.0,
                    "p99_mover": "prefill",
                }
            ]
        },
    )

    before: CompareWindow
    after: CompareWindow
    e2e_ms: dict[str, Delta]
    buckets_ms: dict[str, dict[str, Delta]]
    mover: str | None
    mover_delta_ms: float | None
    p99_mover: str | None
