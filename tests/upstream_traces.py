"""Traces shaped exactly the way upstream systems emit them, each inference call with its truth.

What each emitter sends, and from which source, is in ``docs/upstream.md``; this module rebuilds
those shapes as OTLP ``ResourceSpans`` from timing parameters (ns), with ids from a seeded RNG, so
a test can send them through the collector and hold the attribution engine to a known answer.

Layers, bottom up:

- ``TraceBuilder`` and ``Host``: spans on hosts with their own clock offsets. Every time passed
  in is *true* time (the calling app's clock); a host's offset is added when its spans are
  written, as its own clock would have stamped them.
- server plans (``SdkServer``, ``VllmV1Server``, ``VllmV0Server``, ``VllmParallel``,
  ``SglangServer``) and client plans (``SdkClient``, ``HttpxClient``, ``OpenAIV2Client``,
  ``OpenInferenceClient``, ``GatewayClient``): one dataclass of durations each, which knows its
  own extent and buckets and writes its spans.
- ``LlmCall``: a client plan over a server plan (plus failed attempts before it), written into a
  trace; returns the call's ``Truth``.
- the builders the tests call (``sdk_request``, ``sglang_request``, ``vllm_v1_request``, ...):
  one seeded call each, returning ``Built`` (the ResourceSpans and the truths).
- ``old_exporter_rows`` / ``old_exporter_arrow``: spans as older OpenTelemetry Collector
  ClickHouse exporters stored them, and ``JSON_EXPORTER_TRACES_DDL``, the exporter's JSON layout.

The truth follows the rules of ``docs/attribution.md``: a request is an inference server span
with its client, the outermost GenAI operation of the call (openai-v2's ``chat``, OpenInference's
LLM span) else its nearest CLIENT ancestor; its id is ``<trace id>-<client span id>`` (else the
server span id); buckets add up to the end-to-end time; ``network`` is None without a client.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Protocol

import pyarrow as pa
from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    ArrayValue,
    InstrumentationScope,
    KeyValue,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from latscope.attribution.model import SpanRecord
from latscope.collector.mapping import SPAN_KINDS, STATUS_CODES, spans_table, value_to_string
from latscope.semconv import BUCKETS

MS: Final = 1_000_000
US: Final = 1_000
SECOND: Final = 1_000_000_000
#: A fixed instant (ns since the epoch): every builder starts here unless told otherwise.
T0: Final = 1_763_000_000_000_000_000

INTERNAL: Final = Span.SPAN_KIND_INTERNAL
SERVER: Final = Span.SPAN_KIND_SERVER
CLIENT: Final = Span.SPAN_KIND_CLIENT

#: Instrumentation scopes (name, version) as the upstream emitters name their tracers.
SCOPE_LATSCOPE: Final = ("latscope", "0.1.0")
SCOPE_VLLM: Final = ("vllm.llm_engine", "")
SCOPE_SGLANG: Final = ("sglang server", "")
SCOPE_HTTPX: Final = ("opentelemetry.instrumentation.httpx", "0.66b2")
SCOPE_GENAI: Final = ("opentelemetry.util.genai.handler", "")
SCOPE_OPENINFERENCE: Final = ("openinference.instrumentation.openai", "0.1.66")
SCOPE_APP: Final = ("agent-app", "")

CHAT_PATH: Final = "/v1/chat/completions"
SERVER_BUCKETS: Final = ("queue", "preprocess", "prefill", "decode", "postprocess", "other")


# -- ground truth ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Truth:
    """What a correct engine reports for one inference call (times in ns).

    ``buckets`` holds the seven buckets; ``network`` is None when the call has no client span.
    ``server_ttft_ns``, ``client_ttft_ns`` and the token counts are None where the shape does not
    carry them. ``skew_ns``: how far the server host's clock runs ahead of its client's.
    """

    request_id: str
    trace_id: str
    e2e_ns: int
    buckets: Mapping[str, int | None]
    shape: str
    server_ttft_ns: int | None = None
    client_ttft_ns: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    attempts: int = 1
    model: str | None = None
    service: str | None = None
    headers_only: bool = False
    skew_ns: int = 0

    def check(self) -> None:
        """The truth's own invariants: every bucket known but network, none negative, the
        buckets adding up to the end-to-end time."""
        assert tuple(self.buckets) == BUCKETS, self.buckets
        for bucket, value in self.buckets.items():
            if bucket == "network" and value is None:
                continue
            assert value is not None and value >= 0, (self.shape, bucket, value)
        total = sum(v for v in self.buckets.values() if v is not None)
        assert total == self.e2e_ns, (self.shape, total, self.e2e_ns, dict(self.buckets))


def _buckets(network: int | None, server: Mapping[str, int]) -> dict[str, int | None]:
    return {"network": network, **{b: int(server.get(b, 0)) for b in SERVER_BUCKETS}}


# -- spans ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Host:
    """A process that writes spans: its ``service.name`` and how far its clock runs ahead of the
    true clock (the calling app's)."""

    service: str
    offset_ns: int = 0
    resource: Mapping[str, Any] = field(default_factory=dict)


def any_value(value: Any) -> AnyValue:
    """A Python attribute value as OTLP ``AnyValue`` (the OTel SDK's mapping)."""
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, str):
        return AnyValue(string_value=value)
    if isinstance(value, (list, tuple)):
        return AnyValue(array_value=ArrayValue(values=[any_value(v) for v in value]))
    raise TypeError(f"attribute value {value!r} is not an OTel attribute type")


def key_values(attributes: Mapping[str, Any] | None) -> list[KeyValue]:
    # The OTel SDK drops None-valued attributes (with a warning); so do we, silently.
    return [
        KeyValue(key=k, value=any_value(v)) for k, v in (attributes or {}).items() if v is not None
    ]


class TraceBuilder:
    """The spans of one trace, written host by host; ``resource_spans()`` groups them as an
    SDK's exporter would (one ResourceSpans per host, one ScopeSpans per scope)."""

    def __init__(self, rng: random.Random, *, trace_id_bits: int = 128) -> None:
        self.rng = rng
        tid = 0
        while tid == 0:
            tid = rng.getrandbits(trace_id_bits)
        self.trace_id = tid.to_bytes(16, "big")
        self._spans: list[tuple[Host, tuple[str, str], Span]] = []
        #: traces split off by calls whose client propagates no context
        self.side_traces: list[TraceBuilder] = []

    @property
    def trace_hex(self) -> str:
        return self.trace_id.hex()

    def span_id(self) -> bytes:
        sid = 0
        while sid == 0:
            sid = self.rng.getrandbits(64)
        return sid.to_bytes(8, "big")

    def add(
        self,
        host: Host,
        scope: tuple[str, str],
        name: str,
        kind: int,
        start: int,
        end: int,
        *,
        parent: bytes | None = None,
        attributes: Mapping[str, Any] | None = None,
        events: Sequence[tuple[str, int, Mapping[str, Any]]] = (),
        links: Sequence[bytes] = (),
        status: int = Status.STATUS_CODE_UNSET,
        message: str = "",
    ) -> bytes:
        """One span, times on the true clock (shifted by the host's offset here); its id."""
        assert end >= start, (name, start, end)
        shift = host.offset_ns
        span = Span(
            trace_id=self.trace_id,
            span_id=self.span_id(),
            parent_span_id=parent or b"",
            name=name,
            kind=kind,  # type: ignore[arg-type]
            start_time_unix_nano=start + shift,
            end_time_unix_nano=end + shift,
            attributes=key_values(attributes),
            events=[
                Span.Event(time_unix_nano=t + shift, name=n, attributes=key_values(a))
                for n, t, a in events
            ],
            links=[Span.Link(trace_id=self.trace_id, span_id=s) for s in links],
            status=Status(code=status, message=message),  # type: ignore[arg-type]
        )
        self._spans.append((host, scope, span))
        return span.span_id

    def resource_spans(self) -> list[ResourceSpans]:
        by_host: dict[int, tuple[Host, dict[tuple[str, str], list[Span]]]] = {}
        for host, scope, span in self._spans:
            by_host.setdefault(id(host), (host, {}))[1].setdefault(scope, []).append(span)
        out = []
        for host, scopes in by_host.values():
            resource = Resource(
                attributes=key_values({"service.name": host.service, **host.resource})
            )
            out.append(
                ResourceSpans(
                    resource=resource,
                    scope_spans=[
                        ScopeSpans(
                            scope=InstrumentationScope(name=name, version=version), spans=spans
                        )
                        for (name, version), spans in scopes.items()
                    ],
                )
            )
        return out


