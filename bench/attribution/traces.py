"""Unique LLM request traces as serialized OTLP Exports, fast enough to build a million spans.

Each request is 7 spans: the app's CLIENT span (with latscope's first-token time), the model
server's SERVER span and its five phase spans (queue, preprocess, prefill, decode with 64 token
offsets, postprocess), ~15 attributes each, as in bench/ingest/traces.py. One server clock in ten
is skewed by up to 5 s, so the skew rules run too.

Building every span through protobuf objects costs ~0.7 ms per request; here a few requests are
built that way once, as *templates* whose ids and timestamps are marker bytes, and each request
is a copy of a template with those bytes overwritten. Ids and timestamps have a fixed size on
the wire (bytes fields of 16 and 8, fixed64; a ns time in a varint is 9 bytes from 2^56 on), so
overwriting them keeps every length prefix valid. A serialized Export with several requests is
the concatenation of single-request Exports (a repeated field).
"""

from __future__ import annotations

import random
import struct

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

MS = 1_000_000
PHASES = ("queue", "preprocess", "prefill", "decode", "postprocess")
MODELS = ("llama-3-8b", "llama-3-70b", "mistral-7b", "qwen2-72b")
TOKENS = 64
#: Distinct templates (models, token counts, token offsets with or without a stall).
TEMPLATES = 16
#: Share of requests whose server clock is skewed, and by how much at most.
SKEWED = 0.1
MAX_SKEW_MS = 5000

#: The resource of a model server in a Kubernetes pod, as the OpenTelemetry operator and SDK
#: describe it (``Traces(pod_resources=True)``; 23 attributes with the server's own four, about
#: 800 bytes): what real resources weigh, where the benchmark's own have 2-4 attributes.
POD_RESOURCE = {
    "k8s.namespace.name": "inference-prod",
    "k8s.deployment.name": "llm-server",
    "k8s.replicaset.name": "llm-server-7c9d8f6b5",
    "k8s.cluster.name": "gpu-cluster-us-east-1",
    "k8s.container.name": "vllm",
    "container.image.name": "registry.example.com/ml/vllm-openai",
    "container.image.tag": "v0.9.2-cu124",
    "cloud.provider": "aws",
    "cloud.region": "us-east-1",
    "cloud.availability_zone": "us-east-1b",
    "telemetry.sdk.name": "opentelemetry",
    "telemetry.sdk.language": "python",
    "telemetry.sdk.version": "1.27.0",
    "process.runtime.name": "cpython",
    "process.runtime.version": "3.11.9",
    "os.type": "linux",
    "host.arch": "amd64",
}

CLIENT, SERVER = 0, 1  # span positions; the phases follow
SPANS = 2 + len(PHASES)
_TRACE_MARK = b"\xfeTRACE-ID-MARK\xfe\xfe"
_SPAN_MARKS = [b"\xfeSPAN" + bytes([0x30 + i]) + b"\xfe\xfe" for i in range(SPANS)]
#: fixed64 markers for each span's start (2i) and end (2i + 1).
_TIME_MARKS = [0x7A7A7A7A7A7A7A00 + k for k in range(2 * SPANS)]
#: A ns time as a varint (9 bytes from 2^56 to 2^63): the client's first-token attribute.
_FIRST_TOKEN_MARK = 0x0123456789ABCD00
_FIXED64 = struct.Struct("<Q")


def _kv(key: str, value: object) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


