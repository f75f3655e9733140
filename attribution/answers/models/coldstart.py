"""Replicas that just appeared and their warm-up requests (``coldstart``)."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from latscope.attribution.answers.models.base import (
    WINDOW_EXAMPLE,
    Answer,
    BucketMeans,
    Window,
    _means,
)
from latscope.attribution.answers.models.why import WhySide


class WarmupRuleModel(Answer):
    warmup_requests: int
    warmup_s: float
    lookback_s: float
    replica_keys: list[str]


class ReplicaStartup(Answer):
    """A replica's latest startup, from its engine's startup spans (the rulebook's
    ``[engine.startup]``: vLLM's ``Overall Loading``, ``Load model``, ``Prepare model``)."""

    trace_id: str
    started_ns: int
    ready_ns: int = Field(description="when the whole load ended: the replica could serve")
    loading_ms: float | None = Field(description="the whole load")
    load_model_ms: float | None = Field(description="the weights (the longest worker's)")
    prepare_ms: float | None = Field(description="KV cache, profiling and warm-up after them")


class Replica(Answer):
    service: str
    replica: str
    first_seen_ns: int
    appeared: bool = Field(description="first seen after the lookback began (a new replica)")
    warm_from_ns: int | None = Field(description="its first request after the warm-up")
    requests: int = Field(description="its requests in the window")
    warmup_requests: int
    warmup_e2e_mean_ms: float | None
    warm_e2e_mean_ms: float | None
    startup: ReplicaStartup | None = Field(
        None, description="its latest startup, where its engine traces one"
    )


class ScaleUp(Answer):
    at_ns: int
    replicas: list[str]
    count: int
    warm_by_ns: int = Field(description="when the last of them finished warming up")
    warmup_s: float = Field(description="from the first appearing to the last warm")


class ColdStart(Answer):
    """Replicas that appeared, their warm-up requests, warm-up against warm by bucket."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "window": WINDOW_EXAMPLE,
                    "rule": {
                        "warmup_requests": 10,
                        "warmup_s": 60.0,
                        "lookback_s": 3600.0,
                        "replica_keys": ["service.instance.id", "k8s.pod.name", "host.name"],
                    },
                    "replicas": [
                        {
                            "service": "llm-server",
                            "replica": "llm-7",
                            "first_seen_ns": 1767363900000000000,
                            "appeared": True,
                            "warm_from_ns": 1767363960000000000,
                            "requests": 410,
                            "warmup_requests": 23,
                            "warmup_e2e_mean_ms": 2400.0,
                            "warm_e2e_mean_ms": 950.0,
                        }
                    ],
                    "replica_count": 4,
                    "appeared": 1,
                    "warmup": {
                        "count": 23,
                        "e2e_mean_ms": 2400.0,
                        "buckets_ms": _means(prefill=1600.0, decode=770.0),
                    },
                    "warm": {
                        "count": 1800,
                        "e2e_mean_ms": 950.0,
                        "buckets_ms": _means(prefill=210.0, decode=707.0),
                    },
                    "unidentified": 0,
                    "extra_e2e_ms": 1450.0,
                    "extra_buckets_ms": _means(prefill=1390.0, decode=60.0),
                    "dominant": "prefill",
                    "scale_ups": [
                        {
                            "at_ns": 1767363900000000000,
                            "replicas": ["llm-server/llm-7"],
                            "count": 1,
                            "warm_by_ns": 1767363960000000000,
                            "warmup_s": 60.0,
                        }
                    ],
                }
            ]
        },
    )

    window: Window
    rule: WarmupRuleModel
    replicas: list[Replica]
    replica_count: int
    appeared: int = Field(description="replicas that appeared in the window")
    warmup: WhySide
    warm: WhySide
    unidentified: int = Field(description="requests without a replica attribute")
    extra_e2e_ms: float | None
    extra_buckets_ms: BucketMeans
    dominant: str | None
    scale_ups: list[ScaleUp]
