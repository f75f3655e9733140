"""GPU figures per phase, the services seen and the slowest requests of a window."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from latscope.attribution.answers.models.base import (
    ATTRIBUTION_EXAMPLE,
    TRACE_ID_EXAMPLE,
    WINDOW_EXAMPLE,
    Answer,
    Buckets,
    Window,
)


class GpuFigure(Answer):
    mean: float | None
    max: float | None
    total: float | None
    n: int


class Gpu(Answer):
    """GPU figures per phase: utilization (%), memory (bytes), power (W), energy (mJ)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "phases": {
                        "prefill": {
                            "utilization_mean": {
                                "mean": 91.0,
                                "max": 99.0,
                                "total": 9100.0,
                                "n": 100,
                            }
                        }
                    },
                    "window": WINDOW_EXAMPLE,
                }
            ]
        },
    )

    phases: dict[str, dict[str, GpuFigure]]
    window: Window


class ModelCount(Answer):
    model: str
    count: int


class ServiceSeen(Answer):
    service: str
    count: int
    last_ns: int
    models: list[ModelCount]


class Services(Answer):
    """Services seen in the window, with their models and request counts."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "window": WINDOW_EXAMPLE,
                    "services": [
                        {
                            "service": "llm-server",
                            "count": 1200,
                            "last_ns": 1767365990000000000,
                            "models": [{"model": "llama-3-8b", "count": 1200}],
                        }
                    ],
                }
            ]
        },
    )

    window: Window
    services: list[ServiceSeen]


class SlowRequest(Answer):
    trace_id: str
    request_id: str = Field(description="the call's id (``latscope explain`` takes it)")
    start_ns: int
    service: str
    model: str
    e2e_ms: float | None
    buckets_ms: Buckets
    ttft_ms: float | None
    tpot_ms: float | None
    route: str
    status: str
    input_tokens: int | None
    output_tokens: int | None
    stalls: int
    attempts: int


class Slowest(Answer):
    """The slowest requests of the window, slowest first, each with its buckets."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "window": WINDOW_EXAMPLE,
                    "requests": [
                        {
                            "trace_id": TRACE_ID_EXAMPLE,
                            "request_id": TRACE_ID_EXAMPLE + "-00f067aa0ba902b7",
                            "start_ns": 1767365000000000000,
                            "service": "llm-server",
                            "model": "llama-3-8b",
                            "route": "/v1/chat/completions",
                            "status": "Ok",
                            "e2e_ms": 4500.0,
                            "buckets_ms": ATTRIBUTION_EXAMPLE["buckets_ms"],
                            "ttft_ms": 2900.0,
                            "tpot_ms": 21.0,
                            "input_tokens": 812,
                            "output_tokens": 70,
                            "stalls": 0,
                            "attempts": 1,
                        }
                    ],
                }
            ]
        },
    )

    window: Window
    requests: list[SlowRequest]
