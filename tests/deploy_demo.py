"""Demo data for the deploy tests: realistic LLM request traces, their attribution, GPU samples.

``load_demo(store_dir, now_ns=...)`` sends client, server and phase spans with token times and
GPU figures through a real ``latscope serve`` (plain OpenTelemetry SDK, OTLP/gRPC exporter), stops
it, then fills ``latscope_attribution`` and ``latscope_metrics`` in the same store.

The attribution rows come from ``attribution_rows``: the per-trace engine run over the stored
spans and written as rows here, one place to swap for the attributor's own writer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

from latscope.attribution import attribute_requests, load_trace
from latscope.semconv import GenAIAttributes, HttpAttributes, LatscopeAttributes, Phase
from latscope.storage import ATTRIBUTION_TABLE, METRICS_TABLE, SPANS_TABLE, Store
from tests.serve_support import release_embedded_store, start_serve

MS = 1_000_000
#: (client service, server service, model, mean TPOT ms): two front ends over two model servers.
WORKLOADS = (
    ("chat-frontend", "vllm-llama", "llama-3.1-8b", 18.0),
    ("chat-frontend", "vllm-mixtral", "mixtral-8x7b", 35.0),
    ("rag-gateway", "vllm-llama", "llama-3.1-8b", 18.0),
)
GPU_METRICS = (("latscope.gpu.utilization", "%"), ("latscope.gpu.power", "W"))


@dataclass
class Demo:
    store_dir: Path
    requests: int
    traces: int
    first_ns: int
    last_ns: int


def _provider(endpoint: str, service: str) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(endpoint=endpoint, insecure=True, timeout=30),
            max_queue_size=8192,
            max_export_batch_size=512,
        )
    )
    return provider


def _gpu(rng: random.Random, phase: str, duration_ns: int) -> dict[str, float]:
    util = rng.uniform(85, 99) if phase == Phase.PREFILL else rng.uniform(45, 80)
    power = rng.uniform(280, 400) if phase == Phase.PREFILL else rng.uniform(180, 300)
    return {
        LatscopeAttributes.GPU_UTIL_MEAN: round(util, 1),
        LatscopeAttributes.GPU_UTIL_MAX: round(min(100.0, util + rng.uniform(0, 8)), 1),
        LatscopeAttributes.GPU_MEMORY_USED_MAX: float(rng.randint(40, 76) * 1024**3),
        LatscopeAttributes.GPU_POWER_MEAN: round(power, 1),
        LatscopeAttributes.GPU_SM_CLOCK: float(rng.choice((1410, 1755, 1980))),
        # W x s = J; x1000 = mJ
        LatscopeAttributes.GPU_ENERGY_MJ: round(power * duration_ns / 1e9 * 1000, 1),
    }


def _send_request(
    rng: random.Random,
    tracers: dict[str, object],
    start_ns: int,
    workload: tuple[str, str, str, float],
    *,
    incident: bool,
) -> None:
    """One streamed chat completion: client span > server span > five phase spans."""
    client_service, server_service, model, tpot_ms = workload
    input_tokens = rng.randint(60, 3000)
    output_tokens = rng.randint(16, 300)
    network = rng.uniform(4, 30) * MS
    queue = rng.lognormvariate(2.0, 0.8) * MS * (12 if incident else 1)
    preprocess = (rng.uniform(2, 10) + input_tokens / 400) * MS
    prefill = (15 + input_tokens * 0.05 * rng.uniform(0.9, 1.3)) * MS
    gaps = [rng.lognormvariate(0, 0.25) * tpot_ms * MS for _ in range(output_tokens - 1)]
    if rng.random() < 0.05:  # a decode stall: one long inter-token gap
        gaps[rng.randrange(len(gaps))] += rng.uniform(300, 900) * MS
    decode = sum(gaps) + MS
    postprocess = rng.uniform(1, 8) * MS
    slack = rng.uniform(0.2, 3) * MS  # server time no phase covers

    has_client = rng.random() > 0.15
    error = rng.random() < 0.03
    t = int(start_ns + network / 2)
    server_start = t
    ctracer = tracers[client_service]
    stracer = tracers[server_service]
    c_span = ctx = None
    if has_client:
        c_span = ctracer.start_span(
            "POST /v1/chat/completions",
            kind=SpanKind.CLIENT,
            start_time=start_ns,
            attributes={
                GenAIAttributes.REQUEST_MODEL: model,
                GenAIAttributes.OPERATION_NAME: "chat",
                HttpAttributes.REQUEST_METHOD: "POST",
            },
        )
        ctx = set_span_in_context(c_span)
    s_span = stracer.start_span(
        f"chat {model}",
        context=ctx,
        kind=SpanKind.SERVER,
        start_time=server_start,
        attributes={
            GenAIAttributes.REQUEST_MODEL: model,
            GenAIAttributes.OPERATION_NAME: "chat",
            GenAIAttributes.USAGE_INPUT_TOKENS: input_tokens,
            GenAIAttributes.USAGE_OUTPUT_TOKENS: output_tokens,
            HttpAttributes.ROUTE: "/v1/chat/completions",
        },
    )
    s_ctx = set_span_in_context(s_span)
    t += int(slack / 2)
    first_token_ns = 0
    for phase, duration in (
        (Phase.QUEUE, queue),
        (Phase.PREPROCESS, preprocess),
        (Phase.PREFILL, prefill),
        (Phase.DECODE, decode),
        (Phase.POSTPROCESS, postprocess),
    ):
        attributes: dict[str, object] = {LatscopeAttributes.PHASE: phase}
        if phase in (Phase.PREFILL, Phase.DECODE):
            attributes.update(_gpu(rng, phase, int(duration)))
        if phase == Phase.DECODE:
            offsets, at = [0], 0.0
            for gap in gaps:
                at += gap
                offsets.append(int(at / 1000))
            attributes[LatscopeAttributes.TOKEN_OFFSETS_US] = offsets
            attributes[LatscopeAttributes.TOKEN_COUNT] = len(offsets)
            first_token_ns = t
        span = stracer.start_span(phase, context=s_ctx, start_time=t, attributes=attributes)
        t += int(duration)
        span.end(end_time=t)
    t += int(slack / 2)
    if error:
        s_span.set_status(Status(StatusCode.ERROR, "upstream worker restarted"))
    s_span.end(end_time=t)
    if c_span is not None:
        c_span.set_attribute(LatscopeAttributes.FIRST_TOKEN_NS, int(first_token_ns + network / 2))
        c_span.end(end_time=int(t + network / 2))


def send_traces(endpoint: str, *, now_ns: int, requests: int, seed: int) -> tuple[int, int]:
    """Send ``requests`` request traces spread over the two hours before ``now_ns``."""
    rng = random.Random(seed)
    services = {w[0] for w in WORKLOADS} | {w[1] for w in WORKLOADS}
    providers = {s: _provider(endpoint, s) for s in sorted(services)}
    tracers = {s: p.get_tracer("latscope.demo") for s, p in providers.items()}
    span_ns = 2 * 3600 * 10**9
    first = now_ns - span_ns
    starts = sorted(first + rng.randrange(span_ns - 60 * 10**9) for _ in range(requests))
    for start in starts:
        # A queueing incident 40-55 minutes ago: the tail panels have something to show.
        incident = now_ns - 55 * 60 * 10**9 <= start <= now_ns - 40 * 60 * 10**9
        _send_request(rng, tracers, start, rng.choice(WORKLOADS), incident=incident)
    for provider in providers.values():
        assert provider.force_flush(60_000), "spans were not exported"
        provider.shutdown()
    return starts[0], starts[-1]


def attribution_rows(store: Store) -> pa.Table:
    """One attribution row per stored trace, in the columns ``latscope_attribution`` has."""
    columns = {
        name
        for (name,) in store.query_rows(
            "SELECT name FROM system.columns WHERE database = currentDatabase() "
            "AND table = {table:String}",
            {"table": ATTRIBUTION_TABLE},
        )
    }
    trace_ids = [r[0] for r in store.query_rows(f"SELECT DISTINCT TraceId FROM {SPANS_TABLE}")]
    rows = []
    results = [
        result
        for trace_id in sorted(trace_ids)
        for result in attribute_requests(trace_id, load_trace(store, trace_id))
    ]
    for result in results:
        b = result.buckets_ns
        rows.append(
            {
                "Timestamp": result.start_ns,
                "TraceId": result.trace_id,
                "RequestSpanId": result.request_span_id,
                "ServiceName": result.service,
                "Model": result.model,
                "Operation": result.operation,
                "Route": result.route,
                "ResourceAttributes": [],
                "StatusCode": result.status,
                "HasClient": result.has_client,
                "Attempts": result.attempts,
                "E2eNs": result.e2e_ns,
                "NetworkNs": b["network"],
                "QueueNs": b["queue"],
                "PreprocessNs": b["preprocess"],
                "PrefillNs": b["prefill"],
                "DecodeNs": b["decode"],
                "PostprocessNs": b["postprocess"],
                "OtherNs": b["other"],
                "TtftClientNs": result.ttft_client_ns,
                "TtftServerNs": result.ttft_server_ns,
                "TpotNs": result.tpot_ns,
                "ItlP50Ns": result.itl_ns.get("p50"),
                "ItlP99Ns": result.itl_ns.get("p99"),
                "ItlMaxNs": result.itl_ns.get("max"),
                "Stalls": result.stalls,
                "InputTokens": result.input_tokens,
                "OutputTokens": result.output_tokens,
                "ClockSkewNs": result.clock_skew_ns,
                "KvTransferNs": result.kv_transfer_ns,
                "Gpu": [
                    (f"{phase}.{name}", value)
                    for phase, figures in result.gpu.items()
                    for name, value in figures.items()
                ],
                "Version": 1,
            }
        )
    strings = (
        "TraceId",
        "RequestSpanId",
        "ServiceName",
        "Model",
        "Operation",
        "Route",
        "StatusCode",
    )
    floats = ("TpotNs", "ItlP50Ns", "ItlP99Ns", "ItlMaxNs")
    types = {
        "Timestamp": pa.timestamp("ns"),
        "ResourceAttributes": pa.map_(pa.string(), pa.string()),
        "HasClient": pa.bool_(),
        "Gpu": pa.map_(pa.string(), pa.float64()),
        **dict.fromkeys(strings, pa.string()),
        **dict.fromkeys(floats, pa.float64()),
    }
    # Only the columns the table has: a column added later takes its default.
    names = [n for n in rows[0] if n in columns]
    return pa.table(
        {n: pa.array([r[n] for r in rows], type=types.get(n, pa.int64())) for n in names}
    )


def gpu_samples(*, first_ns: int, last_ns: int, seed: int) -> pa.Table:
    """NVML gauge samples every 15 s for two GPUs per model server, as the SDK exports them."""
    rng = random.Random(seed)
    cols: dict[str, list] = {
        k: []
        for k in ("Timestamp", "ServiceName", "MetricName", "MetricKind", "Unit", "Value",
                  "Attributes", "ResourceAttributes")
    }  # fmt: skip
    for service in sorted({w[1] for w in WORKLOADS}):
        for index in range(2):
            uuid = f"GPU-{service}-{index}"
            for ts in range(first_ns, last_ns, 15 * 10**9):
                for metric, unit in GPU_METRICS:
                    value = rng.uniform(40, 98) if unit == "%" else rng.uniform(150, 400)
                    cols["Timestamp"].append(ts)
                    cols["ServiceName"].append(service)
                    cols["MetricName"].append(metric)
                    cols["MetricKind"].append("gauge")
                    cols["Unit"].append(unit)
                    cols["Value"].append(round(value, 1))
                    cols["Attributes"].append([("gpu.uuid", uuid), ("gpu.index", str(index))])
                    cols["ResourceAttributes"].append([("service.name", service)])
    smap = pa.map_(pa.string(), pa.string())
    return pa.table(
        {
            "Timestamp": pa.array(cols["Timestamp"], pa.timestamp("ns")),
            "ServiceName": pa.array(cols["ServiceName"], pa.string()),
            "MetricName": pa.array(cols["MetricName"], pa.string()),
            "MetricKind": pa.array(cols["MetricKind"], pa.string()),
            "Unit": pa.array(cols["Unit"], pa.string()),
            "Value": pa.array(cols["Value"], pa.float64()),
            "Attributes": pa.array(cols["Attributes"], smap),
            "ResourceAttributes": pa.array(cols["ResourceAttributes"], smap),
        }
    )


def load_demo(store_dir: Path, *, now_ns: int, requests: int = 240, seed: int = 7) -> Demo:
    """Fill a fresh embedded store at ``store_dir`` with the demo; the store is closed after."""
    server = start_serve(store_dir)
    try:
        first, last = send_traces(server.grpc, now_ns=now_ns, requests=requests, seed=seed)
    finally:
        code = server.stop()
    assert code == 0, server.text()
    release_embedded_store()
    store = Store.open(f"chdb://{store_dir}")
    try:
        store.apply_schema()
        table = attribution_rows(store)
        store.insert_arrow(ATTRIBUTION_TABLE, table)
        store.insert_arrow(METRICS_TABLE, gpu_samples(first_ns=first, last_ns=last, seed=seed))
    finally:
        store.close()
    return Demo(store_dir, requests, table.num_rows, first, last)


__all__ = ["Demo", "attribution_rows", "gpu_samples", "load_demo", "send_traces"]
