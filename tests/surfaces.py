"""Test data for the on-call surfaces: realistic request traces sent through real OTLP/gRPC."""

from __future__ import annotations

import atexit
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, set_span_in_context

from latscope.semconv import GenAIAttributes, LatscopeAttributes
from tests.serve_support import Server, start_serve

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
    gpu: dict[str, dict] = field(default_factory=dict)
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
            attrs: dict = {LatscopeAttributes.PHASE: phase, **spec.gpu.get(phase, {})}
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


# -- a dataset served by a real `latscope serve` -------------------------------------------------


def _gpu_attrs(util: float, energy_mj: float) -> dict:
    return {
        LatscopeAttributes.GPU_UTIL_MEAN: util,
        LatscopeAttributes.GPU_ENERGY_MJ: energy_mj,
    }


def dataset(now_ns: int) -> list[RequestSpec]:
    """Requests with known answers.

    * 30 ``llm-server``/``llama-3-8b`` with a client span, 10-20 min ago, queue growing 10..300 ms,
      prefill 300 ms, 26 tokens 20 ms apart; one of them waits 3 s in the queue (the tail).
    * 10 ``llm-server``/``mistral-7b`` server-only (network unknown), 5-10 min ago.
    * 20 ``llama-3-8b`` 80-100 min ago with prefill 100 ms (the "before" window of compare).
    * 1 request with a 400 ms inter-token stall.
    GPU figures on the prefill spans of the recent llama requests (utilization 90 %, 40 J).
    """
    specs: list[RequestSpec] = []
    minute = 60_000 * MS
    tokens = steady_tokens(26, 0, 20_000)
    for i in range(30):
        queue = 3000 if i == 29 else 10 + 10 * i
        phases = {
            "queue": (45, 45 + queue),
            "preprocess": (45 + queue, 75 + queue),
            "prefill": (75 + queue, 375 + queue),
            "decode": (375 + queue, 895 + queue),
            "postprocess": (895 + queue, 945 + queue),
        }
        specs.append(
            RequestSpec(
                client=(0, 1000 + queue),
                server=(40, 955 + queue),
                phases=phases,
                token_offsets_us=tokens,
                gpu={"prefill": _gpu_attrs(GPU_UTIL, GPU_ENERGY_MJ)},
                start_ns=now_ns - 20 * minute + i * 20_000 * MS,
            )
        )
    for i in range(10):
        specs.append(
            RequestSpec(
                model="mistral-7b",
                client=None,
                token_offsets_us=tokens,
                start_ns=now_ns - 10 * minute + i * 20_000 * MS,
            )
        )
    for i in range(20):
        specs.append(
            RequestSpec(
                phases={
                    "queue": (45, 145),
                    "preprocess": (150, 180),
                    "prefill": (180, 280),
                    "decode": (380, 900),
                    "postprocess": (900, 950),
                },
                token_offsets_us=tokens,
                start_ns=now_ns - 100 * minute + i * 30_000 * MS,
            )
        )
    specs.append(
        RequestSpec(
            model="llama-3-70b",
            service="rag-server",
            token_offsets_us=steady_tokens(20, 0, 20_000, stall_at=10, stall_us=400_000),
            phases={
                "queue": (45, 145),
                "preprocess": (150, 180),
                "prefill": (180, 380),
                "decode": (380, 900),
                "postprocess": (900, 950),
            },
            start_ns=now_ns - 3 * minute,
        )
    )
    return specs


GPU_UTIL, GPU_ENERGY_MJ = 90.0, 40_000.0


_BUILT: dict[str, object] = {}


#: Flags that make the attributor of a test server attribute within a fraction of a second.
FAST_ATTRIBUTION = ("--attribution-settle-s", "0.3", "--attribution-poll-s", "0.1")


def wait_attributed(server: Server, count: int, timeout: float = 60) -> None:
    """Wait until the server's attributor has written ``count`` requests of the last 7 days."""
    deadline = time.monotonic() + timeout
    seen = -1
    while time.monotonic() < deadline:
        body = httpx.get(server.url("/v1/services"), params={"since": "7d"}, timeout=30).json()
        seen = sum(s["count"] for s in body["services"])
        if seen >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"only {seen} of {count} requests attributed after {timeout} s")


#: The oldest a built dataset is reused: the tightest relative window (the 20 requests 80-100 min
#: before the build, asked as ``since=2h, until=70m``) holds them for 10 minutes more.
DATASET_MAX_AGE_S = 600


def dataset_store() -> tuple[Path, list[RequestSpec]]:
    """A store holding ``dataset()``: spans sent through OTLP to a real ``latscope serve``, whose
    attributor wrote their rows; built once per test process. The ``served`` fixture serves a copy
    of it; tests that open it themselves (``latscope api``, ``--store``) do so one at a time (an
    embedded store belongs to one process at a time) and only read it.

    The tests ask windows relative to now (``--since 2h``) of requests placed relative to the
    build: a build older than ``DATASET_MAX_AGE_S`` (a long run on a loaded machine) is built
    again, so no request has aged out of the window its test asks for."""
    if "dir" not in _BUILT or time.monotonic() - _BUILT["at"] > DATASET_MAX_AGE_S:  # type: ignore[operator]
        build = Path(tempfile.mkdtemp(prefix="latscope-dataset-"))
        atexit.register(shutil.rmtree, build, ignore_errors=True)
        server = start_serve(build / "store", *FAST_ATTRIBUTION)
        try:
            specs = send(server.grpc, dataset(time.time_ns()))
            wait_attributed(server, len(specs))
        finally:
            assert server.stop() == 0, server.text()
        _BUILT.update(dir=build / "store", specs=specs, at=time.monotonic())
    return _BUILT["dir"], list(_BUILT["specs"])  # type: ignore[return-value, call-overload]
