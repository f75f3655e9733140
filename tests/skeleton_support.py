"""The walking skeleton's request: one client span, its server span and phases, and the buckets
latscope must attribute to it."""

from __future__ import annotations

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor


def provider(endpoint: str, service: str) -> TracerProvider:
    tp = TracerProvider(resource=Resource.create({"service.name": service}))
    tp.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True, timeout=10))
    )
    return tp


LAYOUT = {
    "client": (0, 1000),
    "server": (40, 960),  # network = 1000 - 920 = 80 ms
    "queue": (45, 145),  # 100 ms
    "preprocess": (150, 180),  # 30 ms
    "prefill": (180, 380),  # 200 ms
    "decode": (380, 900),  # 520 ms
    "postprocess": (900, 950),  # 50 ms
}
# other = server time no phase covers: 40-45, 145-150, 950-960 -> 20 ms
EXPECTED = {
    "network": 80,
    "queue": 100,
    "preprocess": 30,
    "prefill": 200,
    "decode": 520,
    "postprocess": 50,
    "other": 20,
}
