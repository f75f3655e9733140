"""Realistic LLM request traces as OTLP Exports: 7 spans per request, ~15 attributes each."""

from __future__ import annotations

import random

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

MS = 1_000_000
PHASES = ("queue", "preprocess", "prefill", "decode", "postprocess")
MODELS = ("llama-3-8b", "llama-3-70b", "mistral-7b", "qwen2-72b")


def _kv(key: str, value: object) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def _common(rng: random.Random, model: str) -> dict[str, object]:
    return {
        "gen_ai.request.model": model,
        "gen_ai.operation.name": "chat",
        "gen_ai.system": "vllm",
        "gen_ai.request.max_tokens": 1024,
        "gen_ai.request.temperature": 0.7,
        "gen_ai.usage.input_tokens": rng.randint(50, 4000),
        "gen_ai.usage.output_tokens": rng.randint(10, 1000),
        "http.request.method": "POST",
        "url.path": "/v1/chat/completions",
        "server.address": "llm-7f9c.internal",
        "server.port": 8000,
        "net.peer.name": "10.0.3.17",
        "tenant.id": f"tenant-{rng.randint(1, 50)}",
        "request.streaming": True,
    }


def make_request(
    rng: random.Random, t0_ns: int, service: str = "llm-server"
) -> ExportTraceServiceRequest:
    """One request's 7 spans (client, server, five phases) in one Export."""
    req = ExportTraceServiceRequest()
    model = rng.choice(MODELS)
    trace_id = rng.randbytes(16)
    client_id, server_id = rng.randbytes(8), rng.randbytes(8)
    common = _common(rng, model)
    rs_client = req.resource_spans.add()
    rs_client.resource.attributes.extend(
        [_kv("service.name", "chat-frontend"), _kv("host.name", "fe-1")]
    )
    ss = rs_client.scope_spans.add()
    ss.scope.name, ss.scope.version = "latscope.sdk", "0.1.0"
    c = ss.spans.add(
        trace_id=trace_id, span_id=client_id, name="POST /v1/chat/completions",
        kind=Span.SPAN_KIND_CLIENT, start_time_unix_nano=t0_ns,
        end_time_unix_nano=t0_ns + 1000 * MS,
    )  # fmt: skip
    c.attributes.extend(_kv(k, v) for k, v in common.items())
    c.attributes.append(_kv("latscope.first_token_ns", t0_ns + 380 * MS))
    rs = req.resource_spans.add()
    rs.resource.attributes.extend(
        [
            _kv("service.name", service),
            _kv("host.name", "gpu-node-3"),
            _kv("service.version", "1.4.2"),
            _kv("deployment.environment", "prod"),
        ]
    )
    ss = rs.scope_spans.add()
    ss.scope.name, ss.scope.version = "latscope.sdk", "0.1.0"
    s = ss.spans.add(
        trace_id=trace_id, span_id=server_id, parent_span_id=client_id, name=f"chat {model}",
        kind=Span.SPAN_KIND_SERVER, start_time_unix_nano=t0_ns + 40 * MS,
        end_time_unix_nano=t0_ns + 960 * MS,
    )  # fmt: skip
    s.attributes.extend(_kv(k, v) for k, v in common.items())
    s.attributes.append(_kv("gpu.index", 0))
    at = 45
    for phase in PHASES:
        dur = rng.randint(5, 200)
        p = ss.spans.add(
            trace_id=trace_id, span_id=rng.randbytes(8), parent_span_id=server_id, name=phase,
            kind=Span.SPAN_KIND_INTERNAL, start_time_unix_nano=t0_ns + at * MS,
            end_time_unix_nano=t0_ns + (at + dur) * MS,
        )  # fmt: skip
        attrs = dict(common)
        attrs["latscope.phase"] = phase
        p.attributes.extend(_kv(k, v) for k, v in attrs.items())
        at += dur
    return req


def make_batch(rng: random.Random, t0_ns: int, requests: int) -> ExportTraceServiceRequest:
    """``requests`` requests merged into one Export, as an SDK's batch processor sends them."""
    out = ExportTraceServiceRequest()
    for i in range(requests):
        out.resource_spans.extend(make_request(rng, t0_ns + i * MS).resource_spans)
    return out
