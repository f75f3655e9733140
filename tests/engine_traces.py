"""Traces shaped the way serving engines emit them with their own tracing on, each with its truth.

``tests/upstream_traces.py`` covers vLLM's ``llm_request`` and SGLang's request tree; this module
covers the engines beyond them, as ``docs/attribution.md`` ("Engines") describes what each writes
(the sources read are named there and on each plan below):

- TensorRT-LLM's OpenAI server (``TrtllmServer``) and its disaggregated proxy with a context and
  a generation server (``TrtllmDisaggServer``, KV-cache transfer events on the generation span);
- Triton Inference Server in OpenTelemetry mode (``TritonServer``): ``InferRequest`` over a span per
  model over a ``compute`` span, stages as span events, for the TensorRT-LLM backend alone, the
  TensorRT-LLM ensemble (preprocessing, tensorrt_llm, postprocessing), the TensorRT-LLM BLS model
  and the vLLM backend (whose engine, traced, writes a trace of its own);
- Hugging Face TGI (``TgiServer``): the route handler span with its formatted durations over the
  router's ``queued`` / ``infer`` / ``send_generation`` spans;
- vLLM beyond ``llm_request``: the ``--collect-detailed-traces`` figures of the older engine
  (``VllmDetailedServer``), stage child spans (``VllmStageServer``: the upstream proposal's
  ``vllm_*`` names and a vendor's bare ``queue`` / ``prefill`` / ``decode``), and the startup spans
  (``vllm_startup``: a loading trace and a replica's first requests);
- NVIDIA Dynamo (``DynamoServer``): the frontend's ``http-request`` over a worker's
  ``handle_payload`` over the engine's own request span (vLLM, SGLang or TensorRT-LLM), aggregated
  or with a prefill and a decode worker.

Every plan is a ``ServerPlan`` of ``tests/upstream_traces.py``, so ``LlmCall`` puts any client
over it; ``engine_call`` writes one call and returns ``Built`` with an ``EngineTruth``: the seven
buckets by the engine's own figures, plus the KV-cache transfer and the engine's figures in ns.

Choices the truth takes where the rules are open (the rulebook proposal follows them):

- The request's server side is the serving system's outermost span (TensorRT-LLM's proxy span,
  Triton's ``InferRequest``, TGI's handler span, Dynamo's ``http-request``); an engine's spans
  inside it give the stages; its other time is ``other``, never network. Time before an engine's
  first span (TensorRT-LLM's OpenAI server tokenizing before the executor's arrival) is covered by
  no span: it is part of the client's legs, network.
- A KV-cache transfer is neither queueing nor compute on the request: it stays ``other`` (as
  SGLang's transfer stages do) and is reported as ``kv_transfer_ns``. A decode worker's queue
  figure that includes the transfer (TensorRT-LLM's ``time_in_queue`` on a generation server)
  counts without it.
- Triton's phases: a model's ``[QUEUE_START, COMPUTE_START]`` is queue; the LLM model's compute
  splits at ``COMPUTE_INPUT_END`` (preprocess before), the ``InferRequest``'s first
  ``INFER_RESPONSE_COMPLETE`` (prefill before, decode after) and ``COMPUTE_OUTPUT_START``
  (postprocess after); a decoupled Python model (the vLLM backend), whose ``execute`` returns
  before generating, has its compute as preprocess, prefill up to the first response and decode
  up to the last; the ensemble's ``preprocessing`` and ``postprocessing`` models' computes are
  preprocess and postprocess. Overlaps go by the overlap priority (decode, prefill, preprocess,
  postprocess, queue).
- TGI: ``validation_time`` is preprocess, ``queue_time`` queue, the first ``infer`` span prefill,
  the rest of ``inference_time`` decode; the first token is at the end of the first ``infer``.
- Stage child spans win over the same engine's latency attributes (as SGLang's slices do).
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Final

from tests.upstream_traces import (
    CLIENT,
    INTERNAL,
    MS,
    SECOND,
    SERVER,
    SERVER_BUCKETS,
    T0,
    US,
    Built,
    Host,
    LlmCall,
    TraceBuilder,
    Truth,
    VllmV0Server,
    VllmV1Server,
    finish,
    random_client,
    random_server,
)

SCOPE_TRTLLM: Final = ("tensorrt_llm", "")
SCOPE_TRITON: Final = ("triton-server", "")
SCOPE_TGI: Final = ("opentelemetry-otlp", "0.13.0")
SCOPE_VLLM: Final = ("vllm.llm_engine", "")
SCOPE_DYNAMO: Final = ("dynamo", "")

#: Overlap priority of docs/attribution.md: the first listed wins overlapping time.
PRIORITY: Final = ("decode", "prefill", "preprocess", "postprocess", "queue")


def seconds(ns: int) -> float:
    """ns as the float seconds the engines write."""
    return ns / SECOND


def rust_duration(ns: int) -> str:
    """A ``std::time::Duration`` as Rust's ``{:?}`` writes it (what TGI records in its spans):
    the largest unit of s, ms, µs and ns that the value reaches, with every non-zero fractional
    digit and no trailing zeros (``1.5s``, ``12.0345ms``, ``250µs``, ``0ns``).

    >>> rust_duration(1_500_000_000), rust_duration(12_034_500), rust_duration(250_000)
    ('1.5s', '12.0345ms', '250µs')
    """
    for unit, scale in (("s", SECOND), ("ms", MS), ("µs", US)):
        if ns >= scale:
            whole, frac = divmod(ns, scale)
            digits = str(frac).rjust(len(str(scale)) - 1, "0").rstrip("0")
            return f"{whole}.{digits}{unit}" if digits else f"{whole}{unit}"
    return f"{ns}ns"


def parse_rust_duration(text: str) -> int:
    """The ns of a ``rust_duration`` string (``µ`` as U+00B5 or U+03BC)."""
    for unit, scale in (("ms", MS), ("µs", US), ("μs", US), ("ns", 1), ("s", SECOND)):
        if text.endswith(unit):
            whole, _, frac = text[: -len(unit)].partition(".")
            width = len(str(scale)) - 1
            return int(whole) * scale + (int(frac.ljust(width, "0")) if frac else 0)
    raise ValueError(f"not a Rust Duration: {text!r}")


def paint(window: tuple[int, int], intervals: Sequence[tuple[str, int, int]]) -> dict[str, int]:
    """The truth's own sweep: each instant of ``window`` to the highest-priority interval covering
    it, else ``other``; the buckets inside the server span (``SERVER_BUCKETS``)."""
    lo, hi = window
    cuts = sorted({lo, hi, *(max(lo, min(hi, t)) for _, a, b in intervals for t in (a, b))})
    out = dict.fromkeys(SERVER_BUCKETS, 0)
    for a, b in itertools.pairwise(cuts):
        covering = [name for name, s, e in intervals if s <= a and e >= b]
        best = min(covering, key=PRIORITY.index) if covering else "other"
        out[best] += b - a
    return out


def _draw(rng: random.Random, lo_ms: float, hi_ms: float) -> int:
    return rng.randint(int(lo_ms * MS), int(hi_ms * MS))


def _steps(rng: random.Random, n: int, lo_ms: float, hi_ms: float) -> tuple[int, ...]:
    return tuple(_draw(rng, lo_ms, hi_ms) for _ in range(n))


def _peer(host: Host, service: str, **resource: Any) -> Host:
    """Another process of the same deployment: same clock as ``host``."""
    return Host(service, host.offset_ns, {**host.resource, **resource})


# -- the truth ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineTruth(Truth):
    """``Truth`` plus what an engine adds: which engine shape wrote it, the KV-cache transfer of a
    disaggregated request (ns; None when there is none or the engine does not name it), and the
    engine's own figures in ns (name -> value, as the engine writes them before unit conversion:
    ``time_in_queue``, ``queue_time``, ``COMPUTE_START`` - ``QUEUE_START``, ...)."""

    engine: str = ""
    kv_transfer_ns: int | None = None
    figures: Mapping[str, int] = field(default_factory=dict)


class EnginePlan:
    """What the engine plans add to ``ServerPlan``: their name, KV transfer and own figures
    (and the ``ServerPlan`` methods most plans share)."""

    engine: str = ""

    def first_token_ns(self) -> int:
        raise NotImplementedError

    def server_ttft_ns(self) -> int | None:
        return self.first_token_ns()

    def tokens(self) -> tuple[int | None, int | None]:
        return None, None

    def kv_transfer_ns(self) -> int | None:
        return None

    def figures(self) -> dict[str, int]:
        return {}


# -- TensorRT-LLM ---------------------------------------------------------------------------------


def _trtllm_attributes(
    *,
    queue: int,
    ttft: int,
    e2e: int,
    prompt_tokens: int,
    completion_tokens: int,
    request_id: int,
    finish_reason: str,
) -> dict[str, Any]:
    return {
        "gen_ai.request.temperature": 0.8,
        "gen_ai.request.top_p": 0.95,
        "gen_ai.request.top_k": 40,
        "gen_ai.request.max_tokens": 1024,
        "gen_ai.request.n": 1,
        "gen_ai.request.id": request_id,
        "gen_ai.usage.prompt_tokens": prompt_tokens,
        "gen_ai.usage.completion_tokens": completion_tokens,
        "gen_ai.latency.time_to_first_token": seconds(ttft),
        "gen_ai.latency.e2e": seconds(e2e),
        "gen_ai.latency.time_in_queue": seconds(queue),
        "gen_ai.response.finish_reasons": json.dumps([finish_reason]),
    }


def _trtllm_span(
    tb: TraceBuilder,
    host: Host,
    parent: bytes | None,
    start: int,
    duration: int,
    attributes: Mapping[str, Any],
    events: Sequence[tuple[str, int, Mapping[str, Any]]] = (),
) -> bytes:
    """TensorRT-LLM's ``llm_request`` (SERVER) of one server."""
    return tb.add(
        host,
        SCOPE_TRTLLM,
        "llm_request",
        SERVER,
        start,
        start + duration,
        parent=parent,
        attributes=attributes,
        events=events,
    )