@dataclass
class Built:
    """Traces from one builder: what to export, and the truth of every inference call in them."""

    resource_spans: list[ResourceSpans]
    truths: list[Truth]
    trace_ids: list[str]

    @property
    def spans(self) -> list[Span]:
        return [s for rs in self.resource_spans for ss in rs.scope_spans for s in ss.spans]

    @property
    def truth(self) -> Truth:
        """The one truth of a single-call build."""
        assert len(self.truths) == 1, [t.request_id for t in self.truths]
        return self.truths[0]


def _built(builders: Sequence[TraceBuilder], truths: list[Truth]) -> Built:
    return Built(
        [rs for tb in builders for rs in tb.resource_spans()],
        truths,
        [tb.trace_hex for tb in builders],
    )


def span_records(resource_spans: Iterable[ResourceSpans]) -> dict[str, list[SpanRecord]]:
    """Trace id -> its spans as the store hands them to the engine (kinds ``Server``, attribute
    values as the collector renders them), for engine tests that skip the store."""
    out: dict[str, list[SpanRecord]] = {}
    for rs in resource_spans:
        resource = {kv.key: value_to_string(kv.value) for kv in rs.resource.attributes}
        service = resource.get("service.name", "")
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.setdefault(s.trace_id.hex(), []).append(
                    SpanRecord(
                        span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex(),
                        name=s.name,
                        kind=SPAN_KINDS[s.kind],
                        service=service,
                        start_ns=s.start_time_unix_nano,
                        duration_ns=s.end_time_unix_nano - s.start_time_unix_nano,
                        attributes={kv.key: value_to_string(kv.value) for kv in s.attributes},
                        events=tuple((e.name, e.time_unix_nano) for e in s.events),
                        status=STATUS_CODES[s.status.code],
                        resource=resource,
                    )
                )
    return out


def _seconds(ns: int) -> float:
    # vLLM and SGLang write latencies as float seconds.
    return ns / SECOND


def _draw(rng: random.Random, lo_ms: float, hi_ms: float) -> int:
    """A duration in [lo, hi] ms with ns resolution (so two draws practically never tie)."""
    return rng.randint(int(lo_ms * MS), int(hi_ms * MS))


# -- servers --------------------------------------------------------------------------------------


class ServerPlan(Protocol):
    """An inference server's part of a call: its extent (true time) and how it splits."""

    model: str

    def duration(self) -> int: ...

    def first_token_ns(self) -> int:
        """When the first token leaves the server, from the server span's start."""
        ...

    def buckets(self) -> dict[str, int]: ...

    def server_ttft_ns(self) -> int | None: ...

    def tokens(self) -> tuple[int | None, int | None]: ...

    def emit(self, tb: TraceBuilder, host: Host, parent: bytes | None, start: int) -> bytes:
        """Write the spans; the id of the span that is the request's server span."""
        ...


