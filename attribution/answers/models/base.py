"""What every answer shares: the closed base model, the seven buckets, the window, the
percentile figures, and the examples the OpenAPI document shows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, with_config

TRACE_ID_EXAMPLE = "4bf92f3577b34da6a3ce929d0e0e4736"
REQUEST_ID_EXAMPLE = TRACE_ID_EXAMPLE + "-00f067aa0ba902b7"


def _example(value: dict[str, Any]) -> ConfigDict:
    return ConfigDict(json_schema_extra={"examples": [value]})


def _means(**given: float) -> dict[str, Any]:
    """Per-bucket figures for an example: ``given``, the other buckets a few ms."""
    small = {"network": 2.0, "queue": 3.0, "preprocess": 1.0, "prefill": 20.0, "decode": 5.0,
             "postprocess": 1.0, "other": 1.0}  # fmt: skip
    return small | given


class Answer(BaseModel):
    """The base of every answer and of every part of one.

    Closed: a key the model does not name is an error where the answer is built, not a silent
    extra (a renamed key fails there, and again in gRPC's strict ``ParseDict``). Every field is
    in every answer, null where ``| None`` says it can be; the OpenAPI document lists them all
    as ``required`` (a default only fills a key the domain leaves out, the JSON always has it).
    """

    model_config = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True)

    def json_dict(self) -> dict[str, Any]:
        """The answer as the REST API serves it (the CLI renders this, in both modes)."""
        return self.model_dump(mode="json")


#: Makes a ``TypedDict`` a row of an answer's long lists (a trace's spans, a run's path, tools
#: and calls), closed as ``Answer`` is and listed the same in the OpenAPI document: every key
#: required, none other allowed. A row is a dict, not a model, and a wide trace's answer has
#: tens of thousands of them: latscope writes them as literals the type checker holds to their
#: keys and types, and validating one, where a row comes from elsewhere, costs about a seventh
#: of a model's.
row = with_config(ConfigDict(extra="forbid"))


class Buckets(Answer):
    """The seven buckets in ms, summing to ``e2e_ms``; ``network`` is null without a client span."""

    network: float | None
    queue: float | None
    preprocess: float | None
    prefill: float | None
    decode: float | None
    postprocess: float | None
    other: float | None


class Itl(Answer):
    p50: float | None
    p99: float | None
    max: float | None


# -- aggregates ----------------------------------------------------------------------------------


ATTRIBUTION_EXAMPLE: dict[str, Any] = {
    "trace_id": TRACE_ID_EXAMPLE,
    "request_id": REQUEST_ID_EXAMPLE,
    "service": "llm-server",
    "model": "llama-3-8b",
    "e2e_ms": 1000.0,
    "buckets_ms": {
        "network": 80.0,
        "queue": 100.0,
        "preprocess": 30.0,
        "prefill": 200.0,
        "decode": 520.0,
        "postprocess": 50.0,
        "other": 20.0,
    },
    "ttft_ms": 385.0,
    "ttft_server_ms": 345.0,
    "tpot_ms": 20.5,
    "itl_ms": {"p50": 19.8, "p99": 61.0, "max": 75.2},
    "stalls": 1,
    "input_tokens": 812,
    "output_tokens": 26,
    "clock_skew_ms": 0.0,
    "attempts": 1,
    "client_headers_only": False,
    "kv_transfer_ms": None,
    "gpu": {"prefill": {"utilization_mean": 93.0, "energy_mj": 41000.0}},
}


def format_ns(ns: int) -> str:
    """An instant in ns since the epoch as RFC 3339 (to the microsecond), as answers write it."""
    t = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=int(ns) // 1000)
    return t.isoformat().replace("+00:00", "Z")


class Window(Answer):
    since: str
    until: str
    since_ns: int
    until_ns: int

    @classmethod
    def of(cls, since_ns: int, until_ns: int) -> Window:
        """The window ``[since_ns, until_ns)`` (ns since the epoch), also as RFC 3339.

        >>> Window.of(0, 60_000_000_000).until
        '1970-01-01T00:01:00Z'
        """
        return cls(
            since=format_ns(since_ns),
            until=format_ns(until_ns),
            since_ns=int(since_ns),
            until_ns=int(until_ns),
        )


WINDOW_EXAMPLE: dict[str, Any] = {
    "since": "2026-01-02T14:00:00Z",
    "until": "2026-01-02T15:00:00Z",
    "since_ns": 1767362400000000000,
    "until_ns": 1767366000000000000,
}


class Percentiles(Answer):
    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None
    mean: float | None


class BucketStats(Answer):
    p50: float | None
    p95: float | None
    p99: float | None
    mean: float | None
    share: float | None = Field(description="the bucket's fraction of all time")


class StreamPercentiles(Answer):
    p50: float | None
    p95: float | None
    p99: float | None


class StreamStats(StreamPercentiles):
    mean: float | None


class Streaming(Answer):
    """Time to first token, time per output token and inter-token latency over the requests."""

    ttft_ms: StreamStats
    ttft_server_ms: StreamPercentiles
    tpot_ms: StreamStats
    itl_p50_ms: StreamPercentiles = Field(description="percentiles of the requests' ITL p50")
    itl_p99_ms: StreamPercentiles = Field(description="percentiles of the requests' ITL p99")
    itl_max_ms: float | None = Field(description="the longest gap between two tokens")
    stalls: int
    stalled_requests: int


_BUCKET_STATS_EXAMPLE: dict[str, Any] = {
    "network": {"p50": 60.0, "p95": 95.0, "p99": 120.0, "mean": 64.0, "share": 0.06},
    "queue": {"p50": 80.0, "p95": 900.0, "p99": 2400.0, "mean": 210.0, "share": 0.2},
    "preprocess": {"p50": 25.0, "p95": 40.0, "p99": 55.0, "mean": 27.0, "share": 0.03},
    "prefill": {"p50": 180.0, "p95": 420.0, "p99": 610.0, "mean": 210.0, "share": 0.2},
    "decode": {"p50": 460.0, "p95": 900.0, "p99": 1300.0, "mean": 480.0, "share": 0.45},
    "postprocess": {"p50": 20.0, "p95": 35.0, "p99": 50.0, "mean": 22.0, "share": 0.02},
    "other": {"p50": 8.0, "p95": 20.0, "p99": 31.0, "mean": 10.0, "share": 0.01},
}
_E2E_EXAMPLE: dict[str, Any] = {
    "p50": 940.0,
    "p90": 1800.0,
    "p95": 2300.0,
    "p99": 3900.0,
    "mean": 1063.0,
}
_STREAMING_EXAMPLE: dict[str, Any] = {
    "ttft_ms": {"p50": 290.0, "p95": 700.0, "p99": 1100.0, "mean": 330.0},
    "ttft_server_ms": {"p50": 250.0, "p95": 660.0, "p99": 1050.0},
    "tpot_ms": {"p50": 21.0, "p95": 30.0, "p99": 44.0, "mean": 22.0},
    "itl_p50_ms": {"p50": 20.0, "p95": 24.0, "p99": 25.0},
    "itl_p99_ms": {"p50": 30.0, "p95": 41.0, "p99": 60.0},
    "itl_max_ms": 420.0,
    "stalls": 3,
    "stalled_requests": 2,
}


class BucketMeans(Answer):
    network: float | None
    queue: float | None
    preprocess: float | None
    prefill: float | None
    decode: float | None
    postprocess: float | None
    other: float | None