@dataclass(frozen=True)
class TrtllmServer(VllmV0Server, EnginePlan):
    """``trtllm-serve`` with ``--otlp_traces_endpoint`` (and ``return_perf_metrics``): one
    ``llm_request`` SERVER span per request, from the executor's arrival (child of the request's
    ``traceparent``), ended when the result is traced after the last token; latencies in float
    seconds from the request's perf metrics: ``time_in_queue`` = first scheduled - arrival,
    ``time_to_first_token`` = first token - arrival, ``e2e`` = last token - arrival. No model
    name. The timeline is the older vLLM engine's (``VllmV0Server``): queue, prefill, decode
    from the arrival, ``tail`` after the last token."""

    engine = "trtllm"
    model: str = "llama-3.1-8b"
    queue: int = 30 * MS
    prefill: int = 120 * MS
    decode: int = 600 * MS
    tail: int = 2 * MS
    prompt_tokens: int = 700
    completion_tokens: int = 80
    request_id: int = 7  # the executor's integer id

    def figures(self) -> dict[str, int]:
        return {
            "time_in_queue": self.queue,
            "time_to_first_token": self.queue + self.prefill,
            "e2e": self.queue + self.prefill + self.decode,
        }

    def attributes(self) -> dict[str, Any]:
        return _trtllm_attributes(
            queue=self.queue,
            ttft=self.queue + self.prefill,
            e2e=self.queue + self.prefill + self.decode,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            request_id=self.request_id,
            finish_reason="stop",
        )

    def emit(self, tb: TraceBuilder, host: Host, parent: bytes | None, start: int) -> bytes:
        return _trtllm_span(tb, host, parent, start, self.duration(), self.attributes())


@dataclass(frozen=True)
class TrtllmContextLeg:
    """A disaggregated context (prefill) server's ``llm_request``: a context-only request, from
    its arrival: ``queue`` until first scheduled, ``prefill`` until its first token (which is
    also its last: ``e2e`` = ``time_to_first_token``, finish reason ``not_finished``),
    ``tail`` until the span ends."""

    queue: int = 20 * MS
    prefill: int = 150 * MS
    tail: int = 3 * MS
    prompt_tokens: int = 1200
    request_id: int = 11

    def duration(self) -> int:
        return self.queue + self.prefill + self.tail

    def first_token_ns(self) -> int:
        return self.queue + self.prefill

    def buckets(self) -> dict[str, int]:
        return {"queue": self.queue, "prefill": self.prefill, "other": self.tail}

    def emit(self, tb: TraceBuilder, host: Host, parent: bytes | None, start: int) -> bytes:
        ttft = self.queue + self.prefill
        attrs = _trtllm_attributes(
            queue=self.queue,
            ttft=ttft,
            e2e=ttft,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=1,
            request_id=self.request_id,
            finish_reason="not_finished",
        )
        return _trtllm_span(tb, host, parent, start, self.duration(), attrs)


@dataclass(frozen=True)
class TrtllmGenerationLeg:
    """A disaggregated generation (decode) server's ``llm_request``, from its arrival: ``setup``
    until the KV-cache transfer starts, ``kv`` the transfer (``kv_cache_transfer_time`` and the
    events ``kv_cache_transfer_start`` / ``kv_cache_transfer_end``, the latter with
    ``kv_cache_size``), ``wait`` until first scheduled (``time_in_queue`` covers all three),
    ``first`` its first step (its ``time_to_first_token`` runs to there), the rest of
    ``decode``, ``tail`` until the span ends."""

    setup: int = 2 * MS
    kv: int = 25 * MS
    wait: int = 3 * MS
    first: int = 20 * MS
    decode: int = 500 * MS
    tail: int = 2 * MS
    prompt_tokens: int = 1200
    completion_tokens: int = 60
    kv_cache_size: int = 150_000_000
    request_id: int = 12

    def __post_init__(self) -> None:
        if self.first > self.decode:
            raise ValueError("the first step is part of decode")

    @property
    def scheduled(self) -> int:
        return self.setup + self.kv + self.wait

    def duration(self) -> int:
        return self.scheduled + self.decode + self.tail

    def buckets(self) -> dict[str, int]:
        return {
            "queue": self.setup + self.wait,
            "decode": self.decode,
            "other": self.kv + self.tail,
        }

    def emit(self, tb: TraceBuilder, host: Host, parent: bytes | None, start: int) -> bytes:
        attrs = _trtllm_attributes(
            queue=self.scheduled,
            ttft=self.scheduled + self.first,
            e2e=self.scheduled + self.decode,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            request_id=self.request_id,
            finish_reason="stop",
        )
        attrs["gen_ai.latency.kv_cache_transfer_time"] = seconds(self.kv)
        ts = start + self.setup
        return _trtllm_span(
            tb,
            host,
            parent,
            start,
            self.duration(),
            attrs,
            [
                ("kv_cache_transfer_start", ts, {}),
                ("kv_cache_transfer_end", ts + self.kv, {"kv_cache_size": self.kv_cache_size}),
            ],
        )


def _sum_buckets(*parts: Mapping[str, int]) -> dict[str, int]:
    out = dict.fromkeys(SERVER_BUCKETS, 0)
    for part in parts:
        for bucket, ns in part.items():
            out[bucket] += ns
    return out


def _trtllm_disagg_figures(ctx: TrtllmContextLeg, gen: TrtllmGenerationLeg) -> dict[str, int]:
    return {
        "ctx.time_in_queue": ctx.queue,
        "ctx.time_to_first_token": ctx.first_token_ns(),
        "gen.time_in_queue": gen.scheduled,
        "gen.time_to_first_token": gen.scheduled + gen.first,
        "gen.e2e": gen.scheduled + gen.decode,
        "gen.kv_cache_transfer_time": gen.kv,
    }


