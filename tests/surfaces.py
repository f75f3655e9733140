"""Test data for the on-call surfaces: realistic request traces sent through real OTLP/gRPC."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, set_span_in_context

from latscope.semconv import GenAIAttributes, LatscopeAttributes

MS = 1_000_000


@dataclass
class RequestSpec:
    """One request: client/server/phase intervals in ms from ``start_ns``, tokens in µs from the
    decode span's start."""

    service: str = "llm-server"
    model: str = "llama-3-8b"
    client: tuple[float, float] | None = (0, 1000)
    server: tuple[float, float] = (40, 960)
    phases: dict[str, tuple[float, float]] = field(
        default_factory=lambda: {
            "queue": (45, 145),
            "preprocess": (150, 180),
            "prefill": (180, 380),
            "decode": (380, 900),
            "postprocess": (900, 950),
        }
    )
    token_offsets_us: list[int] = field(default_factory=list)
    input_tokens: int = 812
    start_ns: int = 0
    trace_id: str = ""

    def expected_buckets(self) -> dict[str, float | None]:
        """The buckets the attribution rules give for this layout (phases must not overlap)."""
        ss, se = self.server
        covered = {name: e - s for name, (s, e) in self.phases.items()}
        out: dict[str, float | None] = dict(covered)
        out["other"] = (se - ss) - sum(covered.values())
        out["network"] = None if self.client is None else (
            (self.client[1] - self.client[0]) - (se - ss)
        )  # fmt: skip
        return out

    @property
    def e2e_ms(self) -> float:
        lo, hi = self.client if self.client is not None else self.server
        return hi - lo


def _provider(endpoint: str, service: str, token: str = "") -> TracerProvider:
    headers = {"authorization": f"Bearer {token}"} if token else None
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(endpoint=endpoint, insecure=True, timeout=10, headers=headers)
        )
    )
    return provider


def send(endpoint: str, specs: list[RequestSpec], token: str = "") -> list[RequestSpec]:
    """Emit every request's spans over OTLP/gRPC; fills each spec's trace_id and start_ns."""
    providers: dict[str, TracerProvider] = {}

    def tracer(service: str):
        if service not in providers:
            providers[service] = _provider(endpoint, service, token)
        return providers[service].get_tracer("tests.surfaces")

    now = time.time_ns()
    for i, spec in enumerate(specs):
        t0 = spec.start_ns or (now - (len(specs) - i) * 10 * MS - 120_000 * MS)
        spec.start_ns = t0
        ctx = None
        c_span = None
        if spec.client is not None:
            c_span = tracer("chat-frontend").start_span(
                "POST /v1/chat/completions",
                kind=SpanKind.CLIENT,
                start_time=int(t0 + spec.client[0] * MS),
            )
            ctx = set_span_in_context(c_span)
        server_tracer = tracer(spec.service)
        s_span = server_tracer.start_span(
            "chat " + spec.model,
            context=ctx,
            kind=SpanKind.SERVER,
            start_time=int(t0 + spec.server[0] * MS),
            attributes={
                GenAIAttributes.REQUEST_MODEL: spec.model,
                GenAIAttributes.USAGE_INPUT_TOKENS: spec.input_tokens,
                GenAIAttributes.OPERATION_NAME: "chat",
            },
        )
        s_ctx = set_span_in_context(s_span)
        for phase, (ps, pe) in spec.phases.items():
            attrs: dict = {LatscopeAttributes.PHASE: phase}
            if phase == "decode" and spec.token_offsets_us:
                attrs[LatscopeAttributes.TOKEN_OFFSETS_US] = spec.token_offsets_us
                attrs[LatscopeAttributes.TOKEN_COUNT] = len(spec.token_offsets_us)
            p = server_tracer.start_span(
                phase, context=s_ctx, start_time=int(t0 + ps * MS), attributes=attrs
            )
            p.end(end_time=int(t0 + pe * MS))
        s_span.end(end_time=int(t0 + spec.server[1] * MS))
        spec.trace_id = format(s_span.get_span_context().trace_id, "032x")
        if c_span is not None:
            c_span.end(end_time=int(t0 + spec.client[1] * MS))
    for provider in providers.values():
        provider.force_flush()
        provider.shutdown()
    return specs


def steady_tokens(count: int, first_us: int, gap_us: int, stall_at: int = -1, stall_us: int = 0):
    """``count`` token offsets ``gap_us`` apart, with one extra ``stall_us`` before ``stall_at``."""
    out, t = [], first_us
    for i in range(count):
        if i == stall_at:
            t += stall_us
        out.append(t)
        t += gap_us
    return out