@dataclass(frozen=True)
class SdkServer:
    """A server instrumented with latscope's SDK: ``@inference`` SERVER span, phase spans with
    ``latscope.phase``, token offsets on the decode span. ``failed``: an attempt that timed out in
    the queue (SERVER span with status ERROR and a queue phase only)."""

    model: str = "llama-3-8b"
    lead: int = 1 * MS
    queue: int = 40 * MS
    gap: int = 1 * MS
    preprocess: int = 10 * MS
    prefill: int = 120 * MS
    decode: int = 400 * MS
    postprocess: int = 5 * MS
    tail: int = 1 * MS
    input_tokens: int = 512
    output_tokens: int = 40
    failed: bool = False

    def duration(self) -> int:
        if self.failed:
            return self.lead + self.queue + self.tail
        return (
            self.lead
            + self.queue
            + self.gap
            + self.preprocess
            + self.prefill
            + self.decode
            + self.postprocess
            + self.tail
        )

    def first_token_ns(self) -> int:
        return self.lead + self.queue + self.gap + self.preprocess + self.prefill

    def server_ttft_ns(self) -> int | None:
        return None if self.failed else self.first_token_ns()

    def tokens(self) -> tuple[int | None, int | None]:
        return (None, None) if self.failed else (self.input_tokens, self.output_tokens)

    def buckets(self) -> dict[str, int]:
        if self.failed:
            return {"queue": self.queue, "other": self.lead + self.tail}
        return {
            "queue": self.queue,
            "preprocess": self.preprocess,
            "prefill": self.prefill,
            "decode": self.decode,
            "postprocess": self.postprocess,
            "other": self.lead + self.gap + self.tail,
        }

    def _offsets(self) -> list[int]:
        n = self.output_tokens
        if n <= 1:
            return [0]
        return [i * self.decode // (n - 1) for i in range(n)]

    def emit(self, tb: TraceBuilder, host: Host, parent: bytes | None, start: int) -> bytes:
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": self.model,
        }
        end = start + self.duration()
        if self.failed:
            sid = tb.add(
                host,
                SCOPE_LATSCOPE,
                f"chat {self.model}",
                SERVER,
                start,
                end,
                parent=parent,
                attributes={**attrs, "error.type": "QueueTimeout"},
                status=Status.STATUS_CODE_ERROR,
                message="QueueTimeout",
            )
            q0 = start + self.lead
            tb.add(
                host,
                SCOPE_LATSCOPE,
                "queue",
                INTERNAL,
                q0,
                q0 + self.queue,
                parent=sid,
                attributes={"latscope.phase": "queue"},
            )
            return sid
        offsets = self._offsets()
        first = start + self.first_token_ns()
        attrs.update(
            {
                "gen_ai.usage.input_tokens": self.input_tokens,
                "gen_ai.usage.output_tokens": self.output_tokens,
                "latscope.first_token_ns": first + host.offset_ns,
                "latscope.server.ttft_ns": self.first_token_ns(),
            }
        )
        if len(offsets) > 1:
            attrs["latscope.server.tpot_ns"] = (offsets[-1] - offsets[0]) // (len(offsets) - 1)
        sid = tb.add(
            host,
            SCOPE_LATSCOPE,
            f"chat {self.model}",
            SERVER,
            start,
            end,
            parent=parent,
            attributes=attrs,
        )
        t = start + self.lead
        for phase, dur, gap_after in (
            ("queue", self.queue, self.gap),
            ("preprocess", self.preprocess, 0),
            ("prefill", self.prefill, 0),
            ("decode", self.decode, 0),
            ("postprocess", self.postprocess, 0),
        ):
            if dur:
                extra: dict[str, Any] = {}
                if phase == "decode":
                    extra = {
                        "latscope.token_offsets_us": [o // US for o in offsets],
                        "latscope.token_count": len(offsets),
                    }
                tb.add(
                    host,
                    SCOPE_LATSCOPE,
                    phase,
                    INTERNAL,
                    t,
                    t + dur,
                    parent=sid,
                    attributes={"latscope.phase": phase, **extra},
                )
            t += dur + gap_after
        return sid


@dataclass(frozen=True)
class VllmV1Server:
    """vLLM v1's ``llm_request``: one SERVER span from the request's arrival to the output
    processor's ``do_tracing`` (vllm/v1/engine/output_processor.py), ``gen_ai.latency.*`` in
    seconds, no model name. ``lead``: arrival -> queued (frontend, IPC); ``tail``: last token ->
    span end (detokenize, output processing)."""

    model: str = "llama-3-8b"
    lead: int = 3 * MS
    queue: int = 50 * MS
    prefill: int = 150 * MS
    decode: int = 500 * MS
    tail: int = 2 * MS
    prompt_tokens: int = 600
    completion_tokens: int = 64
    request_id: str = "chatcmpl-0"
    n: int = 1

    def duration(self) -> int:
        return self.lead + self.queue + self.prefill + self.decode + self.tail

    def first_token_ns(self) -> int:
        return self.lead + self.queue + self.prefill

    def server_ttft_ns(self) -> int | None:
        return self.first_token_ns()

    def tokens(self) -> tuple[int | None, int | None]:
        return self.prompt_tokens, self.completion_tokens

    def buckets(self) -> dict[str, int]:
        return {
            "queue": self.queue,
            "prefill": self.prefill,
            "decode": self.decode,
            "other": self.lead + self.tail,
        }

    def attributes(self) -> dict[str, Any]:
        return {
            "gen_ai.latency.time_to_first_token": _seconds(self.first_token_ns()),
            "gen_ai.latency.e2e": _seconds(self.duration()),
            "gen_ai.latency.time_in_queue": _seconds(self.queue),
            "gen_ai.usage.prompt_tokens": self.prompt_tokens,
            "gen_ai.usage.completion_tokens": self.completion_tokens,
            "gen_ai.latency.time_in_model_prefill": _seconds(self.prefill),
            "gen_ai.latency.time_in_model_decode": _seconds(self.decode),
            "gen_ai.latency.time_in_model_inference": _seconds(self.prefill + self.decode),
            "gen_ai.request.id": self.request_id,
            "gen_ai.response.finish_reasons": json.dumps(["stop"]),
            "gen_ai.request.top_p": 0.9,
            "gen_ai.request.max_tokens": 1024,
            "gen_ai.request.temperature": 0.7,
            "gen_ai.request.n": self.n,
        }

    def emit(self, tb: TraceBuilder, host: Host, parent: bytes | None, start: int) -> bytes:
        return tb.add(
            host,
            SCOPE_VLLM,
            "llm_request",
            SERVER,
            start,
            start + self.duration(),
            parent=parent,
            attributes=self.attributes(),
        )


@dataclass(frozen=True)
class VllmV0Server:
    """vLLM's older engine (vllm/engine/llm_engine.py ``create_trace_span``): ``llm_request``
    SERVER span with ``time_in_queue``, ``time_to_first_token`` and ``e2e`` but no
    prefill/decode split; it carries the model as ``gen_ai.response.model``. One span per
    sequence group, also for ``n > 1``. ``tail``: finished -> span end."""

    model: str = "llama-3-8b"
    queue: int = 50 * MS
    prefill: int = 150 * MS
    decode: int = 500 * MS
    tail: int = 1 * MS
    prompt_tokens: int = 600
    completion_tokens: int = 64
    request_id: str = "cmpl-0"
    n: int = 1

    def duration(self) -> int:
        return self.queue + self.prefill + self.decode + self.tail

    def first_token_ns(self) -> int:
        return self.queue + self.prefill

    def server_ttft_ns(self) -> int | None:
        return self.first_token_ns()

    def tokens(self) -> tuple[int | None, int | None]:
        return self.prompt_tokens, self.completion_tokens

    def buckets(self) -> dict[str, int]:
        # The rule: queue = time_in_queue, prefill = ttft - queue, decode = e2e - ttft.
        return {
            "queue": self.queue,
            "prefill": self.prefill,
            "decode": self.decode,
            "other": self.tail,
        }

    def attributes(self) -> dict[str, Any]:
        e2e = self.queue + self.prefill + self.decode
        return {
            "gen_ai.response.model": self.model,
            "gen_ai.request.id": self.request_id,
            "gen_ai.request.temperature": 0.7,
            "gen_ai.request.top_p": 0.9,
            "gen_ai.request.max_tokens": 1024,
            "gen_ai.request.n": self.n,
            "gen_ai.usage.num_sequences": self.n,
            "gen_ai.usage.prompt_tokens": self.prompt_tokens,
            "gen_ai.usage.completion_tokens": self.completion_tokens,
            "gen_ai.latency.time_in_queue": _seconds(self.queue),
            "gen_ai.latency.time_to_first_token": _seconds(self.first_token_ns()),
            "gen_ai.latency.e2e": _seconds(e2e),
            "gen_ai.latency.time_in_scheduler": _seconds(self.queue // 50),
            "gen_ai.latency.time_in_model_forward": _seconds(
                (self.prefill + self.decode) * 9 // 10
            ),
            "gen_ai.latency.time_in_model_execute": _seconds(self.prefill + self.decode),
        }

    def emit(self, tb: TraceBuilder, host: Host, parent: bytes | None, start: int) -> bytes:
        return tb.add(
            host,
            SCOPE_VLLM,
            "llm_request",
            SERVER,
            start,
            start + self.duration(),
            parent=parent,
            attributes=self.attributes(),
        )


@dataclass(frozen=True)
class VllmParallel:
    """vLLM v1 with ``n > 1`` (parallel sampling): the front end fans the request out into n
    child requests (vllm/v1/engine/async_llm.py, parallel_sampling.py), each traced as its own
    ``llm_request`` span: same parent (the caller's span), same arrival (start), same
    ``gen_ai.request.id``, ``gen_ai.request.n`` = 1 (the children's sampling params), each its
    own latencies and end. One request, not retries: its server time is the child that ends last;
    output tokens add up over the children; TTFT is the first child's first token."""

    children: tuple[VllmV1Server, ...]

    @property
    def model(self) -> str:
        return self.children[0].model

    def _last(self) -> VllmV1Server:
        return max(self.children, key=lambda c: c.duration())

    def duration(self) -> int:
        return self._last().duration()

    def first_token_ns(self) -> int:
        return min(c.first_token_ns() for c in self.children)

    def server_ttft_ns(self) -> int | None:
        return self.first_token_ns()

    def tokens(self) -> tuple[int | None, int | None]:
        return self.children[0].prompt_tokens, sum(c.completion_tokens for c in self.children)

    def buckets(self) -> dict[str, int]:
        return self._last().buckets()

    def emit(self, tb: TraceBuilder, host: Host, parent: bytes | None, start: int) -> bytes:
        ids = {c.duration(): c.emit(tb, host, parent, start) for c in self.children}
        assert len(ids) == len(self.children), "children must end at distinct times"
        return ids[self.duration()]


@dataclass(frozen=True)
class SglangServer:
    """SGLang's request tracing (python/sglang/srt/observability/trace.py, req_time_stats.py).

    No span kind anywhere (INTERNAL). A root ``" Req <rid[:8]>"`` from the tokenizer manager's
    ``created_time`` to ``finished_time`` (child of the caller's span when a ``traceparent``
    came), carrying ``gen_ai.latency.*`` and usage at its end; per thread a span ``"<label> [TP r]
    (host:<id8> | pid:<pid>)"`` under the root; under those the stage slices of the levels up to
    ``slice_level`` (level 1: tokenize, prefill_waiting, prefill_forward, decode_waiting,
    decode_forward; 2: api_server_dispatch, request_process; 3: chunked_prefill, decode_loop),
    each top-level slice linked to the previous one. ``slice_level=0`` leaves the thread spans
    without slices (the ``gen_ai.latency.*`` attributes alone). Times (ns, from the root's start):
    """

    model: str = "qwen2-7b"
    tokenize: int = 4 * MS
    dispatch_gap: int = 200 * US
    dispatch: int = 500 * US
    hop: int = 400 * US
    request_process: int = 600 * US
    prefill_waiting: int = 30 * MS
    prefill_chunks: tuple[int, ...] = (90 * MS,)
    decode_waiting: int = 1 * MS
    decode_steps: tuple[int, ...] = (30 * MS,) * 8
    detokenize: int = 2 * MS
    first_token_hop: int = 1 * MS
    tp: int = 1
    slice_level: int = 3
    rid: str = "8d1f0c5e2b7a4c7e9f00112233445566"
    prompt_tokens: int = 700
    cached_tokens: int = 0
    host_id: str = "3f2a9c1d7e6b4a5f8c0d1e2f3a4b5c6d"
    pid_base: int = 4100

    def _marks(self) -> dict[str, int]:
        m: dict[str, int] = {"tok_end": self.tokenize}
        m["disp_start"] = m["tok_end"] + self.dispatch_gap
        m["disp_end"] = m["disp_start"] + self.dispatch
        m["recv"] = m["disp_end"] + self.hop
        m["wq"] = m["recv"] + self.request_process
        m["fwd"] = m["wq"] + self.prefill_waiting
        m["pf"] = m["fwd"] + sum(self.prefill_chunks)
        m["ds"] = m["pf"] + self.decode_waiting
        m["comp"] = m["ds"] + sum(self.decode_steps)
        m["finish"] = m["comp"] + self.detokenize
        m["first"] = m["pf"] + self.first_token_hop
        assert m["first"] < m["finish"]
        return m

    def duration(self) -> int:
        return self._marks()["finish"]

    def first_token_ns(self) -> int:
        return self._marks()["first"]

    def server_ttft_ns(self) -> int | None:
        return self.first_token_ns()

    @property
    def completion_tokens(self) -> int:
        # One token from prefill, one per decode iteration.
        return 1 + len(self.decode_steps)

    def tokens(self) -> tuple[int | None, int | None]:
        return self.prompt_tokens, self.completion_tokens

    def buckets(self) -> dict[str, int]:
        m = self._marks()
        if self.slice_level == 0:
            # gen_ai.latency.* alone, as for vLLM: prefill = time_in_model_prefill (dispatch end
            # to first token), decode = time_in_model_decode; no key for the queue.
            prefill, decode = m["first"] - m["disp_end"], m["finish"] - m["first"]
            return {"prefill": prefill, "decode": decode, "other": m["finish"] - prefill - decode}
        sliced = {
            "preprocess": self.tokenize,
            "queue": self.prefill_waiting + self.decode_waiting,
            "prefill": sum(self.prefill_chunks),
            "decode": sum(self.decode_steps),
        }
        return {**sliced, "other": m["finish"] - sum(sliced.values())}

    def root_attributes(self) -> dict[str, Any]:
        m = self._marks()
        return {
            "rid": self.rid,
            "module": "sglang::request",
            "gen_ai.usage.completion_tokens": self.completion_tokens,
            "gen_ai.usage.prompt_tokens": self.prompt_tokens,
            "gen_ai.usage.cached_tokens": self.cached_tokens,
            "gen_ai.request.id": self.rid,
            "gen_ai.request.max_tokens": 1024,
            "gen_ai.request.top_p": 0.9,
            "gen_ai.request.temperature": 0.7,
            "gen_ai.response.model": self.model,
            "gen_ai.response.finish_reasons": json.dumps(["stop"]),
            "gen_ai.latency.time_to_first_token": _seconds(m["first"]),
            "gen_ai.latency.e2e": _seconds(m["finish"]),
            "gen_ai.latency.time_in_model_decode": _seconds(m["finish"] - m["first"]),
            "gen_ai.latency.time_in_model_inference": _seconds(m["finish"] - m["disp_end"]),
            "gen_ai.latency.time_in_model_prefill": _seconds(m["first"] - m["disp_end"]),
        }

    def emit(self, tb: TraceBuilder, host: Host, parent: bytes | None, start: int) -> bytes:
        m = {k: start + v for k, v in self._marks().items()}
        level = self.slice_level
        root = tb.add(
            host,
            SCOPE_SGLANG,
            f" Req {self.rid[:8]}",
            INTERNAL,
            start,
            m["finish"],
            parent=parent,
            attributes=self.root_attributes(),
        )
        host8 = self.host_id[:8]
        last: list[bytes] = []  # the previous top-level slice, linked from the next

        def thread(label: str, pid: int, t0: int, t1: int, rank: int | None) -> bytes:
            name = label + (f" [TP {rank}] " if rank is not None else "")
            attrs: dict[str, Any] = {} if rank is None else {"tp_rank": rank}
            attrs.update({"host_id": self.host_id, "pid": pid, "thread_label": label})
            return tb.add(
                host,
                SCOPE_SGLANG,
                f"{name}(host:{host8} | pid:{pid})",
                INTERNAL,
                t0,
                t1,
                parent=root,
                attributes=attrs,
            )

        def top(thread_span: bytes, name: str, lvl: int, t0: int, t1: int) -> bytes | None:
            if lvl > level:
                return None
            sid = tb.add(
                host, SCOPE_SGLANG, name, INTERNAL, t0, t1, parent=thread_span, links=last[-1:]
            )
            last[:] = [sid]
            return sid

        def nested(
            parent_slice: bytes | None,
            name: str,
            durations: Sequence[int],
            t0: int,
            counter: str | None = None,
        ) -> None:
            if parent_slice is None or level < 3:
                return
            t = t0
            for i, d in enumerate(durations):
                attrs = {counter: i} if counter else None
                tb.add(
                    host,
                    SCOPE_SGLANG,
                    name,
                    INTERNAL,
                    t,
                    t + d,
                    parent=parent_slice,
                    attributes=attrs,
                )
                t += d

        tok = thread("Tokenizer", self.pid_base, start, m["disp_end"], None)
        top(tok, "tokenize", 1, start, m["tok_end"])
        top(tok, "api_server_dispatch", 2, m["disp_start"], m["disp_end"])
        after_tokenizer = list(last)
        for rank in range(self.tp):
            # Every TP rank's scheduler traces the same stages of the same batch steps.
            last[:] = after_tokenizer
            sched = thread("Scheduler", self.pid_base + 1 + rank, m["recv"], m["comp"], rank)
            top(sched, "request_process", 2, m["recv"], m["wq"])
            top(sched, "prefill_waiting", 1, m["wq"], m["fwd"])
            pf = top(sched, "prefill_forward", 1, m["fwd"], m["pf"])
            if len(self.prefill_chunks) > 1:
                nested(pf, "chunked_prefill", self.prefill_chunks, m["fwd"])
            if self.decode_waiting:
                top(sched, "decode_waiting", 1, m["pf"], m["ds"])
            dec = top(sched, "decode_forward", 1, m["ds"], m["comp"])
            nested(dec, "decode_loop", self.decode_steps, m["ds"], counter="decode_ct")
        return root


# -- clients --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SdkClient:
    """latscope's ``client_call``: CLIENT span over the whole response, ``latscope.first_*_ns``
    and ``latscope.last_byte_ns`` on the client's clock. Several server attempts (retries) may
    sit under it, ``backoff`` apart."""

    request_leg: int = 5 * MS
    response_leg: int = 5 * MS
    backoff: int = 20 * MS
    url: str = "http://llm.internal:8000/v1/chat/completions"


@dataclass(frozen=True)
class HttpxClient:
    """opentelemetry-instrumentation-httpx (or -requests / -aiohttp-client): CLIENT span named
    after the method, ended when the response *headers* arrive, so a streamed body is read after
    it ended (headers-only). ``leg``: one way on the wire, equal both ways (the symmetric
    assumption holds exactly, so the truth is exact). ``semconv``: "old" (the default attribute
    set) or "new" (``OTEL_SEMCONV_STABILITY_OPT_IN=http``)."""

    leg: int = 5 * MS
    semconv: str = "old"
    url: str = "http://llm.internal:8000/v1/chat/completions"

    def attributes(self) -> dict[str, Any]:
        if self.semconv == "old":
            return {"http.method": "POST", "http.url": self.url, "http.status_code": 200}
        host, _, port = self.url.split("/")[2].partition(":")
        return {
            "http.request.method": "POST",
            "url.full": self.url,
            "server.address": host,
            "server.port": int(port or 80),
            "network.peer.address": host,
            "network.peer.port": int(port or 80),
            "http.response.status_code": 200,
            "network.protocol.version": "1.1",
        }


@dataclass(frozen=True)
class OpenAIV2Client:
    """opentelemetry-instrumentation-openai-v2 with httpx instrumented under it: a CLIENT span
    ``chat {model}`` (gen_ai.*) from the call until the stream is exhausted, over the httpx
    headers-only POST span. ``before`` / ``after``: client-library time around the HTTP exchange.
    ``provider_key``: "provider" (``gen_ai.provider.name``, current) or "system" (the
    deprecated ``gen_ai.system`` of older releases). ``ttfc``: add ``gen_ai.request.stream`` and
    ``gen_ai.response.time_to_first_chunk`` (semantic conventions v1.41; openai-v2 2.4b0 does
    not write it, other GenAI instrumentations do)."""

    http: HttpxClient = field(default_factory=HttpxClient)
    before: int = 2 * MS
    after: int = 300 * US
    provider_key: str = "provider"
    ttfc: bool = False


@dataclass(frozen=True)
class OpenInferenceClient:
    """openinference-instrumentation-openai: a ``ChatCompletion`` span of kind INTERNAL with
    ``openinference.span.kind = LLM`` and ``llm.*`` attributes, ended when the stream is
    exhausted, with a ``First Token Stream Event`` at the first chunk. It propagates no context:
    with ``http`` (httpx instrumented too) the server joins the trace under the POST span;
    without, the server's spans form a trace of their own."""

    http: HttpxClient | None = field(default_factory=HttpxClient)
    before: int = 2 * MS
    after: int = 300 * US


@dataclass(frozen=True)
class GatewayClient:
    """An LLM gateway in between: app CLIENT -> gateway SERVER -> gateway CLIENT -> model server.
    The request is the model server with the gateway's CLIENT span (its nearest CLIENT
    ancestor); the app's time outside that (its legs to the gateway, the gateway's own work) is
    not the request's but counts as ``network`` of the call on an agent's critical path."""

    app: SdkClient = field(default_factory=SdkClient)
    inner: SdkClient = field(
        default_factory=lambda: SdkClient(url="http://vllm-0:8000" + CHAT_PATH)
    )
    before: int = 3 * MS
    after: int = 1 * MS


ClientPlan = SdkClient | HttpxClient | OpenAIV2Client | OpenInferenceClient | GatewayClient


# -- a call ---------------------------------------------------------------------------------------


@dataclass
class Call:
    """A written call: its truth, the outermost span the app made for it (None for a server-only
    call), and its extent on the true clock as the app lived it (start of the outer span to the
    end of the response)."""

    truth: Truth
    outer_span: bytes | None
    start: int
    end: int
    #: time of the call outside its request (gateway hops, client-library wrappers)
    overhead_ns: int


@dataclass(frozen=True)
class LlmCall:
    """One inference call: ``client`` (None: the server alone) over ``server``, after the failed
    attempts ``failed`` (retries; SdkClient only)."""

    client: ClientPlan | None
    server: ServerPlan
    failed: tuple[ServerPlan, ...] = ()

    def __post_init__(self) -> None:
        if self.failed and not isinstance(self.client, SdkClient):
            raise ValueError("retries are modelled under an SdkClient only")

    def duration(self) -> int:
        """The call's extent as the app lives it, start of its outer span to the response's end."""
        s = self.server.duration()
        c = self.client
        if c is None:
            return s
        if isinstance(c, SdkClient):
            attempts = sum(a.duration() + c.backoff for a in self.failed)
            return c.request_leg + attempts + s + c.response_leg
        if isinstance(c, HttpxClient):
            return 2 * c.leg + s
        if isinstance(c, (OpenAIV2Client, OpenInferenceClient)):
            inner = 0 if c.http is None else 2 * c.http.leg
            return c.before + inner + s + c.after
        a, i = c.app, c.inner
        return (
            a.request_leg + c.before + i.request_leg + s + i.response_leg + c.after + a.response_leg
        )

    def emit(
        self,
        tb: TraceBuilder,
        app: Host,
        server_host: Host,
        parent: bytes | None,
        start: int,
        *,
        gateway: Host | None = None,
    ) -> Call:
        """Write the call into ``tb`` (the app's spans on ``app``, the server's on
        ``server_host``) starting at ``start``; a GatewayClient's hop runs on ``gateway``."""
        c, srv = self.client, self.server
        s = srv.duration()
        end = start + self.duration()
        input_tokens, output_tokens = srv.tokens()
        base = {
            "server_ttft_ns": srv.server_ttft_ns(),
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "model": srv.model,
            "service": server_host.service,
        }
        shape = f"{type(c).__name__ if c else 'none'}/{type(srv).__name__}"
        if c is None:
            sid = srv.emit(tb, server_host, parent, start)
            truth = Truth(
                f"{tb.trace_hex}-{sid.hex()}",
                tb.trace_hex,
                s,
                _buckets(None, srv.buckets()),
                shape,
                **base,
            )
            return Call(truth, None, start, end, 0)

        if isinstance(c, SdkClient):
            return self._sdk(tb, c, app, server_host, parent, start, end, shape, base)

        if isinstance(c, HttpxClient):
            cid = self._headers_only(tb, c, app, server_host, parent, start)
            truth = self._headers_truth(
                tb, cid, c, shape, base, server_host.offset_ns - app.offset_ns
            )
            return Call(truth, cid, start, end, 0)

        if isinstance(c, OpenAIV2Client):
            first_chunk = start + c.before + c.http.leg + srv.first_token_ns() + c.http.leg
            attrs: dict[str, Any] = {
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": srv.model,
            }
            if c.provider_key == "provider":
                attrs["gen_ai.provider.name"] = "openai"
            else:
                attrs["gen_ai.system"] = "openai"
            if c.ttfc:
                attrs["gen_ai.request.stream"] = True
                attrs["gen_ai.response.time_to_first_chunk"] = _seconds(first_chunk - start)
            attrs.update(
                {
                    "gen_ai.response.model": srv.model,
                    "gen_ai.response.id": f"chatcmpl-{tb.rng.getrandbits(48):012x}",
                    "gen_ai.usage.input_tokens": input_tokens,
                    "gen_ai.usage.output_tokens": output_tokens,
                }
            )
            outer = tb.add(
                app,
                SCOPE_GENAI,
                f"chat {srv.model}",
                CLIENT,
                start,
                end,
                parent=parent,
                attributes=attrs,
            )
            self._headers_only(tb, c.http, app, server_host, outer, start + c.before)
            truth = self._outer_truth(
                tb, outer, start, end, shape, base, server_host.offset_ns - app.offset_ns
            )
            if c.ttfc:
                truth = replace(truth, client_ttft_ns=first_chunk - start)
            return Call(truth, outer, start, end, 0)

        if isinstance(c, OpenInferenceClient):
            return self._openinference(tb, c, app, server_host, parent, start, end, shape, base)

        return self._gateway(tb, c, app, server_host, gateway, parent, start, end, shape, base)

    # -- the shapes -------------------------------------------------------------------------------

    def _sdk(
        self,
        tb: TraceBuilder,
        c: SdkClient,
        app: Host,
        server_host: Host,
        parent: bytes | None,
        start: int,
        end: int,
        shape: str,
        base: dict[str, Any],
        *,
        scope: tuple[str, str] = SCOPE_LATSCOPE,
    ) -> Call:
        srv = self.server
        t = start + c.request_leg
        plans = [*self.failed, srv]
        starts = []
        for plan in self.failed:
            starts.append(t)
            t += plan.duration() + c.backoff
        starts.append(t)
        first_token = starts[-1] + srv.first_token_ns() + c.response_leg
        host, _, port = c.url.split("/")[2].partition(":")
        attrs = {
            "http.request.method": "POST",
            "url.full": c.url,
            "url.path": CHAT_PATH,
            "server.address": host,
            "server.port": int(port or 80),
            "gen_ai.request.model": srv.model,
            "latscope.first_byte_ns": first_token + app.offset_ns,
            "latscope.first_token_ns": first_token + app.offset_ns,
            "latscope.last_byte_ns": end + app.offset_ns,
            "http.response.status_code": 200,
        }
        cid = tb.add(
            app, scope, f"POST {CHAT_PATH}", CLIENT, start, end, parent=parent, attributes=attrs
        )
        server_time: dict[str, int] = {}
        for plan, at in zip(plans, starts, strict=True):
            plan.emit(tb, server_host, cid, at)
            for bucket, ns in plan.buckets().items():
                server_time[bucket] = server_time.get(bucket, 0) + ns
        e2e = end - start
        network = e2e - sum(p.duration() for p in plans)
        truth = Truth(
            f"{tb.trace_hex}-{cid.hex()}",
            tb.trace_hex,
            e2e,
            _buckets(network, server_time),
            shape,
            client_ttft_ns=first_token - start,
            attempts=len(plans),
            skew_ns=server_host.offset_ns - app.offset_ns,
            **base,
        )
        return Call(truth, cid, start, end, 0)

    def _headers_only(
        self,
        tb: TraceBuilder,
        c: HttpxClient,
        app: Host,
        server_host: Host,
        parent: bytes | None,
        start: int,
    ) -> bytes:
        s = self.server.duration()
        if s <= 2 * c.leg:
            raise ValueError("a headers-only client needs a server span longer than its own")
        cid = tb.add(
            app,
            SCOPE_HTTPX,
            "POST",
            CLIENT,
            start,
            start + 2 * c.leg,
            parent=parent,
            attributes=c.attributes(),
        )
        self.server.emit(tb, server_host, cid, start + c.leg)
        return cid

    def _outer_truth(
        self,
        tb: TraceBuilder,
        outer: bytes,
        start: int,
        end: int,
        shape: str,
        base: dict[str, Any],
        skew: int,
    ) -> Truth:
        # The request is the GenAI operation around the HTTP exchange, as the app made it: the
        # client library's own time and the wire are its network, the server's buckets whole.
        return Truth(
            f"{tb.trace_hex}-{outer.hex()}",
            tb.trace_hex,
            end - start,
            _buckets(end - start - self.server.duration(), self.server.buckets()),
            shape,
            skew_ns=skew,
            **base,
        )

    def _headers_truth(
        self,
        tb: TraceBuilder,
        cid: bytes,
        c: HttpxClient,
        shape: str,
        base: dict[str, Any],
        skew: int,
    ) -> Truth:
        # Headers sent at the server's start, legs equal: e2e = client + server duration, the
        # client's whole span is wire time, the server's buckets are not clipped.
        s = self.server.duration()
        return Truth(
            f"{tb.trace_hex}-{cid.hex()}",
            tb.trace_hex,
            2 * c.leg + s,
            _buckets(2 * c.leg, self.server.buckets()),
            shape,
            headers_only=True,
            skew_ns=skew,
            **base,
        )

    def _openinference(
        self,
        tb: TraceBuilder,
        c: OpenInferenceClient,
        app: Host,
        server_host: Host,
        parent: bytes | None,
        start: int,
        end: int,
        shape: str,
        base: dict[str, Any],
    ) -> Call:
        srv = self.server
        input_tokens, output_tokens = srv.tokens()
        inner = 0 if c.http is None else c.http.leg
        first_chunk = start + c.before + inner + srv.first_token_ns() + inner
        request = {
            "model": srv.model,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
            "stream_options": {"include_usage": True},
        }
        attrs = {
            "llm.system": "openai",
            "input.value": json.dumps(request),
            "input.mime_type": "application/json",
            "output.value": json.dumps({"model": srv.model, "object": "chat.completion.chunk"}),
            "output.mime_type": "application/json",
            "llm.invocation_parameters": json.dumps({"model": srv.model, "stream": True}),
            "llm.input_messages.0.message.role": "user",
            "llm.input_messages.0.message.content": "hi",
            "llm.model_name": srv.model,
            "llm.token_count.total": (input_tokens or 0) + (output_tokens or 0),
            "llm.token_count.prompt": input_tokens,
            "llm.token_count.completion": output_tokens,
            "llm.output_messages.0.message.role": "assistant",
            "llm.output_messages.0.message.content": "...",
            "llm.finish_reason": "stop",
            "openinference.span.kind": "LLM",
        }
        outer = tb.add(
            app,
            SCOPE_OPENINFERENCE,
            "ChatCompletion",
            INTERNAL,
            start,
            end,
            parent=parent,
            attributes=attrs,
            events=[("First Token Stream Event", first_chunk, {})],
            status=Status.STATUS_CODE_OK,
        )
        skew = server_host.offset_ns - app.offset_ns
        if c.http is not None:
            self._headers_only(tb, c.http, app, server_host, outer, start + c.before)
            truth = self._outer_truth(tb, outer, start, end, shape, base, skew)
            return Call(replace(truth, client_ttft_ns=first_chunk - start), outer, start, end, 0)
        # No propagation: the server's spans make a trace of their own, a server-only request.
        own = TraceBuilder(tb.rng)
        sid = srv.emit(own, server_host, None, start + c.before)
        tb.side_traces.append(own)
        truth = Truth(
            f"{own.trace_hex}-{sid.hex()}",
            own.trace_hex,
            srv.duration(),
            _buckets(None, srv.buckets()),
            shape,
            **base,
        )
        return Call(truth, outer, start, end, end - start - srv.duration())

    def _gateway(
        self,
        tb: TraceBuilder,
        c: GatewayClient,
        app: Host,
        server_host: Host,
        gateway: Host | None,
        parent: bytes | None,
        start: int,
        end: int,
        shape: str,
        base: dict[str, Any],
    ) -> Call:
        gw = gateway or Host("llm-gateway")
        a = c.app
        outer_attrs = {
            "http.request.method": "POST",
            "url.full": a.url,
            "url.path": CHAT_PATH,
            "gen_ai.request.model": self.server.model,
            "latscope.last_byte_ns": end + app.offset_ns,
            "http.response.status_code": 200,
        }
        outer = tb.add(
            app,
            SCOPE_LATSCOPE,
            f"POST {CHAT_PATH}",
            CLIENT,
            start,
            end,
            parent=parent,
            attributes=outer_attrs,
        )
        g0 = start + a.request_leg
        g1 = end - a.response_leg
        gsrv = tb.add(
            gw,
            ("gateway", ""),
            f"POST {CHAT_PATH}",
            SERVER,
            g0,
            g1,
            parent=outer,
            attributes={
                "http.request.method": "POST",
                "http.route": CHAT_PATH,
                "url.path": CHAT_PATH,
                "http.response.status_code": 200,
            },
        )
        inner_start = g0 + c.before
        inner_end = g1 - c.after
        call = LlmCall(c.inner, self.server)._sdk(
            tb,
            c.inner,
            gw,
            server_host,
            gsrv,
            inner_start,
            inner_end,
            shape,
            base,
            scope=("gateway", ""),
        )
        return Call(call.truth, outer, start, end, (end - start) - call.truth.e2e_ns)


def finish(tb: TraceBuilder, truths: list[Truth]) -> Built:
    """The Built of ``tb`` and the traces its calls split off."""
    return _built([tb, *tb.side_traces], truths)


# -- random plans ---------------------------------------------------------------------------------

SERVER_KINDS: Final = ("sdk", "vllm_v1", "vllm_v0", "vllm_n", "sglang")
CLIENT_KINDS: Final = ("sdk", "httpx", "openai_v2", "openinference", "gateway")


def random_server(
    rng: random.Random, kind: str, *, model: str | None = None, **knobs: Any
) -> ServerPlan:
    """A server plan of ``kind`` with random durations (ns resolution); ``knobs`` override fields
    (``n`` for vllm_n; ``tp``, ``slice_level``, ``chunks``, ``decode_steps`` for sglang)."""
    rid = f"{rng.getrandbits(128):032x}"
    if kind == "sdk":
        plan: Any = SdkServer(
            model=model or "llama-3-8b",
            lead=_draw(rng, 0.1, 3),
            queue=_draw(rng, 0, 200),
            gap=_draw(rng, 0, 2),
            preprocess=_draw(rng, 1, 30),
            prefill=_draw(rng, 20, 300),
            decode=_draw(rng, 60, 1500),
            postprocess=_draw(rng, 0, 20),
            tail=_draw(rng, 0.1, 3),
            input_tokens=rng.randint(20, 2000),
            output_tokens=rng.randint(2, 300),
        )
    elif kind in ("vllm_v1", "vllm_n"):
        n = knobs.pop("n", rng.randint(2, 4)) if kind == "vllm_n" else 1
        prompt = rng.randint(20, 2000)
        lead = _draw(rng, 0.5, 10)
        children = []
        while len({c.duration() for c in children}) < n:
            children = [
                VllmV1Server(
                    model=model or "llama-3-8b",
                    lead=lead,
                    queue=_draw(rng, 0, 300),
                    prefill=_draw(rng, 20, 300),
                    decode=_draw(rng, 60, 1500),
                    tail=_draw(rng, 0.1, 5),
                    prompt_tokens=prompt,
                    completion_tokens=rng.randint(2, 300),
                    request_id=f"chatcmpl-{rid}",
                )
                for _ in range(n)
            ]
        plan = children[0] if kind == "vllm_v1" else VllmParallel(tuple(children))
    elif kind == "vllm_v0":
        plan = VllmV0Server(
            model=model or "llama-3-8b",
            queue=_draw(rng, 0, 300),
            prefill=_draw(rng, 20, 300),
            decode=_draw(rng, 60, 1500),
            tail=_draw(rng, 0.05, 3),
            prompt_tokens=rng.randint(20, 2000),
            completion_tokens=rng.randint(2, 300),
            request_id=f"cmpl-{rid}",
        )
    elif kind == "sglang":
        chunks = knobs.pop("chunks", rng.randint(1, 3))
        steps = knobs.pop("decode_steps", rng.randint(2, 8))
        plan = SglangServer(
            model=model or "qwen2-7b",
            tokenize=_draw(rng, 1, 20),
            dispatch_gap=_draw(rng, 0.05, 1),
            dispatch=_draw(rng, 0.1, 2),
            hop=_draw(rng, 0.1, 2),
            request_process=_draw(rng, 0.1, 3),
            prefill_waiting=_draw(rng, 0, 200),
            prefill_chunks=tuple(_draw(rng, 10, 150) for _ in range(chunks)),
            decode_waiting=rng.choice((0, _draw(rng, 0.1, 5))),
            decode_steps=tuple(_draw(rng, 10, 60) for _ in range(steps)),
            detokenize=_draw(rng, 0.5, 5),
            first_token_hop=_draw(rng, 0.3, 3),
            tp=knobs.pop("tp", rng.choice((1, 1, 2))),
            slice_level=knobs.pop("slice_level", 3),
            rid=rid,
            prompt_tokens=rng.randint(20, 2000),
            cached_tokens=rng.randint(0, 20),
            host_id=f"{rng.getrandbits(128):032x}",
            pid_base=rng.randint(1000, 60000),
        )
    else:
        raise ValueError(f"server kind {kind!r} is not one of {SERVER_KINDS}")
    return replace(plan, **knobs) if knobs else plan  # type: ignore[no-any-return]


def random_client(rng: random.Random, kind: str | None, **knobs: Any) -> ClientPlan | None:
    """A client plan of ``kind`` (None: no client) with random legs."""
    if kind is None:
        return None
    if kind == "sdk":
        return SdkClient(_draw(rng, 0.5, 20), _draw(rng, 0.5, 20), _draw(rng, 5, 80), **knobs)
    http = HttpxClient(
        _draw(rng, 0.5, 10), semconv=knobs.pop("semconv", rng.choice(("old", "new")))
    )
    if kind == "httpx":
        return http
    if kind == "openai_v2":
        return OpenAIV2Client(http, _draw(rng, 0.2, 5), _draw(rng, 0.05, 2), **knobs)
    if kind == "openinference":
        return OpenInferenceClient(
            http if knobs.pop("with_httpx", True) else None, _draw(rng, 0.2, 5), _draw(rng, 0.05, 2)
        )
    if kind == "gateway":
        return GatewayClient(
            random_client(rng, "sdk"),
            random_client(rng, "sdk"),  # type: ignore[arg-type]
            _draw(rng, 0.2, 8),
            _draw(rng, 0.1, 3),
        )
    raise ValueError(f"client kind {kind!r} is not one of {CLIENT_KINDS}")


# -- the builders ---------------------------------------------------------------------------------


def single_call(
    seed: int,
    *,
    client: str | None,
    server: str,
    skew_ns: int = 0,
    retries: int = 0,
    start_ns: int = T0,
    client_knobs: Mapping[str, Any] | None = None,
    **server_knobs: Any,
) -> Built:
    """One call of ``client`` kind (None: no client span) over ``server`` kind, durations drawn
    from ``seed``; the server's clock runs ``skew_ns`` ahead of the client's; ``retries`` failed
    attempts before the one that answers (SdkClient and SdkServer only)."""
    rng = random.Random(seed)
    plan = random_server(rng, server, **server_knobs)
    failed = tuple(
        replace(random_server(rng, "sdk"), failed=True)  # type: ignore[type-var]
        for _ in range(retries)
    )
    call = LlmCall(random_client(rng, client, **dict(client_knobs or {})), plan, failed)
    # SGLang's own id generator makes 64-bit trace ids when no traceparent came.
    tb = TraceBuilder(rng, trace_id_bits=64 if server == "sglang" and client is None else 128)
    app = Host("chat-frontend")
    srv = Host(server.replace("_", "-") + "-server", skew_ns)
    made = call.emit(tb, app, srv, None, start_ns, gateway=Host("llm-gateway", skew_ns // 2))
    return finish(tb, [made.truth])


def sdk_request(seed: int, *, client: str | None = "sdk", **kw: Any) -> Built:
    """latscope SDK server (phase spans) under ``client``: "sdk", "httpx" (headers-only), ...
    ``retries=k`` for k failed attempts under one SDK client."""
    return single_call(seed, client=client, server="sdk", **kw)


def sglang_request(
    seed: int,
    *,
    client: str | None = "httpx",
    tp: int = 1,
    slice_level: int = 3,
    chunks: int = 1,
    decode_steps: int = 4,
    **kw: Any,
) -> Built:
    """An SGLang request: root + per-thread spans + stage slices up to ``slice_level``."""
    return single_call(
        seed,
        client=client,
        server="sglang",
        tp=tp,
        slice_level=slice_level,
        chunks=chunks,
        decode_steps=decode_steps,
        **kw,
    )


def vllm_v1_request(seed: int, *, client: str | None = "sdk", **kw: Any) -> Built:
    """vLLM v1 ``llm_request`` (prefill/decode split) under ``client``."""
    return single_call(seed, client=client, server="vllm_v1", **kw)


def vllm_v0_request(seed: int, *, client: str | None = "sdk", **kw: Any) -> Built:
    """vLLM's older ``llm_request`` (no prefill/decode split) under ``client``."""
    return single_call(seed, client=client, server="vllm_v0", **kw)


def vllm_parallel_request(seed: int, *, n: int = 3, client: str | None = "sdk", **kw: Any) -> Built:
    """vLLM v1 with ``n`` parallel samples: n ``llm_request`` spans , one request."""
    return single_call(seed, client=client, server="vllm_n", n=n, **kw)


def httpx_stream(seed: int, *, server: str = "sdk", semconv: str = "old", **kw: Any) -> Built:
    """An httpx-instrumented streaming client (headers-only CLIENT span) over ``server``."""
    return single_call(seed, client="httpx", server=server, client_knobs={"semconv": semconv}, **kw)


def openai_v2_chat(
    seed: int,
    *,
    server: str = "vllm_v1",
    provider_key: str = "provider",
    ttfc: bool = False,
    **kw: Any,
) -> Built:
    """openai-v2's ``chat {model}`` CLIENT span over an httpx headers-only POST, over ``server``."""
    return single_call(
        seed,
        client="openai_v2",
        server=server,
        client_knobs={"provider_key": provider_key, "ttfc": ttfc},
        **kw,
    )


def openinference_chat(
    seed: int, *, server: str = "vllm_v1", with_httpx: bool = True, **kw: Any
) -> Built:
    """OpenInference's ``ChatCompletion`` (INTERNAL, LLM) span, with httpx's POST under it (the
    server joins the trace) or alone (the server's spans are a second trace)."""
    return single_call(
        seed, client="openinference", server=server, client_knobs={"with_httpx": with_httpx}, **kw
    )


#: Every builder in the shapes it offers, for tests that go through them all: (label,
#: seed -> Built).
BUILDERS: list[tuple[str, Callable[[int], Built]]] = [
    ("sdk", lambda s: sdk_request(s)),
    ("sdk-retries", lambda s: sdk_request(s, retries=2)),
    ("sdk-no-client", lambda s: sdk_request(s, client=None)),
    ("sglang-httpx", lambda s: sglang_request(s, tp=2, chunks=2)),
    ("sglang-alone", lambda s: sglang_request(s, client=None)),
    ("sglang-level1", lambda s: sglang_request(s, client="sdk", slice_level=1)),
    ("sglang-no-slices", lambda s: sglang_request(s, client="sdk", slice_level=0)),
    ("vllm-v1", lambda s: vllm_v1_request(s, skew_ns=2_500 * MS)),
    ("vllm-v0", lambda s: vllm_v0_request(s)),
    ("vllm-n3", lambda s: vllm_parallel_request(s, n=3)),
    ("httpx-sdk", lambda s: httpx_stream(s, server="sdk")),
    ("httpx-vllm-new-semconv", lambda s: httpx_stream(s, server="vllm_v1", semconv="new")),
    ("openai-v2", lambda s: openai_v2_chat(s, skew_ns=-1_200 * MS)),
    ("openai-v2-system-ttfc", lambda s: openai_v2_chat(s, provider_key="system", ttfc=True)),
    ("openinference-httpx", lambda s: openinference_chat(s)),
    ("openinference-alone", lambda s: openinference_chat(s, with_httpx=False)),
    ("gateway", lambda s: sdk_request(s, client="gateway")),
]


# -- as older ClickHouse exporters stored them ----------------------------------------------------

#: SpanKind / StatusCode as the exporter wrote them before opentelemetry-collector-contrib
#: PR 34799 (Aug 2024): the proto enum names, via internal/coreinternal/traceutil.
OLD_SPAN_KINDS: Final = (
    "SPAN_KIND_UNSPECIFIED",
    "SPAN_KIND_INTERNAL",
    "SPAN_KIND_SERVER",
    "SPAN_KIND_CLIENT",
    "SPAN_KIND_PRODUCER",
    "SPAN_KIND_CONSUMER",
)
OLD_STATUS_CODES: Final = ("STATUS_CODE_UNSET", "STATUS_CODE_OK", "STATUS_CODE_ERROR")

#: The traces table the older exporter created (exporter_traces.go before the sqltemplates
#: refactor): no ScopeName/ScopeVersion columns (the scope went into SpanAttributes as
#: ``otel.scope.name`` / ``otel.scope.version``), ``Duration Int64``. ``{table}`` to fill in.
OLD_EXPORTER_TRACES_DDL: Final = """
CREATE TABLE IF NOT EXISTS {table} (
    Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)),
    TraceId String CODEC(ZSTD(1)),
    SpanId String CODEC(ZSTD(1)),
    ParentSpanId String CODEC(ZSTD(1)),
    TraceState String CODEC(ZSTD(1)),
    SpanName LowCardinality(String) CODEC(ZSTD(1)),
    SpanKind LowCardinality(String) CODEC(ZSTD(1)),
    ServiceName LowCardinality(String) CODEC(ZSTD(1)),
    ResourceAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    SpanAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    Duration Int64 CODEC(ZSTD(1)),
    StatusCode LowCardinality(String) CODEC(ZSTD(1)),
    StatusMessage String CODEC(ZSTD(1)),
    Events Nested (
        Timestamp DateTime64(9),
        Name LowCardinality(String),
        Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
    Links Nested (
        TraceId String,
        SpanId String,
        TraceState String,
        Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1))
) ENGINE MergeTree()
PARTITION BY toDate(Timestamp)
ORDER BY (ServiceName, SpanName, toUnixTimestamp(Timestamp), TraceId)
"""

#: The exporter's JSON layout (``json: true``, earlier the ``clickhouse.json`` feature gate;
#: internal/sqltemplates/traces_json_table.sql): attribute columns typed ``JSON`` instead of
#: ``Map(LowCardinality(String), String)``. ``{table}`` to fill in.
JSON_EXPORTER_TRACES_DDL: Final = """
CREATE TABLE IF NOT EXISTS {table} (
    Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)),
    TraceId String CODEC(ZSTD(1)),
    SpanId String CODEC(ZSTD(1)),
    ParentSpanId String CODEC(ZSTD(1)),
    TraceState String CODEC(ZSTD(1)),
    SpanName LowCardinality(String) CODEC(ZSTD(1)),
    SpanKind LowCardinality(String) CODEC(ZSTD(1)),
    ServiceName LowCardinality(String) CODEC(ZSTD(1)),
    ResourceAttributes JSON CODEC(ZSTD(1)),
    ScopeName String CODEC(ZSTD(1)),
    ScopeVersion String CODEC(ZSTD(1)),
    SpanAttributes JSON CODEC(ZSTD(1)),
    Duration UInt64 CODEC(ZSTD(1)),
    StatusCode LowCardinality(String) CODEC(ZSTD(1)),
    StatusMessage String CODEC(ZSTD(1)),
    Events Nested (
        Timestamp DateTime64(9),
        Name LowCardinality(String),
        Attributes JSON
    ) CODEC(ZSTD(1)),
    Links Nested (
        TraceId String,
        SpanId String,
        TraceState String,
        Attributes JSON
    ) CODEC(ZSTD(1)),
    INDEX idx_duration Duration TYPE minmax GRANULARITY 1
) ENGINE = MergeTree()
PARTITION BY toDate(Timestamp)
ORDER BY (ServiceName, SpanName, toDateTime(Timestamp), Timestamp)
"""


def old_exporter_rows(resource_spans: Iterable[ResourceSpans]) -> list[dict[str, Any]]:
    """Each span as a row of ``OLD_EXPORTER_TRACES_DDL``, with the values the older exporter
    wrote: enum-name kinds and status codes, the scope inside SpanAttributes, hex ids, attribute
    values rendered as strings (Timestamps in ns since the epoch)."""
    rows = []
    for rs in resource_spans:
        resource = {kv.key: value_to_string(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                attrs = {kv.key: value_to_string(kv.value) for kv in s.attributes}
                if ss.scope.name:
                    attrs["otel.scope.name"] = ss.scope.name
                if ss.scope.version:
                    attrs["otel.scope.version"] = ss.scope.version
                rows.append(
                    {
                        "Timestamp": s.start_time_unix_nano,
                        "TraceId": s.trace_id.hex(),
                        "SpanId": s.span_id.hex(),
                        "ParentSpanId": s.parent_span_id.hex(),
                        "TraceState": s.trace_state,
                        "SpanName": s.name,
                        "SpanKind": OLD_SPAN_KINDS[s.kind],
                        "ServiceName": resource.get("service.name", ""),
                        "ResourceAttributes": resource,
                        "SpanAttributes": attrs,
                        "Duration": s.end_time_unix_nano - s.start_time_unix_nano,
                        "StatusCode": OLD_STATUS_CODES[s.status.code],
                        "StatusMessage": s.status.message,
                        "Events.Timestamp": [e.time_unix_nano for e in s.events],
                        "Events.Name": [e.name for e in s.events],
                        "Events.Attributes": [
                            {kv.key: value_to_string(kv.value) for kv in e.attributes}
                            for e in s.events
                        ],
                        "Links.TraceId": [ln.trace_id.hex() for ln in s.links],
                        "Links.SpanId": [ln.span_id.hex() for ln in s.links],
                        "Links.TraceState": [ln.trace_state for ln in s.links],
                        "Links.Attributes": [
                            {kv.key: value_to_string(kv.value) for kv in ln.attributes}
                            for ln in s.links
                        ],
                    }
                )
    return rows


def old_exporter_arrow(resource_spans: Iterable[ResourceSpans]) -> pa.Table:
    """The spans as rows of latscope's spans table (``otel_traces``) carrying the older
    exporter's values (``SPAN_KIND_SERVER``, ``STATUS_CODE_ERROR``, the scope in SpanAttributes,
    empty ScopeName): what a table shared with an old Collector pipeline holds."""
    spans = list(resource_spans)
    table = spans_table(spans)
    old = old_exporter_rows(spans)
    assert table.num_rows == len(old)
    names = table.column_names
    for column in ("SpanKind", "StatusCode"):
        i = names.index(column)
        table = table.set_column(
            i, column, pa.array([r[column] for r in old], table.schema.field(i).type)
        )
    i = names.index("SpanAttributes")
    attrs = pa.array([list(r["SpanAttributes"].items()) for r in old], table.schema.field(i).type)
    table = table.set_column(i, "SpanAttributes", attrs)
    for column in ("ScopeName", "ScopeVersion"):
        i = names.index(column)
        table = table.set_column(i, column, pa.array([""] * len(old), table.schema.field(i).type))
    return table
