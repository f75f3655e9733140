"""The records the attributor reads (spans) and writes (one attribution per request)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from latscope.semconv import BUCKETS
from latscope.tokens import parse_int_list

# Attribute values are strings in the spans table. These are the only forms read as numbers, so
# the SQL attributor (attribution/sql/) parses exactly what this module parses: a decimal number
# (an optional exponent), an integer of at most 19 digits read exactly (ns timestamps), and token
# offsets as a JSON array of integers of at most 15 digits (``latscope.tokens.INT_ARRAY``, which
# the collector reads too). Anything else counts as absent.
#
# The patterns are matched whole (``fullmatch`` here, ``match`` with the same text in SQL, whose
# RE2 ``$`` is the end of the value: Python's ``$`` alone also matches before a final newline).
NUMBER = re.compile(r"^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$")
INTEGER = re.compile(r"^-?[0-9]{1,19}$")
_INT64 = 2**63
#: A decimal number reads as at most this in magnitude ("1e308", or "1e999", which a float reads
#: as infinity, read as 1e18): a value a client wrote must never make a figure the attributor
#: derives from it overflow (issue 44: one span with a TTFT of 1e308 failed every pass that read
#: it). Clamped, not dropped: it is still a number, as the facts stored with each span say
#: (deploy/clickhouse/010_span_facts.sql).
MAX_FLOAT = 1e18


def parse_float(raw: str | None) -> float | None:
    """A decimal number clamped to [-MAX_FLOAT, MAX_FLOAT], or None (also for inf / nan, which
    NUMBER does not match)."""
    if raw is None or not NUMBER.fullmatch(raw):
        return None
    return min(max(float(raw), -MAX_FLOAT), MAX_FLOAT)


def parse_int(raw: str | None) -> int | None:
    """An integer read exactly, else a decimal number truncated toward zero, else None."""
    if raw is None:
        return None
    if INTEGER.fullmatch(raw) and -_INT64 <= (exact := int(raw)) < _INT64:
        return exact
    if not NUMBER.fullmatch(raw):
        return None
    value = float(raw)  # unclamped: beyond Int64 is absent, as in SQL
    if not math.isfinite(value) or not -_INT64 <= value < _INT64:
        return None
    return int(value)


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
    #: What the rulebook matched the span as, once it was asked (``Rulebook.engine_of``): the
    #: rulebook, the engine, the serving system. A span's rules are a function of the span, asked
    #: again and again while a trace's calls are found and attributed.
    matched: tuple[Any, Any, Any] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.duration_ns

    def attr_int(self, key: str) -> int | None:
        return parse_int(self.attributes.get(key))

    def attr_float(self, key: str) -> float | None:
        return parse_float(self.attributes.get(key))

    def attr_int_list(self, key: str) -> list[int]:
        return parse_int_list(self.attributes.get(key))


def request_id(trace_id: str, span_id: str) -> str:
    """A request's id: its trace id and its client's span id (the GenAI operation around the
    call, else its nearest CLIENT span; else its server span's)."""
    return f"{trace_id}-{span_id}"


@dataclass(slots=True)
class RequestAttribution:
    """Where one request's end-to-end time went; the buckets always sum to ``e2e_ns``.

    ``request_span_id`` is the request's client's span id (its server span's without a client):
    with the trace id it names the request (``request_id``).
    """

    trace_id: str
    request_span_id: str
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
    provider: str = ""
    #: The client span ended at the response headers (upstream HTTP instrumentation of a
    #: stream): the request was extended to the server's end plus the estimated return leg.
    headers_only: bool = False
    #: Time in a KV-cache transfer between a prefill and a decode worker (disaggregated serving)
    #: that no phase covers: part of ``other``, named on its own; None when no transfer was
    #: recorded.
    kv_transfer_ns: int | None = None

    @property
    def request_id(self) -> str:
        return request_id(self.trace_id, self.request_span_id)

    def to_json(self) -> dict[str, Any]:
        """The REST shape of DESIGN.md: milliseconds as floats."""

        def ms(v: float | None) -> float | None:
            return None if v is None else v / 1e6

        return {
            "trace_id": self.trace_id,
            "request_id": self.request_id,
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
            "client_headers_only": self.headers_only,
            "kv_transfer_ms": ms(self.kv_transfer_ns),
            "gpu": self.gpu,
        }