class _Template:
    """One request's serialized Export with marker ids and times, and where each marker is."""

    def __init__(self, rng: random.Random, pod_resources: bool = False) -> None:
        model = rng.choice(MODELS)
        gaps = [rng.randint(8, 30) for _ in range(TOKENS - 1)]
        if rng.random() < 0.5:  # a stall somewhere in the stream
            gaps[rng.randrange(len(gaps))] = rng.randint(300, 800)
        offsets_ms = [0]
        for g in gaps:
            offsets_ms.append(offsets_ms[-1] + g)
        #: Token times (ms) from the decode span's start; the decode lasts past the last one.
        self.first_token_ms = 0
        self.decode_ms = offsets_ms[-1] + rng.randint(1, 20)
        common = {
            "gen_ai.request.model": model,
            "gen_ai.operation.name": "chat",
            "gen_ai.system": "vllm",
            "gen_ai.request.max_tokens": 1024,
            "gen_ai.request.temperature": 0.7,
            "gen_ai.usage.input_tokens": rng.randint(50, 4000),
            "gen_ai.usage.output_tokens": TOKENS,
            "http.request.method": "POST",
            "url.path": "/v1/chat/completions",
            "server.address": "llm-7f9c.internal",
            "server.port": 8000,
            "net.peer.name": "10.0.3.17",
            "tenant.id": f"tenant-{rng.randint(1, 50)}",
            "request.streaming": True,
        }
        req = ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        rs.resource.attributes.extend(
            [_kv("service.name", "chat-frontend"), _kv("host.name", "fe-1")]
        )
        ss = rs.scope_spans.add()
        ss.scope.name, ss.scope.version = "latscope.sdk", "0.1.0"
        spans: list[Span] = []
        client = ss.spans.add(
            name="POST /v1/chat/completions", kind=Span.SPAN_KIND_CLIENT, parent_span_id=b""
        )
        client.attributes.extend(_kv(k, v) for k, v in common.items())
        client.attributes.append(_kv("latscope.first_token_ns", _FIRST_TOKEN_MARK))
        spans.append(client)
        rs = req.resource_spans.add()
        node = rng.randint(1, 4)
        rs.resource.attributes.extend(
            [
                _kv("service.name", "llm-server"),
                _kv("host.name", f"gpu-node-{node}"),
                _kv("service.version", "1.4.2"),
                _kv("deployment.environment", "prod"),
            ]
        )
        if pod_resources:  # (no draw from rng: the requests are the same otherwise)
            pod = {
                **POD_RESOURCE,
                "k8s.pod.name": f"llm-server-7c9d8f6b5-n{node}x",
                "k8s.pod.uid": f"5f0c2b7e-{node:04d}-4c1a-9d3e-8b6f2a1c7d90",
                "k8s.node.name": f"ip-10-0-3-{node}.ec2.internal",
            }
            rs.resource.attributes.extend(_kv(k, v) for k, v in pod.items())
        ss = rs.scope_spans.add()
        ss.scope.name, ss.scope.version = "latscope.sdk", "0.1.0"
        server = ss.spans.add(
            name=f"chat {model}", kind=Span.SPAN_KIND_SERVER, parent_span_id=_SPAN_MARKS[CLIENT]
        )
        server.attributes.extend(_kv(k, v) for k, v in common.items())
        server.attributes.append(_kv("gpu.index", 0))
        spans.append(server)
        offsets_us = "[" + ",".join(str(o * 1000) for o in offsets_ms) + "]"
        for phase in PHASES:
            p = ss.spans.add(
                name=phase, kind=Span.SPAN_KIND_INTERNAL, parent_span_id=_SPAN_MARKS[SERVER]
            )
            attrs = {**common, "latscope.phase": phase}
            if phase == "decode":
                attrs["latscope.token_offsets_us"] = offsets_us
            p.attributes.extend(_kv(k, v) for k, v in attrs.items())
            spans.append(p)
        for i, span in enumerate(spans):
            span.trace_id = _TRACE_MARK
            span.span_id = _SPAN_MARKS[i]
            span.start_time_unix_nano = _TIME_MARKS[2 * i]
            span.end_time_unix_nano = _TIME_MARKS[2 * i + 1]
        self.data = req.SerializeToString()
        self.trace_at = self._find(_TRACE_MARK, SPANS)
        self.span_at = [self._find(m, None) for m in _SPAN_MARKS]
        self.time_at = [self._find(struct.pack("<Q", m), 1)[0] for m in _TIME_MARKS]
        self.first_token_at = self._find(_varint(_FIRST_TOKEN_MARK), 1)[0]

    def _find(self, mark: bytes, count: int | None) -> list[int]:
        found, at = [], self.data.find(mark)
        while at != -1:
            found.append(at)
            at = self.data.find(mark, at + 1)
        assert found and (count is None or len(found) == count), (mark, found)
        return found


class Traces:
    """Unique requests from ``seed``: the same seed gives the same requests, byte for byte."""

    def __init__(self, seed: int = 1, *, pod_resources: bool = False) -> None:
        self.rng = random.Random(seed)
        self.templates = [_Template(self.rng, pod_resources) for _ in range(TEMPLATES)]

    def request(self, t0_ns: int) -> bytes:
        """One request starting at ``t0_ns`` (the client span's start), as a serialized Export."""
        rng = self.rng
        tpl = self.templates[rng.randrange(TEMPLATES)]
        out = bytearray(tpl.data)
        ids = rng.getrandbits(8 * (16 + 8 * SPANS)).to_bytes(16 + 8 * SPANS, "little")
        trace_id = ids[:16]
        for at in tpl.trace_at:
            out[at : at + 16] = trace_id
        for k, marks in enumerate(tpl.span_at):
            span_id = ids[16 + 8 * k : 24 + 8 * k]
            for at in marks:
                out[at : at + 8] = span_id
        net = rng.randint(2, 40) * MS
        skew = rng.randint(-MAX_SKEW_MS, MAX_SKEW_MS) * MS if rng.random() < SKEWED else 0
        durations = [rng.randint(1, 200) * MS for _ in PHASES]
        durations[PHASES.index("decode")] = tpl.decode_ms * MS
        server_lo = t0_ns + net
        times = [0] * (2 * SPANS)
        at = server_lo + MS
        first_token = 0
        for i, dur in enumerate(durations):
            times[2 * (2 + i)], times[2 * (2 + i) + 1] = at + skew, at + dur + skew
            if PHASES[i] == "decode":
                first_token = at + tpl.first_token_ms * MS
            at += dur
        server_hi = at + MS
        times[2 * SERVER], times[2 * SERVER + 1] = server_lo + skew, server_hi + skew
        times[2 * CLIENT], times[2 * CLIENT + 1] = t0_ns, server_hi + rng.randint(2, 40) * MS
        for pos, value in zip(tpl.time_at, times, strict=True):
            _FIXED64.pack_into(out, pos, value)
        out[tpl.first_token_at : tpl.first_token_at + 9] = _varint(first_token + net // 2)
        return bytes(out)

    def export(self, t0_ns: int, requests: int, spacing_ns: int = MS) -> bytes:
        """``requests`` requests ``spacing_ns`` apart in one Export, as an SDK's batch sends."""
        return b"".join(self.request(t0_ns + i * spacing_ns) for i in range(requests))
