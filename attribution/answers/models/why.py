"""What is different about a selection of requests (``why``)."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from latscope.attribution.answers.models.base import (
    TRACE_ID_EXAMPLE,
    WINDOW_EXAMPLE,
    Answer,
    BucketMeans,
    Window,
    _means,
)


class WhySide(Answer):
    count: int
    e2e_mean_ms: float | None
    buckets_ms: BucketMeans


class WhySelection(WhySide):
    kind: str
    metric: str
    description: str
    threshold_ms: float | None


class WhyBaseline(WhySide):
    description: str


class WhyValue(Answer):
    value: str
    in_count: int
    out_count: int
    in_share: float = Field(description="the value's share of the selection")
    out_share: float = Field(description="its share of the baseline")
    difference: float = Field(description="in_share - out_share")
    in_e2e_mean_ms: float | None
    out_e2e_mean_ms: float | None
    extra_ms: float | None = Field(
        description="mean e2e of the selection's requests with this value minus the baseline's"
    )
    buckets_ms: BucketMeans = Field(description="extra_ms split by bucket (they add up)")
    dominant: str | None
    extra_share: float | None = Field(
        description="the share of the selection's extra time these requests carry"
    )


class WhyDimension(Answer):
    dimension: str
    score: float = Field(description="the largest difference of one value (BubbleUp's order)")
    values_seen: int
    values: list[WhyValue]


class WhyTop(Answer):
    dimension: str
    value: str
    score: float
    in_share: float
    out_share: float
    extra_ms: float | None
    dominant: str | None
    since_ns: int | None = Field(description="when the selected requests with it began")


class WhyExample(Answer):
    trace_id: str
    start_ns: int
    service: str
    model: str
    e2e_ms: float | None


_WHY_VALUE_EXAMPLE: dict[str, Any] = {
    "value": "llm-7",
    "in_count": 11,
    "out_count": 140,
    "in_share": 0.92,
    "out_share": 0.12,
    "difference": 0.8,
    "in_e2e_mean_ms": 4410.0,
    "out_e2e_mean_ms": 1020.0,
    "extra_ms": 3410.0,
    "buckets_ms": {"network": 2.0, "queue": 3380.0, "preprocess": 1.0, "prefill": 20.0,
                   "decode": 5.0, "postprocess": 1.0, "other": 1.0},
    "dominant": "queue",
    "extra_share": 0.93,
}  # fmt: skip


class Why(Answer):
    """What is different about the selected requests: dimensions ranked, extra time by bucket."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "window": WINDOW_EXAMPLE,
                    "selection": {
                        "kind": "percentile",
                        "metric": "e2e",
                        "description": "e2e at or above p99 (3900.0 ms)",
                        "threshold_ms": 3900.0,
                        "count": 12,
                        "e2e_mean_ms": 4500.0,
                        "buckets_ms": _means(queue=3400.0, decode=1000.0),
                    },
                    "baseline": {
                        "description": "the window's other requests (below 3900.0 ms)",
                        "count": 1188,
                        "e2e_mean_ms": 1030.0,
                        "buckets_ms": _means(queue=80.0, decode=900.0),
                    },
                    "extra_e2e_ms": 3470.0,
                    "extra_buckets_ms": _means(queue=3320.0, prefill=120.0, decode=14.0),
                    "dominant": "queue",
                    "dimensions": [
                        {
                            "dimension": "resource.k8s.pod.name",
                            "score": 0.8,
                            "values_seen": 8,
                            "values": [_WHY_VALUE_EXAMPLE],
                        }
                    ],
                    "top": {
                        "dimension": "resource.k8s.pod.name",
                        "value": "llm-7",
                        "score": 0.8,
                        "in_share": 0.92,
                        "out_share": 0.12,
                        "extra_ms": 3410.0,
                        "dominant": "queue",
                        "since_ns": 1767363900000000000,
                    },
                    "examples": [
                        {
                            "trace_id": TRACE_ID_EXAMPLE,
                            "start_ns": 1767365000000000000,
                            "service": "llm-server",
                            "model": "llama-3-8b",
                            "e2e_ms": 5210.0,
                        }
                    ],
                }
            ]
        },
    )

    window: Window
    selection: WhySelection
    baseline: WhyBaseline
    extra_e2e_ms: float | None = Field(description="selection's mean e2e minus the baseline's")
    extra_buckets_ms: BucketMeans = Field(description="extra_e2e_ms by bucket (they add up)")
    dominant: str | None
    dimensions: list[WhyDimension]
    top: WhyTop | None
    examples: list[WhyExample] = Field(description="the slowest selected requests")