@dataclass(frozen=True)
class TrtllmDisaggServer(EnginePlan):
    """``trtllm-serve disaggregated``: the proxy's own ``llm_request`` SERVER span (the
    ``trace_span`` decorator: no latency attributes, events ``ctx_server.selected`` and
    ``gen_server.selected`` with the chosen server's URL) over a context server's and then a
    generation server's ``llm_request`` (the proxy forwards the trace context): ``route`` until
    the context request, ``hop`` between the two, ``proxy_tail`` after."""

    engine = "trtllm-disagg"
    model: str = "llama-3.1-70b"
    route: int = 1 * MS
    ctx: TrtllmContextLeg = field(default_factory=TrtllmContextLeg)
    hop: int = 2 * MS
    gen: TrtllmGenerationLeg = field(default_factory=TrtllmGenerationLeg)
    proxy_tail: int = 1 * MS
    ctx_url: str = "http://ctx-0:8001"
    gen_url: str = "http://gen-0:8002"

    def _gen_start(self) -> int:
        return self.route + self.ctx.duration() + self.hop

    def duration(self) -> int:
        return self._gen_start() + self.gen.duration() + self.proxy_tail

    def first_token_ns(self) -> int:
        return self.route + self.ctx.first_token_ns()

    def tokens(self) -> tuple[int | None, int | None]:
        return self.ctx.prompt_tokens, self.gen.completion_tokens

    def buckets(self) -> dict[str, int]:
        gaps = {"other": self.route + self.hop + self.proxy_tail}
        return _sum_buckets(self.ctx.buckets(), self.gen.buckets(), gaps)

    def kv_transfer_ns(self) -> int | None:
        return self.gen.kv

    def figures(self) -> dict[str, int]:
        return _trtllm_disagg_figures(self.ctx, self.gen)

    def emit(self, tb: TraceBuilder, host: Host, parent: bytes | None, start: int) -> bytes:
        g0 = start + self._gen_start()
        proxy = tb.add(
            host,
            SCOPE_TRTLLM,
            "llm_request",
            SERVER,
            start,
            start + self.duration(),
            parent=parent,
            events=[
                ("ctx_server.selected", start + self.route // 2, {"server": self.ctx_url}),
                ("gen_server.selected", g0 - self.hop // 2, {"server": self.gen_url}),
            ],
        )
        self.ctx.emit(tb, _peer(host, "trt-ctx-server"), proxy, start + self.route)
        self.gen.emit(tb, _peer(host, "trt-gen-server"), proxy, g0)
        return proxy


# -- Triton Inference Server ----------------------------------------------------------------------


@dataclass
class _Spec:
    """One span of a layout, times from the request's server span start; ``parent`` is another
    spec's key (None: the request's parent), ``host`` a key of the plan's hosts."""

    key: str
    name: str
    parent: str | None
    start: int
    end: int
    attributes: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)
    kind: int = SERVER
    host: str = "server"


@dataclass
class _Layout:
    """A plan's spans relative to its start, the intervals its phases are by the rules, its first
    token and its end."""

    specs: list[_Spec]
    intervals: list[tuple[str, int, int]]
    first_token: int
    end: int


def _emit_layout(
    tb: TraceBuilder,
    layout: _Layout,
    hosts: Mapping[str, Host],
    scope: tuple[str, str],
    parent: bytes | None,
    start: int,
) -> dict[str, bytes]:
    ids: dict[str, bytes] = {}
    for spec in layout.specs:
        ids[spec.key] = tb.add(
            hosts[spec.host],
            scope,
            spec.name,
            spec.kind,
            start + spec.start,
            start + spec.end,
            parent=ids[spec.parent] if spec.parent is not None else parent,
            attributes=spec.attributes,
            events=[(n, start + t, a) for n, t, a in spec.events],
        )
    return ids


TRITON_BACKENDS: Final = ("tensorrtllm", "ensemble", "bls", "vllm")
#: The model names of the TensorRT-LLM backend's model repository and of the vLLM backend's
#: sample repository (all_models/inflight_batcher_llm/, samples/model_repository/).
TRITON_MODEL_NAMES: Final = {
    "tensorrtllm": "tensorrt_llm",
    "ensemble": "ensemble",
    "bls": "tensorrt_llm_bls",
    "vllm": "vllm_model",
}


@dataclass(frozen=True)
class TritonServer(EnginePlan):
    """Triton with ``--trace-config mode=opentelemetry`` (src/tracer.cc): every span is SERVER,
    scope ``triton-server``. ``InferRequest`` (child of the request's ``traceparent``) from the
    trace's start to its release, events ``HTTP_RECV_START`` / ``HTTP_RECV_END`` (taken before the
    trace starts, so before the span), one ``INFER_RESPONSE_COMPLETE`` per response (a streamed
    token each) and ``HTTP_SEND_START`` / ``HTTP_SEND_END``, which a chunked response stamps with
    zero (so at the steady clock's origin, ``uptime`` before the request). Under it a span named
    after each model (``triton.model_name``, ``triton.model_version`` int, ``triton.trace_id``,
    ``triton.trace_parent_id``, ``triton.request_id`` when the client sent one), events
    ``REQUEST_START``, ``QUEUE_START``, ``REQUEST_END``; under a model run by a backend a
    ``compute`` span with ``COMPUTE_START``, ``COMPUTE_INPUT_END``, ``COMPUTE_OUTPUT_START``,
    ``COMPUTE_END``, reported together when the backend reports the request's statistics.

    ``backend``: ``tensorrtllm`` (the C++ backend alone, decoupled: its compute runs from
    ``execute`` until after the final response), ``ensemble`` (preprocessing -> tensorrt_llm ->
    one postprocessing request per streamed response, composing models under the ensemble's span,
    the ensemble without a compute span), ``bls`` (tensorrt_llm_bls: one Python model whose
    ``execute`` streams every response itself; its child requests are not traced) or ``vllm``
    (the vLLM backend: a decoupled Python model whose ``execute`` returns once the request is
    handed to the engine). ``engine_trace`` (vllm only): the engine's own ``llm_request`` too,
    which the backend does not connect (it passes no trace headers), so a trace of its own.
    Times (ns): ``queue`` the LLM model's queue, ``input`` compute start -> input end,
    ``prefill`` input end -> first token, ``gaps`` between tokens, ``output`` output start ->
    compute end; ``hop`` a response's way to the front end (and between composing models)."""

    engine = "triton"
    backend: str = "tensorrtllm"
    model: str = ""
    version: int = 1
    recv: int = 200 * US
    lead: int = 100 * US
    enqueue: int = 20 * US
    queue: int = 5 * MS
    side_queue: int = 150 * US
    input: int = 400 * US
    prefill: int = 90 * MS
    gaps: tuple[int, ...] = (25 * MS,) * 6
    output: int = 300 * US
    pre: int = 3 * MS
    post: int = 400 * US
    release: int = 50 * US
    hop: int = 150 * US
    send: int = 300 * US
    uptime: int = 3 * 24 * 3600 * SECOND
    request_id: str = "req-0"
    trace_id: int = 1
    engine_trace: bool = False
    #: The engine's own traces written by ``emit`` (vllm with ``engine_trace``), with their truth.
    sink: list[EngineTruth] = field(default_factory=list, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.backend not in TRITON_BACKENDS:
            raise ValueError(f"backend {self.backend!r} is not one of {TRITON_BACKENDS}")
        if not self.model:
            object.__setattr__(self, "model", TRITON_MODEL_NAMES[self.backend])

    def _model(
        self,
        specs: list[_Spec],
        key: str,
        name: str,
        parent: str,
        t: int,
        trace_id: int,
        parent_trace: int,
    ) -> _Spec:
        attrs: dict[str, Any] = {
            "triton.model_name": name,
            "triton.model_version": self.version,
            "triton.trace_id": trace_id,
            "triton.trace_parent_id": parent_trace,
        }
        if self.request_id:
            attrs["triton.request_id"] = self.request_id
        spec = _Spec(
            key,
            name,
            parent,
            t,
            t,
            attrs,
            [("REQUEST_START", t, {}), ("QUEUE_START", t + self.enqueue, {})],
        )
        specs.append(spec)
        return spec

    @staticmethod
    def _close(spec: _Spec, end: int) -> None:
        spec.end = end
        spec.events.append(("REQUEST_END", end, {}))

    @staticmethod
    def _compute(specs: list[_Spec], parent: _Spec, c: Sequence[int]) -> None:
        names = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")
        specs.append(
            _Spec(
                parent.key + ".compute",
                "compute",
                parent.key,
                c[0],
                c[3],
                events=[(n, t, {}) for n, t in zip(names, c, strict=True)],
            )
        )

    def _tokens(self, first: int) -> list[int]:
        return list(itertools.accumulate(self.gaps, initial=first))

    def _llm_model(
        self,
        specs: list[_Spec],
        intervals: list[tuple[str, int, int]],
        parent: str,
        t: int,
        trace_id: int,
        parent_trace: int,
        name: str,
    ) -> tuple[_Spec, list[int], tuple[int, int]]:
        """The LLM model (tensorrt_llm or tensorrt_llm_bls) from its REQUEST_START at ``t``: its
        token times, and its compute's input end and output start."""
        m = self._model(specs, "llm", name, parent, t, trace_id, parent_trace)
        qs = t + self.enqueue
        c0 = qs + self.queue
        c1 = c0 + self.input
        tokens = self._tokens(c1 + self.prefill)
        # The C++ backend stamps compute end as the final response comes back; the BLS model
        # returns from execute after sending it.
        c2 = tokens[-1] + (self.hop if self.backend == "bls" else 0)
        c3 = c2 + self.output
        self._compute(specs, m, (c0, c1, c2, c3))
        self._close(m, c3 + self.release)
        intervals += [("queue", qs, c0), ("preprocess", c0, c1), ("postprocess", c2, c3)]
        return m, tokens, (c1, c2)

    def _layout(self) -> _Layout:
        specs: list[_Spec] = []
        intervals: list[tuple[str, int, int]] = []
        root = _Spec(
            "root",
            "InferRequest",
            None,
            0,
            0,
            events=[("HTTP_RECV_START", -self.recv, {}), ("HTTP_RECV_END", -self.recv // 4, {})],
        )
        specs.append(root)
        t = self.lead
        if self.backend in ("tensorrtllm", "bls"):
            m, tokens, (c1, c2) = self._llm_model(
                specs, intervals, "root", t, self.trace_id, 0, self.model
            )
            responses = [tk + self.hop for tk in tokens]
            intervals += [("prefill", c1, responses[0]), ("decode", responses[0], c2)]
            last = m.end
        elif self.backend == "vllm":
            m = self._model(specs, "llm", self.model, "root", t, self.trace_id, 0)
            qs = t + self.enqueue
            c0 = qs + self.queue
            c = (c0, c0 + self.input, c0 + self.input + self.hop, c0 + self.input + 2 * self.hop)
            self._compute(specs, m, c)
            tokens = self._tokens(c[3] + self.prefill)
            responses = [tk + self.hop for tk in tokens]
            self._close(m, responses[-1] + self.release)
            intervals += [
                ("queue", qs, c0),
                ("preprocess", c0, c[3]),
                ("prefill", c[3], responses[0]),
                ("decode", responses[0], responses[-1]),
            ]
            last = m.end
        else:
            e = self._model(specs, "ensemble", self.model, "root", t, self.trace_id, 0)
            ids = itertools.count(self.trace_id + 1)
            p0 = t + self.enqueue + self.hop
            pre = self._model(
                specs, "pre", "preprocessing", "ensemble", p0, next(ids), self.trace_id
            )
            pc0 = p0 + self.enqueue + self.side_queue
            pc = (pc0, pc0 + self.pre // 10, pc0 + self.pre * 9 // 10, pc0 + self.pre)
            self._compute(specs, pre, pc)
            self._close(pre, pc[3] + self.release)
            intervals += [("queue", p0 + self.enqueue, pc0), ("preprocess", pc[0], pc[3])]
            _, tokens, (c1, c2) = self._llm_model(
                specs,
                intervals,
                "ensemble",
                pre.end + self.hop,
                next(ids),
                self.trace_id,
                "tensorrt_llm",
            )
            responses = []
            for k, tk in enumerate(tokens):
                r0 = tk + self.hop
                post = self._model(
                    specs, f"post{k}", "postprocessing", "ensemble", r0, next(ids), self.trace_id
                )
                rc0 = r0 + self.enqueue + self.side_queue
                rc = (rc0, rc0 + self.post // 10, rc0 + self.post * 9 // 10, rc0 + self.post)
                self._compute(specs, post, rc)
                self._close(post, rc[3] + self.release)
                intervals += [("queue", r0 + self.enqueue, rc0), ("postprocess", rc[0], rc[3])]
                responses.append(post.end + self.hop)
            intervals += [("prefill", c1, responses[0]), ("decode", responses[0], c2)]
            self._close(e, max(s.end for s in specs) + self.release)
            last = e.end
        end = max(last, responses[-1]) + self.send
        root.end = end
        root.events += [("INFER_RESPONSE_COMPLETE", r, {}) for r in responses]
        root.events += [("HTTP_SEND_START", -self.uptime, {}), ("HTTP_SEND_END", -self.uptime, {})]
        specs.sort(key=lambda s: (s.start, s.key != "root"))
        return _Layout(specs, intervals, responses[0], end)

    def duration(self) -> int:
        return self._layout().end

    def first_token_ns(self) -> int:
        return self._layout().first_token

    def buckets(self) -> dict[str, int]:
        layout = self._layout()
        return paint((0, layout.end), layout.intervals)

    def figures(self) -> dict[str, int]:
        """Per model span: queue (COMPUTE_START - QUEUE_START) and compute (COMPUTE_END -
        COMPUTE_START), keyed ``<model>.queue`` / ``<model>.compute`` (first of each name)."""
        layout = self._layout()
        out: dict[str, int] = {}
        for spec in layout.specs:
            if spec.name == "compute":
                model = next(s for s in layout.specs if s.key == spec.parent)
                queue = dict((n, t) for n, t, _ in model.events)["QUEUE_START"]
                out.setdefault(f"{model.name}.queue", spec.start - queue)
                out.setdefault(f"{model.name}.compute", spec.end - spec.start)
        return out

    def emit(self, tb: TraceBuilder, host: Host, parent: bytes | None, start: int) -> bytes:
        layout = self._layout()
        ids = _emit_layout(tb, layout, {"server": host}, SCOPE_TRITON, parent, start)
        if self.engine_trace and self.backend == "vllm":
            self._engine_trace(tb, host, start, layout)
        return ids["root"]

    def _engine_trace(self, tb: TraceBuilder, host: Host, start: int, layout: _Layout) -> None:
        """vLLM's own ``llm_request`` in a trace of its own: the engine's arrival once the
        backend's ``execute`` has handed the request over, its last token just before the last
        response reaches the front end."""
        compute = next(s for s in layout.specs if s.name == "compute")
        arrival = compute.end + self.hop
        tokens = self._tokens(compute.end + self.prefill)
        queue = (tokens[0] - arrival) // 4
        engine = VllmV1Server(
            model=self.model,
            lead=0,
            queue=queue,
            prefill=tokens[0] - arrival - queue,
            decode=tokens[-1] - tokens[0],
            tail=self.hop // 2,
            completion_tokens=len(tokens),
            request_id=self.request_id,
        )
        own = TraceBuilder(tb.rng)
        sid = engine.emit(own, _peer(host, "vllm-engine"), None, start + arrival)
        tb.side_traces.append(own)
        self.sink.append(
            EngineTruth(
                f"{own.trace_hex}-{sid.hex()}",
                own.trace_hex,
                engine.duration(),
                {"network": None, **{b: engine.buckets().get(b, 0) for b in SERVER_BUCKETS}},
                "none/VllmV1Server(triton)",
                server_ttft_ns=engine.server_ttft_ns(),
                input_tokens=engine.prompt_tokens,
                output_tokens=engine.completion_tokens,
                model=None,
                service="vllm-engine",
                engine="vllm",
            )
        )


# -- Hugging Face TGI -----------------------------------------------------------------------------

#: ``parameters = ?req.parameters``: the request's GenerateParameters as Rust's ``{:?}`` writes it.
TGI_PARAMETERS: Final = (
    "GenerateParameters { adapter_id: None, best_of: None, temperature: Some(0.7), "
    "repetition_penalty: None, frequency_penalty: None, top_k: None, top_p: Some(0.95), "
    "typical_p: None, do_sample: true, max_new_tokens: Some(256), return_full_text: None, "
    "stop: [], truncate: None, watermark: false, details: false, decoder_input_details: false, "
    "seed: None, top_n_tokens: None, grammar: None }"
)


@dataclass(frozen=True)
class TgiServer(EnginePlan):
    """TGI's router (router/src/server.rs, backends/v3/src/{backend,queue}.rs) with
    ``--otlp-endpoint``: ``tracing`` spans exported by tracing-opentelemetry, all INTERNAL.

    The route handler's span (``generate_stream``, or ``generate`` when ``stream`` is off) is set
    as a child of the request's ``traceparent``; at the end it records ``total_time``,
    ``validation_time``, ``queue_time``, ``inference_time`` and ``time_per_token`` as Rust
    ``Duration`` debug strings (``"12.3456ms"``), ``seed`` (``"Some(n)"``) and ``parameters``.
    Under it (``async_stream`` when streaming) ``Infer``'s own span, ``validate`` /
    ``validate_input``, and ``schedule``, which lives until the request leaves the batch and
    holds ``queued`` (queued until batched), then one ``infer`` span per batch step the request
    is in (its prefill, then one per decode step), each with a ``send_generation`` as it sends
    that step's token. ``validation_time`` runs from the handler's start (``lead`` after the span
    opens) to the queue; ``inference_time`` from batching to the handler seeing the end
    (``hop`` after the request leaves the batch); ``time_per_token`` is ``inference_time`` over
    the generated tokens (truncated to ns). ``tail``: then until the span closes. The truth takes
    decode from the router's ``infer`` spans (the hop is the router handing the stream's end to
    the handler, not a batch step: other)."""

    engine = "tgi"
    model: str = "mistral-7b"
    stream: bool = True
    lead: int = 60 * US
    validation: int = 3 * MS
    queue: int = 40 * MS
    prefill: int = 110 * MS
    steps: tuple[int, ...] = (22 * MS,) * 7
    hop: int = 200 * US
    tail: int = 400 * US
    seed: int = 1234

    def _marks(self) -> dict[str, int]:
        m = {"start": self.lead}
        m["queued"] = m["start"] + self.validation
        m["batched"] = m["queued"] + self.queue
        m["first"] = m["batched"] + self.prefill
        m["left"] = m["first"] + sum(self.steps)
        m["end_seen"] = m["left"] + self.hop
        m["end"] = m["end_seen"] + self.tail
        return m

    def generated(self) -> int:
        return len(self.steps) + 1

    def duration(self) -> int:
        return self._marks()["end"]

    def first_token_ns(self) -> int:
        return self._marks()["first"]

    def buckets(self) -> dict[str, int]:
        m = self._marks()
        return {
            "preprocess": self.validation,
            "queue": self.queue,
            "prefill": self.prefill,
            "decode": m["left"] - m["first"],
            "other": self.lead + self.hop + self.tail,
        }

    def figures(self) -> dict[str, int]:
        m = self._marks()
        inference = m["end_seen"] - m["batched"]
        return {
            "validation_time": self.validation,
            "queue_time": self.queue,
            "inference_time": inference,
            "total_time": m["end_seen"] - m["start"],
            "time_per_token": inference // self.generated(),
        }

    def emit(self, tb: TraceBuilder, host: Host, parent: bytes | None, start: int) -> bytes:
        m = {k: start + v for k, v in self._marks().items()}
        f = self.figures()
        code = {
            "code.namespace": "text_generation_router::server",
            "code.filepath": "router/src/server.rs",
        }
        route = "generate_stream" if self.stream else "generate"
        handler = tb.add(
            host,
            SCOPE_TGI,
            route,
            INTERNAL,
            start,
            m["end"],
            parent=parent,
            attributes={
                **code,
                "code.lineno": 476 if self.stream else 273,
                "parameters": TGI_PARAMETERS,
                "total_time": rust_duration(f["total_time"]),
                "validation_time": rust_duration(f["validation_time"]),
                "queue_time": rust_duration(f["queue_time"]),
                "inference_time": rust_duration(f["inference_time"]),
                "time_per_token": rust_duration(f["time_per_token"]),
                "seed": f"Some({self.seed})",
                "busy_ns": (m["queued"] - m["start"]) + self.tail,
                "idle_ns": m["end_seen"] - m["queued"],
            },
        )
        infer_end = m["left"]
        outer = handler
        if self.stream:
            outer = tb.add(
                host, SCOPE_TGI, "async_stream", INTERNAL, m["start"], infer_end, parent=handler
            )
        else:
            outer = tb.add(
                host, SCOPE_TGI, "generate", INTERNAL, m["start"], m["end_seen"], parent=handler
            )
        infer = tb.add(
            host, SCOPE_TGI, "generate_stream", INTERNAL, m["start"], infer_end, parent=outer
        )
        validate = tb.add(
            host, SCOPE_TGI, "validate", INTERNAL, m["start"], m["queued"], parent=infer
        )
        tb.add(
            host,
            SCOPE_TGI,
            "validate_input",
            INTERNAL,
            m["start"] + 10 * US,
            m["queued"] - 10 * US,
            parent=validate,
            attributes={
                "add_special_tokens": True,
                "truncate": "None",
                "max_new_tokens": "Some(256)",
            },
        )
        schedule = tb.add(
            host, SCOPE_TGI, "schedule", INTERNAL, m["queued"], infer_end, parent=infer
        )
        tb.add(host, SCOPE_TGI, "queued", INTERNAL, m["queued"], m["batched"], parent=schedule)
        bounds = list(itertools.accumulate(self.steps, initial=m["first"]))
        for lo, hi in itertools.pairwise([m["batched"], *bounds]):
            step = tb.add(host, SCOPE_TGI, "infer", INTERNAL, lo, hi, parent=schedule)
            tb.add(
                host,
                SCOPE_TGI,
                "send_generation",
                INTERNAL,
                hi - 20 * US,
                hi,
                parent=step,
                attributes={"generation": "Generation { request_id: 0, ... }"},
            )
        return handler


# -- vLLM beyond llm_request ----------------------------------------------------------------------


@dataclass(frozen=True)
class VllmDetailedServer(VllmV0Server, EnginePlan):
    """vLLM's older engine with ``--collect-detailed-traces`` (vllm/engine/llm_engine.py
    ``create_trace_span``): the ``llm_request`` of ``VllmV0Server`` (queue, TTFT and e2e in float
    seconds, ``gen_ai.response.model``, no prefill/decode split) with, per ``modules``, sums over
    the request's steps: ``time_in_scheduler`` (seconds the scheduler spent on the steps it was
    in), ``time_in_model_forward`` (``model``/``all``: the GPU forward time, measured in ms with
    CUDA events and written divided by 1000, so seconds) and ``time_in_model_execute``
    (``worker``/``all``: the worker's execute_model wall time, seconds). Sums over steps, not
    intervals: they fit inside prefill + decode and place nothing on the timeline. vLLM v1
    accepts the flag and writes none of them."""

    engine = "vllm-detailed"
    scheduler: int = 4 * MS
    forward: int = 560 * MS
    execute: int = 610 * MS
    modules: tuple[str, ...] = ("all",)

    def __post_init__(self) -> None:
        if not self.forward <= self.execute <= self.prefill + self.decode:
            raise ValueError("forward <= execute <= prefill + decode")

    def _forward_on(self) -> bool:
        return bool({"model", "all"} & set(self.modules))

    def _execute_on(self) -> bool:
        return bool({"worker", "all"} & set(self.modules))

    def figures(self) -> dict[str, int]:
        out = {"time_in_scheduler": self.scheduler}
        if self._forward_on():
            out["time_in_model_forward"] = self.forward
        if self._execute_on():
            out["time_in_model_execute"] = self.execute
        return out

    def attributes(self) -> dict[str, Any]:
        detailed = ("scheduler", "model_forward", "model_execute")
        attrs = {
            k: v
            for k, v in super().attributes().items()
            if k.removeprefix("gen_ai.latency.time_in_") not in detailed
        }
        attrs["gen_ai.latency.time_in_scheduler"] = seconds(self.scheduler)
        if self._forward_on():
            attrs["gen_ai.latency.time_in_model_forward"] = (self.forward / MS) / 1000.0
        if self._execute_on():
            attrs["gen_ai.latency.time_in_model_execute"] = seconds(self.execute)
        return attrs


#: Child span names of ``llm_request`` per style: the upstream proposal (vllm-project/vllm PR
#: 44402) and vendors' builds (RBLN-SW/vllm-rbln PR 886; ``wait`` as rtp-llm names the queue).
VLLM_STAGE_NAMES: Final = {
    "upstream": ("vllm_queue", "vllm_prefill", "vllm_decode"),
    "vendor": ("queue", "prefill", "decode"),
    "vendor-wait": ("wait", "prefill", "decode"),
}


@dataclass(frozen=True)
class VllmStageServer(VllmV1Server, EnginePlan):
    """vLLM v1's ``llm_request`` (``VllmV1Server``) with the request's lifecycle as child spans
    (INTERNAL): queue [queued, scheduled], prefill [scheduled, first token], decode [first token,
    last token], named per ``style`` (``VLLM_STAGE_NAMES``). ``kv`` (upstream style only): a
    decode instance of a prefill/decode pair waiting for the remote KV cache,
    ``vllm_async_kv_transfer`` between scheduling and its prefill; the span's own
    ``time_in_model_prefill`` (first token - scheduled) includes that wait, the child spans tell
    it apart. ``lead``: arrival -> queued, ``tail``: last token -> span end."""

    engine = "vllm-stages"
    style: str = "upstream"
    kv: int = 0

    def __post_init__(self) -> None:
        if self.style not in VLLM_STAGE_NAMES:
            raise ValueError(f"style {self.style!r} is not one of {tuple(VLLM_STAGE_NAMES)}")
        if self.kv and self.style != "upstream":
            raise ValueError("only the upstream style names the KV transfer")

    def duration(self) -> int:
        return super().duration() + self.kv

    def first_token_ns(self) -> int:
        return super().first_token_ns() + self.kv

    def buckets(self) -> dict[str, int]:
        return {**super().buckets(), "other": self.lead + self.kv + self.tail}

    def kv_transfer_ns(self) -> int | None:
        return self.kv or None

    def figures(self) -> dict[str, int]:
        return {"time_in_queue": self.queue, "time_in_model_prefill": self.kv + self.prefill}

    def attributes(self) -> dict[str, Any]:
        # vLLM's own figures count the KV wait as prefill: first token - scheduled.
        return {
            **super().attributes(),
            "gen_ai.latency.time_in_model_prefill": seconds(self.kv + self.prefill),
            "gen_ai.latency.time_in_model_inference": seconds(self.kv + self.prefill + self.decode),
        }

    def emit(self, tb: TraceBuilder, host: Host, parent: bytes | None, start: int) -> bytes:
        sid = super().emit(tb, host, parent, start)
        queue, prefill, decode = VLLM_STAGE_NAMES[self.style]
        t = start + self.lead
        stages = [(queue, self.queue)]
        if self.kv:
            stages.append(("vllm_async_kv_transfer", self.kv))
        stages += [(prefill, self.prefill), (decode, self.decode)]
        for name, dur in stages:
            tb.add(host, SCOPE_VLLM, name, INTERNAL, t, t + dur, parent=sid)
            t += dur
        return sid


#: vLLM's startup spans (vllm-project/vllm PR 31162, the ``instrument`` decorator): span name ->
#: the process it runs in. Each carries code.function / code.namespace / code.filepath and
#: code.lineno (a string); each process's resource carries vllm.instrumenting_module_name,
#: vllm.process_id and, in engine and worker processes, vllm.process_kind / vllm.process_name.
VLLM_STARTUP_SPANS: Final = {
    "Overall Loading": "api",
    "Executor init": "engine",
    "Worker init": "worker",
    "Init device": "worker",
    "Load model": "worker",
    "Prepare model": "engine",
}


@dataclass(frozen=True)
class StartupTruth:
    """A replica's loading as its startup trace tells it (ns): the whole (``Overall Loading``),
    the weights (``Load model``), KV cache and warm-up (``Prepare model``), when it was ready
    (absolute, the replica's clock), and the replica (its ``k8s.pod.name``)."""

    trace_id: str
    replica: str
    loading_ns: int
    load_model_ns: int
    prepare_ns: int
    ready_ns: int


@dataclass
class StartupBuilt:
    """A startup trace and the replica's first requests after it."""

    built: Built
    startup: StartupTruth


# -- NVIDIA Dynamo --------------------------------------------------------------------------------

DYNAMO_ENGINES: Final = ("vllm", "sglang", "trtllm")


def _rust_span_attributes(busy: int, idle: int) -> dict[str, Any]:
    """What tracing-opentelemetry adds to every span of a Rust component."""
    return {"busy_ns": busy, "idle_ns": idle, "thread.name": "tokio-runtime-worker"}


@dataclass(frozen=True)
class DynamoServer(EnginePlan):
    """NVIDIA Dynamo with ``OTEL_EXPORT_ENABLED`` (lib/runtime/src/logging.rs): the frontend's
    ``http-request`` span (``method``, ``uri``, ``version``, ``x_request_id``, ``trace_id``,
    ``parent_id``; INTERNAL, a child of the request's ``traceparent``) and, on each worker, a
    ``handle_payload`` span (``component``, ``endpoint``, ``namespace``, ``instance_id``) whose
    parent comes over the request plane in the message's ``traceparent`` header. The worker
    hands its own context (``build_trace_headers``) to the engine, so the engine's request span
    (vLLM's ``llm_request``, SGLang's request root, TensorRT-LLM's ``llm_request``) is a child
    of ``handle_payload``.

    ``disagg``: a prefill worker (``component`` ``prefill``) and then a decode worker
    (``backend``), each a ``handle_payload`` child of ``http-request`` (vLLM: the prefill worker
    runs the request with one output token, the decode worker's prefill is the remote KV load
    and the last prompt token; TensorRT-LLM: a context-only and a generation request, the KV
    transfer named on the latter). ``route``: the frontend's ``router.route_request`` (CLIENT,
    ``request.attempt``, ``migration.is_retry``, ``request.outcome``) between ``http-request`` and
    a SERVER ``handle_payload``, as later versions write it (aggregated only). Times: ``pre``
    the frontend before the first worker call (template, tokenizing, routing), ``hop`` one way
    to a worker, ``wlead`` / ``wtail`` a worker's own time around its engine span, ``post`` the
    frontend after the last worker's stream."""

    engine = "dynamo"
    backend: str = "vllm"
    disagg: bool = False
    route: bool = False
    model: str = "Qwen/Qwen3-0.6B"
    pre: int = 2 * MS
    hop: int = 300 * US
    wlead: int = 200 * US
    wtail: int = 300 * US
    post: int = 500 * US
    legs: tuple[Any, ...] = ()
    namespace: str = "dynamo"
    x_request_id: str = "test-trace-001"

    def __post_init__(self) -> None:
        if self.backend not in DYNAMO_ENGINES:
            raise ValueError(f"backend {self.backend!r} is not one of {DYNAMO_ENGINES}")
        if self.route and self.disagg:
            raise ValueError("the route span is modelled for aggregated serving only")
        if self.disagg and self.backend == "sglang":
            raise ValueError("disaggregated Dynamo is modelled with vLLM and TensorRT-LLM")
        if len(self.legs) != (2 if self.disagg else 1):
            raise ValueError("one engine leg, or a prefill and a decode leg when disaggregated")

    def _starts(self) -> list[int]:
        """Each worker's handle_payload start, from the frontend's start."""
        t, out = self.pre + self.hop, []
        for leg in self.legs:
            out.append(t)
            t += self.wlead + leg.duration() + self.wtail + 2 * self.hop
        return out

    def duration(self) -> int:
        last = self._starts()[-1]
        return last + self.wlead + self.legs[-1].duration() + self.wtail + self.hop + self.post

    def first_token_ns(self) -> int:
        return self._starts()[0] + self.wlead + self.legs[0].first_token_ns()

    def tokens(self) -> tuple[int | None, int | None]:
        first, last = self.legs[0], self.legs[-1]
        prompt = getattr(first, "prompt_tokens", None)
        completion = getattr(last, "completion_tokens", None)
        return prompt, completion

    def buckets(self) -> dict[str, int]:
        own = self.duration() - sum(leg.duration() for leg in self.legs)
        return _sum_buckets(*(leg.buckets() for leg in self.legs), {"other": own})

    def kv_transfer_ns(self) -> int | None:
        last = self.legs[-1]
        return last.kv if isinstance(last, TrtllmGenerationLeg) else None

    def figures(self) -> dict[str, int]:
        if self.backend == "trtllm" and self.disagg:
            return _trtllm_disagg_figures(self.legs[0], self.legs[1])
        return {}

    def emit(self, tb: TraceBuilder, host: Host, parent: bytes | None, start: int) -> bytes:
        end = start + self.duration()
        frontend = tb.add(
            host,
            SCOPE_DYNAMO,
            "http-request",
            INTERNAL,
            start,
            end,
            parent=parent,
            attributes={
                "method": "POST",
                "uri": "/v1/chat/completions",
                "version": "HTTP/1.1",
                "x_request_id": self.x_request_id,
                "trace_id": tb.trace_hex,
                **_rust_span_attributes(self.pre + self.post, end - start - self.pre - self.post),
            },
        )
        components = ("prefill", "backend") if self.disagg else ("backend",)
        services = (
            ("dynamo-worker-prefill", "dynamo-worker-decode")
            if self.disagg
            else (f"dynamo-worker-{self.backend}",)
        )
        for i, (leg, t) in enumerate(zip(self.legs, self._starts(), strict=True)):
            h0 = start + t
            h1 = h0 + self.wlead + leg.duration() + self.wtail
            above = frontend
            kind = INTERNAL
            if self.route:
                above = tb.add(
                    host,
                    SCOPE_DYNAMO,
                    "router.route_request",
                    CLIENT,
                    h0 - self.hop,
                    h1 + self.hop,
                    parent=frontend,
                    attributes={
                        "request.attempt": "0",
                        "migration.is_retry": "false",
                        "request.outcome": "success",
                    },
                )
                kind = SERVER
            worker = _peer(host, services[i])
            payload = tb.add(
                worker,
                SCOPE_DYNAMO,
                "handle_payload",
                kind,
                h0,
                h1,
                parent=above,
                attributes={
                    "component": components[i],
                    "endpoint": "generate",
                    "namespace": self.namespace,
                    "instance_id": 3866790875219207263 + i,
                    "trace_id": tb.trace_hex,
                    **_rust_span_attributes(self.wlead + self.wtail, leg.duration()),
                },
            )
            leg.emit(tb, worker, payload, h0 + self.wlead)
        return frontend


# -- random plans and the builders ----------------------------------------------------------------


def random_trtllm(rng: random.Random) -> TrtllmServer:
    return TrtllmServer(
        queue=_draw(rng, 0, 200),
        prefill=_draw(rng, 20, 300),
        decode=_draw(rng, 60, 1500),
        tail=_draw(rng, 0.1, 5),
        prompt_tokens=rng.randint(20, 4000),
        completion_tokens=rng.randint(2, 400),
        request_id=rng.randint(1, 10**6),
    )


def _ctx_leg(rng: random.Random, prompt: int, rid: int) -> TrtllmContextLeg:
    return TrtllmContextLeg(
        queue=_draw(rng, 0, 150),
        prefill=_draw(rng, 20, 400),
        tail=_draw(rng, 0.2, 5),
        prompt_tokens=prompt,
        request_id=rid,
    )


def _gen_leg(rng: random.Random, prompt: int, rid: int) -> TrtllmGenerationLeg:
    first = _draw(rng, 10, 40)
    return TrtllmGenerationLeg(
        setup=_draw(rng, 0.5, 5),
        kv=_draw(rng, 2, 80),
        wait=_draw(rng, 0, 20),
        first=first,
        decode=first + _draw(rng, 50, 1500),
        tail=_draw(rng, 0.1, 4),
        prompt_tokens=prompt,
        completion_tokens=rng.randint(2, 400),
        kv_cache_size=rng.randint(10**6, 10**9),
        request_id=rid + 1,
    )


def random_trtllm_disagg(rng: random.Random) -> TrtllmDisaggServer:
    prompt, rid = rng.randint(100, 8000), rng.randint(1, 10**6)
    return TrtllmDisaggServer(
        route=_draw(rng, 0.2, 3),
        ctx=_ctx_leg(rng, prompt, rid),
        hop=_draw(rng, 0.5, 5),
        gen=_gen_leg(rng, prompt, rid),
        proxy_tail=_draw(rng, 0.1, 3),
    )


def random_triton(rng: random.Random, backend: str, **knobs: Any) -> TritonServer:
    plan = TritonServer(
        backend=backend,
        recv=_draw(rng, 0.05, 1),
        lead=_draw(rng, 0.05, 0.5),
        enqueue=_draw(rng, 0.005, 0.05),
        queue=_draw(rng, 0.1, 50),
        side_queue=_draw(rng, 0.02, 1),
        input=_draw(rng, 0.1, 2),
        prefill=_draw(rng, 20, 300),
        gaps=_steps(rng, rng.randint(1, 10), 10, 60),
        output=_draw(rng, 0.05, 1),
        pre=_draw(rng, 1, 10),
        post=_draw(rng, 0.1, 1),
        release=_draw(rng, 0.02, 0.2),
        hop=_draw(rng, 0.05, 0.5),
        send=_draw(rng, 0.05, 1),
        request_id=f"req-{rng.getrandbits(32):08x}",
        trace_id=rng.randint(1, 10**4),
    )
    return replace(plan, **knobs) if knobs else plan


def random_tgi(rng: random.Random, *, stream: bool = True) -> TgiServer:
    return TgiServer(
        stream=stream,
        lead=_draw(rng, 0.01, 0.2),
        validation=_draw(rng, 0.5, 20),
        queue=_draw(rng, 0, 200),
        prefill=_draw(rng, 20, 300),
        steps=_steps(rng, rng.randint(1, 12), 10, 60),
        hop=_draw(rng, 0.05, 1),
        tail=_draw(rng, 0.1, 2),
        seed=rng.getrandbits(63),
    )


def random_vllm_detailed(rng: random.Random, modules: tuple[str, ...]) -> VllmDetailedServer:
    prefill, decode = _draw(rng, 20, 300), _draw(rng, 60, 1500)
    execute = rng.randint((prefill + decode) * 8 // 10, prefill + decode)
    return VllmDetailedServer(
        queue=_draw(rng, 0, 300),
        prefill=prefill,
        decode=decode,
        tail=_draw(rng, 0.05, 3),
        scheduler=_draw(rng, 1, 20),
        forward=rng.randint(execute * 7 // 10, execute),
        execute=execute,
        modules=modules,
        prompt_tokens=rng.randint(20, 2000),
        completion_tokens=rng.randint(2, 300),
        request_id=f"cmpl-{rng.getrandbits(64):016x}",
    )


def random_vllm_stages(rng: random.Random, style: str, *, kv: bool = False) -> VllmStageServer:
    return VllmStageServer(
        style=style,
        lead=_draw(rng, 0.5, 10),
        queue=_draw(rng, 0, 300),
        kv=_draw(rng, 2, 80) if kv else 0,
        # A decode instance computes only the last prompt token once the KV cache arrived.
        prefill=_draw(rng, 5, 30) if kv else _draw(rng, 20, 300),
        decode=_draw(rng, 60, 1500),
        tail=_draw(rng, 0.1, 5),
        prompt_tokens=rng.randint(20, 2000),
        completion_tokens=rng.randint(2, 300),
        request_id=f"chatcmpl-{rng.getrandbits(64):016x}",
    )


def _vllm_leg(
    rng: random.Random, *, decode: bool = True, prefill_ms: tuple[float, float] = (20, 300)
) -> VllmV1Server:
    return VllmV1Server(
        lead=_draw(rng, 0.5, 5),
        queue=_draw(rng, 0, 200),
        prefill=_draw(rng, *prefill_ms),
        decode=_draw(rng, 60, 1500) if decode else 0,
        tail=_draw(rng, 0.1, 5),
        prompt_tokens=rng.randint(20, 4000),
        completion_tokens=rng.randint(2, 300) if decode else 1,
        request_id=f"chatcmpl-{rng.getrandbits(64):016x}",
    )


def random_dynamo(
    rng: random.Random, backend: str, *, disagg: bool = False, route: bool = False
) -> DynamoServer:
    legs: tuple[Any, ...]
    if backend == "vllm":
        legs = (
            (_vllm_leg(rng, decode=False), _vllm_leg(rng, prefill_ms=(5, 60)))
            if disagg
            else (_vllm_leg(rng),)
        )
    elif backend == "trtllm":
        prompt, rid = rng.randint(100, 8000), rng.randint(1, 10**6)
        legs = (
            (_ctx_leg(rng, prompt, rid), _gen_leg(rng, prompt, rid))
            if disagg
            else (random_trtllm(rng),)
        )
    else:
        legs = (random_server(rng, "sglang", tokenize=_draw(rng, 0.05, 1)),)
    return DynamoServer(
        backend=backend,
        disagg=disagg,
        route=route,
        pre=_draw(rng, 0.5, 10),
        hop=_draw(rng, 0.05, 2),
        wlead=_draw(rng, 0.05, 1),
        wtail=_draw(rng, 0.05, 1),
        post=_draw(rng, 0.1, 3),
        legs=legs,
        x_request_id=f"req-{rng.getrandbits(32):08x}",
    )


def _engine_truth(truth: Truth, plan: EnginePlan) -> EngineTruth:
    base = {f.name: getattr(truth, f.name) for f in fields(Truth)}
    return EngineTruth(
        **base, engine=plan.engine, kv_transfer_ns=plan.kv_transfer_ns(), figures=plan.figures()
    )


def engine_call(
    rng: random.Random,
    plan: Any,
    *,
    client: str | None = "sdk",
    skew_ns: int = 0,
    start_ns: int = T0,
    client_knobs: Mapping[str, Any] | None = None,
) -> Built:
    """One call of ``client`` kind (None: the serving system's spans alone) over ``plan``, the
    server's clock ``skew_ns`` ahead of the client's; the engine's own traces too (Triton's vLLM
    engine), each with its truth."""
    call = LlmCall(random_client(rng, client, **dict(client_knobs or {})), plan)
    tb = TraceBuilder(rng)
    made = call.emit(
        tb, Host("chat-frontend"), Host(f"{plan.engine}-server", skew_ns), None, start_ns
    )
    truths: list[Truth] = [_engine_truth(made.truth, plan), *getattr(plan, "sink", ())]
    return finish(tb, truths)


def trtllm_request(seed: int, *, client: str | None = "sdk", **kw: Any) -> Built:
    """TensorRT-LLM's OpenAI server, one ``llm_request``."""
    rng = random.Random(seed)
    return engine_call(rng, random_trtllm(rng), client=client, **kw)


def trtllm_disagg_request(seed: int, *, client: str | None = "sdk", **kw: Any) -> Built:
    """TensorRT-LLM disaggregated: proxy over a context and a generation server."""
    rng = random.Random(seed)
    return engine_call(rng, random_trtllm_disagg(rng), client=client, **kw)


def triton_request(
    seed: int, *, backend: str = "tensorrtllm", client: str | None = "sdk", **kw: Any
) -> Built:
    """Triton in OpenTelemetry mode over ``backend`` (``TRITON_BACKENDS``);
    ``engine_trace=True`` (vllm) adds vLLM's own trace."""
    rng = random.Random(seed)
    knobs = {k: kw.pop(k) for k in ("engine_trace",) if k in kw}
    return engine_call(rng, random_triton(rng, backend, **knobs), client=client, **kw)


def tgi_request(seed: int, *, stream: bool = True, client: str | None = "sdk", **kw: Any) -> Built:
    """TGI's ``generate_stream`` (or ``generate``) handler over the router's spans."""
    rng = random.Random(seed)
    return engine_call(rng, random_tgi(rng, stream=stream), client=client, **kw)


def vllm_detailed_request(
    seed: int, *, modules: tuple[str, ...] = ("all",), client: str | None = "sdk", **kw: Any
) -> Built:
    """vLLM's older engine with ``--collect-detailed-traces`` ``modules``."""
    rng = random.Random(seed)
    return engine_call(rng, random_vllm_detailed(rng, modules), client=client, **kw)


def vllm_stages_request(
    seed: int,
    *,
    style: str = "upstream",
    kv: bool = False,
    client: str | None = "sdk",
    **kw: Any,
) -> Built:
    """vLLM's ``llm_request`` with stage child spans of ``style`` (``VLLM_STAGE_NAMES``)."""
    rng = random.Random(seed)
    return engine_call(rng, random_vllm_stages(rng, style, kv=kv), client=client, **kw)


def dynamo_request(
    seed: int,
    *,
    backend: str = "vllm",
    disagg: bool = False,
    route: bool = False,
    client: str | None = "sdk",
    **kw: Any,
) -> Built:
    """Dynamo's frontend and worker(s) over an engine of ``backend`` (``DYNAMO_ENGINES``)."""
    rng = random.Random(seed)
    plan = random_dynamo(rng, backend, disagg=disagg, route=route)
    return engine_call(rng, plan, client=client, **kw)


#: Where each startup span's function lives (its code.* attributes and tracer name).
_STARTUP_CODE: Final = {
    "Overall Loading": ("EngineCoreClient.make_async_mp_client", "vllm.v1.engine.core_client"),
    "Executor init": ("Executor.__init__", "vllm.v1.executor.abstract"),
    "Worker init": ("WorkerWrapperBase.init_worker", "vllm.v1.worker.worker_base"),
    "Init device": ("Worker.init_device", "vllm.v1.worker.gpu_worker"),
    "Load model": ("BaseModelLoader.load_model", "vllm.model_executor.model_loader.base_loader"),
    "Prepare model": ("EngineCore._initialize_kv_caches", "vllm.v1.engine.core"),
}


def vllm_startup(seed: int, *, requests: int = 3, client: str | None = "sdk") -> StartupBuilt:
    """A vLLM replica's startup trace, then its first ``requests`` calls, each a trace of its own.

    The API server's ``Overall Loading`` (building the engine client, which starts the engine
    core) is the root; the engine core and its worker take their parent from the ``traceparent``
    the spawning process put in their environment: ``Executor init`` under it, and the worker's
    ``Worker init``, ``Init device``, ``Load model`` under ``Executor init`` (the executor waits
    for its workers), then the engine core's ``Prepare model`` (KV cache, profiling, CUDA
    graphs). The replica is its pod (``k8s.pod.name`` from ``OTEL_RESOURCE_ATTRIBUTES``); its
    first request after loading has a slower prefill (first-use costs)."""
    rng = random.Random(seed)
    pod = f"vllm-{rng.getrandbits(24):06x}"
    base = {"k8s.pod.name": pod, "vllm.instrumenting_module_name": "vllm.entrypoints"}
    hosts = {
        "api": Host("vllm", 0, {**base, "vllm.process_id": str(rng.randint(100, 999))}),
        "engine": Host(
            "vllm",
            0,
            {
                **base,
                "vllm.process_id": str(rng.randint(1000, 1999)),
                "vllm.process_kind": "EngineCore",
                "vllm.process_name": "EngineCore_DP0",
            },
        ),
        "worker": Host(
            "vllm",
            0,
            {
                **base,
                "vllm.process_id": str(rng.randint(2000, 2999)),
                "vllm.process_kind": "Worker",
                "vllm.process_name": "VllmWorker-0",
            },
        ),
    }
    spawn = _draw(rng, 500, 3000)
    worker_spawn = _draw(rng, 500, 2000)
    durations = {
        "Worker init": _draw(rng, 50, 500),
        "Init device": _draw(rng, 500, 5000),
        "Load model": _draw(rng, 5000, 120000),
        "Prepare model": _draw(rng, 5000, 60000),
    }
    t = T0
    ready_gap = _draw(rng, 10, 200)
    ex0 = t + spawn
    w0 = ex0 + worker_spawn
    w = {"Worker init": w0}
    w["Init device"] = w0 + durations["Worker init"]
    w["Load model"] = w["Init device"] + durations["Init device"]
    ex1 = w["Load model"] + durations["Load model"] + ready_gap
    p0 = ex1 + ready_gap
    end = p0 + durations["Prepare model"] + ready_gap
    tb = TraceBuilder(rng)

    def add(name: str, start: int, stop: int, parent: bytes | None) -> bytes:
        function, module = _STARTUP_CODE[name]
        attrs = {
            "code.function": function,
            "code.namespace": module,
            "code.filepath": "/usr/local/lib/python3.12/site-packages/"
            + module.replace(".", "/")
            + ".py",
            "code.lineno": str(rng.randint(20, 900)),
        }
        host = hosts[VLLM_STARTUP_SPANS[name]]
        return tb.add(
            host, (module, ""), name, INTERNAL, start, stop, parent=parent, attributes=attrs
        )

    loading = add("Overall Loading", t, end, None)
    executor = add("Executor init", ex0, ex1, loading)
    for name in ("Worker init", "Init device", "Load model"):
        add(name, w[name], w[name] + durations[name], executor)
    add("Prepare model", p0, p0 + durations["Prepare model"], loading)
    startup = StartupTruth(
        trace_id=tb.trace_hex,
        replica=pod,
        loading_ns=end - t,
        load_model_ns=durations["Load model"],
        prepare_ns=durations["Prepare model"],
        ready_ns=end,
    )
    builders, truths = [tb], []
    at = end + _draw(rng, 100, 2000)
    for i in range(requests):
        plan = _vllm_leg(rng, prefill_ms=(200, 900) if i == 0 else (20, 300))
        call = LlmCall(random_client(rng, client), plan)
        own = TraceBuilder(rng)
        made = call.emit(own, Host("chat-frontend"), hosts["api"], None, at)
        truths.append(_engine_truth(made.truth, _VllmAsEngine()))
        builders.append(own)
        at = made.end + _draw(rng, 50, 500)
    built = Built(
        [rs for b in builders for rs in b.resource_spans()],
        truths,
        [b.trace_hex for b in builders],
    )
    return StartupBuilt(built, startup)


class _VllmAsEngine(EnginePlan):
    engine = "vllm"


#: Every builder in the shapes it offers, for tests that go through them all: (label, seed ->
#: Built), as ``tests/upstream_traces.BUILDERS``.
ENGINE_BUILDERS: list[tuple[str, Callable[[int], Built]]] = [
    ("trtllm", lambda s: trtllm_request(s)),
    ("trtllm-httpx-skew", lambda s: trtllm_request(s, client="httpx", skew_ns=900 * MS)),
    ("trtllm-no-client", lambda s: trtllm_request(s, client=None)),
    ("trtllm-disagg", lambda s: trtllm_disagg_request(s)),
    ("trtllm-disagg-openai-v2", lambda s: trtllm_disagg_request(s, client="openai_v2")),
    ("triton-tensorrtllm", lambda s: triton_request(s, backend="tensorrtllm")),
    ("triton-ensemble", lambda s: triton_request(s, backend="ensemble")),
    ("triton-bls", lambda s: triton_request(s, backend="bls", skew_ns=-2 * SECOND)),
    ("triton-vllm", lambda s: triton_request(s, backend="vllm")),
    ("triton-vllm-engine-trace", lambda s: triton_request(s, backend="vllm", engine_trace=True)),
    ("tgi-stream", lambda s: tgi_request(s)),
    ("tgi-generate", lambda s: tgi_request(s, stream=False, client="httpx")),
    ("tgi-no-client", lambda s: tgi_request(s, client=None)),
    ("vllm-detailed-all", lambda s: vllm_detailed_request(s)),
    ("vllm-detailed-model", lambda s: vllm_detailed_request(s, modules=("model",))),
    ("vllm-stages-upstream", lambda s: vllm_stages_request(s)),
    ("vllm-stages-upstream-kv", lambda s: vllm_stages_request(s, kv=True)),
    ("vllm-stages-vendor", lambda s: vllm_stages_request(s, style="vendor")),
    ("vllm-stages-vendor-wait", lambda s: vllm_stages_request(s, style="vendor-wait")),
    ("dynamo-vllm", lambda s: dynamo_request(s)),
    ("dynamo-vllm-route", lambda s: dynamo_request(s, route=True)),
    ("dynamo-sglang", lambda s: dynamo_request(s, backend="sglang")),
    ("dynamo-trtllm", lambda s: dynamo_request(s, backend="trtllm")),
    ("dynamo-vllm-disagg", lambda s: dynamo_request(s, disagg=True)),
    ("dynamo-trtllm-disagg", lambda s: dynamo_request(s, backend="trtllm", disagg=True)),
    ("vllm-startup", lambda s: vllm_startup(s).built),
]
