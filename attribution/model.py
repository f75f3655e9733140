"""The records the attributor reads (spans) and writes (one attribution per request)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from latscope.semconv import BUCKETS


@dataclass(frozen=True, slots=True)
class SpanRecord:
    """One stored span, times in ns on the emitting host's clock."""

    span_id: str
    parent_span_id: str
    name: str
    kind: str
    service: str
    start_ns: int
    duration_ns: int
    attributes: dict[str, str] = field(default_factory=dict)
    events: tuple[tuple[str, int], ...] = ()
    status: str = "Unset"
    resource: dict[str, str] = field(default_factory=dict)

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.duration_ns

    def attr_int(self, key: str) -> int | None:
        raw = self.attributes.get(key)
        if raw is None or raw == "":
            return None
        try:
            return int(raw)
        except ValueError:
            pass
        try:
            return int(float(raw))
        except (ValueError, OverflowError):
            return None

    def attr_float(self, key: str) -> float | None:
        raw = self.attributes.get(key)
        if raw is None or raw == "":
            return None
        try:
            return float(raw)
        except ValueError:
            return None

    def attr_int_list(self, key: str) -> list[int]:
        raw = self.attributes.get(key)
        if not raw:
            return []
        try:
            values = json.loads(raw)
        except ValueError:
            return []
        return [int(v) for v in values if isinstance(v, (int, float))]


@dataclass(slots=True)
class RequestAttribution:
    """Where one request's end-to-end time went; the buckets always sum to ``e2e_ns``."""

    trace_id: str
    start_ns: int
    service: str
    model: str
    operation: str
    route: str
    e2e_ns: int
    buckets_ns: dict[str, int | None]
    has_client: bool
    attempts: int = 1
    status: str = "Unset"
    ttft_client_ns: int | None = None
    ttft_server_ns: int | None = None
    tpot_ns: float | None = None
    itl_ns: dict[str, float | None] = field(
        default_factory=lambda: {"p50": None, "p99": None, "max": None}
    )
    stalls: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None
    clock_skew_ns: int = 0
    gpu: dict[str, dict[str, float]] = field(default_factory=dict)
    resource_attributes: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The REST shape of DESIGN.md: milliseconds as floats."""

        def ms(v: float | None) -> float | None:
            return None if v is None else v / 1e6

        return {
            "trace_id": self.trace_id,
            "service": self.service,
            "model": self.model,
            "e2e_ms": ms(self.e2e_ns),
            "buckets_ms": {b: ms(self.buckets_ns.get(b)) for b in BUCKETS},
            "ttft_ms": ms(
                self.ttft_client_ns if self.ttft_client_ns is not None else self.ttft_server_ns
            ),
            "ttft_server_ms": ms(self.ttft_server_ns),
            "tpot_ms": ms(self.tpot_ns),
            "itl_ms": {k: ms(v) for k, v in self.itl_ns.items()},
            "stalls": self.stalls,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "clock_skew_ms": ms(self.clock_skew_ns),
            "attempts": self.attempts,
            "gpu": self.gpu,
        }
