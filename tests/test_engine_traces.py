"""The engine trace builders' truth agrees with the spans they write.

Each builder of ``tests/engine_traces.py`` is checked against figures read back from its own spans
by simple arithmetic: the engine's attributes, fields and events, and the phase boundaries the
module's docstring names. No attribution engine is involved here.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from latscope.attribution.model import SpanRecord
from tests.engine_traces import (
    ENGINE_BUILDERS,
    TRITON_BACKENDS,
    VLLM_STAGE_NAMES,
    VLLM_STARTUP_SPANS,
    EngineTruth,
    dynamo_request,
    paint,
    parse_rust_duration,
    rust_duration,
    tgi_request,
    triton_request,
    trtllm_disagg_request,
    trtllm_request,
    vllm_detailed_request,
    vllm_stages_request,
    vllm_startup,
)
from tests.test_upstream_truth import SGLANG_BUCKET_OF, _union
from tests.upstream_traces import MS, SECOND, Built, span_records

SEEDS = range(6)
REQUEST_ID = re.compile(r"^[0-9a-f]{32}-[0-9a-f]{16}$")


def _ns(seconds: str) -> int:
    return round(float(seconds) * SECOND)


def _trace(built: Built, truth: EngineTruth) -> list[SpanRecord]:
    return span_records(built.resource_spans)[truth.trace_id]


def _named(built: Built, truth: EngineTruth) -> SpanRecord:
    """The span the request id names."""
    sid = truth.request_id.split("-")[1]
    (span,) = [s for s in _trace(built, truth) if s.span_id == sid]
    return span


def _server(built: Built, truth: EngineTruth) -> SpanRecord:
    """The request's server span: the named span when there is no client, else the span under
    its client chain (openai-v2's ``chat`` span over the HTTP span, or the HTTP span alone)."""
    node = _named(built, truth)
    while node.kind == "Client":
        (node,) = [s for s in _trace(built, truth) if s.parent_span_id == node.span_id]
    return node


def _children(spans: list[SpanRecord], parent: SpanRecord, name: str | None = None):
    return sorted(
        (s for s in spans if s.parent_span_id == parent.span_id and name in (None, s.name)),
        key=lambda s: s.start_ns,
    )


def _proto(built: Built, span: SpanRecord) -> Span:
    (raw,) = [s for s in built.spans if s.span_id.hex() == span.span_id]
    return raw


def _event_attrs(built: Built, span: SpanRecord) -> dict[str, dict[str, str]]:
    return {
        e.name: {kv.key: kv.value.string_value or str(kv.value.int_value) for kv in e.attributes}
        for e in _proto(built, span).events
    }


def _first(events: tuple[tuple[str, int], ...], name: str) -> int:
    return min(t for n, t in events if n == name)


def _latency(span: SpanRecord) -> dict[str, int]:
    prefix = "gen_ai.latency."
    return {k[len(prefix) :]: _ns(v) for k, v in span.attributes.items() if k.startswith(prefix)}


# -- every builder --------------------------------------------------------------------------------


@pytest.mark.parametrize(("label", "build"), ENGINE_BUILDERS, ids=[b[0] for b in ENGINE_BUILDERS])
@pytest.mark.parametrize("seed", SEEDS)
def test_truth_adds_up_and_names_a_span(
    label: str, build: Callable[[int], Built], seed: int
) -> None:
    built = build(seed)
    assert built.truths, label
    for truth in built.truths:
        assert isinstance(truth, EngineTruth) and truth.engine, label
        truth.check()
        assert REQUEST_ID.match(truth.request_id), truth.request_id
        assert truth.trace_id in built.trace_ids
        named = _named(built, truth)
        assert (truth.buckets["network"] is None) is (named.kind != "Client"), label
        if named.kind == "Client" and not truth.headers_only:
            assert truth.e2e_ns == named.duration_ns, label
        if named.kind != "Client":
            assert truth.e2e_ns == named.duration_ns, label
        if truth.server_ttft_ns is not None:
            assert 0 < truth.server_ttft_ns < _server(built, truth).duration_ns, label


def test_builders_are_deterministic_per_seed() -> None:
    for label, build in ENGINE_BUILDERS:
        assert build(3).resource_spans == build(3).resource_spans, label
        assert build(3).truths == build(3).truths, label


# -- the helpers the truth uses --------------------------------------------------------------------


def test_rust_duration_is_debug_format() -> None:
    # core::time::Duration's Debug: largest unit reached, all non-zero fraction digits.
    assert rust_duration(0) == "0ns"
    assert rust_duration(999) == "999ns"
    assert rust_duration(1_000) == "1µs"
    assert rust_duration(1_500) == "1.5µs"
    assert rust_duration(12_034_500) == "12.0345ms"
    assert rust_duration(1_000_000_000) == "1s"
    assert rust_duration(61_000_000_001) == "61.000000001s"
    assert parse_rust_duration("2.5μs") == 2_500  # Greek mu reads too


@given(st.integers(min_value=0, max_value=10**13))
def test_rust_duration_round_trips(ns: int) -> None:
    assert parse_rust_duration(rust_duration(ns)) == ns


def test_paint_gives_overlaps_to_the_higher_priority() -> None:
    intervals = [("queue", 0, 50), ("prefill", 40, 70), ("postprocess", 60, 90), ("decode", 80, 85)]
    assert paint((0, 100), intervals) == {
        "queue": 40,
        "preprocess": 0,
        "prefill": 30,
        "decode": 5,
        "postprocess": 15,
        "other": 10,
    }


# -- TensorRT-LLM ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_trtllm_buckets_are_its_latency_attributes(seed: int) -> None:
    built = trtllm_request(seed)
    truth = built.truth
    client, server = _named(built, truth), _server(built, truth)
    assert server.name == "llm_request" and server.kind == "Server"
    assert server.parent_span_id == client.span_id
    assert "gen_ai.request.model" not in server.attributes
    lat, b = _latency(server), truth.buckets
    assert "kv_cache_transfer_time" not in lat
    assert b["queue"] == lat["time_in_queue"]
    assert b["prefill"] == lat["time_to_first_token"] - lat["time_in_queue"]
    assert b["decode"] == lat["e2e"] - lat["time_to_first_token"]
    assert b["other"] == server.duration_ns - lat["e2e"]
    assert truth.server_ttft_ns == lat["time_to_first_token"]
    assert b["network"] == client.duration_ns - server.duration_ns


@pytest.mark.parametrize("seed", SEEDS)
def test_trtllm_disagg_is_one_request_with_its_kv_transfer(seed: int) -> None:
    built = trtllm_disagg_request(seed)
    truth = built.truth
    spans = _trace(built, truth)
    proxy = _server(built, truth)
    ctx, gen = _children(spans, proxy)
    assert {s.name for s in (proxy, ctx, gen)} == {"llm_request"}
    assert {s.kind for s in (proxy, ctx, gen)} == {"Server"}
    assert not _latency(proxy), "the proxy's span carries no latency figures"
    assert ctx.end_ns < gen.start_ns
    events = _event_attrs(built, proxy)
    assert events["ctx_server.selected"]["server"].startswith("http://ctx-")
    assert events["gen_server.selected"]["server"].startswith("http://gen-")
    selected = dict(proxy.events)
    assert proxy.start_ns < selected["ctx_server.selected"] < ctx.start_ns
    assert ctx.end_ns < selected["gen_server.selected"] < gen.start_ns
    c, g = _latency(ctx), _latency(gen)
    assert c["e2e"] == c["time_to_first_token"], "a context-only request ends at its first token"
    assert ctx.attributes["gen_ai.usage.completion_tokens"] == "1"
    kv_start, kv_end = (
        _first(gen.events, "kv_cache_transfer_start"),
        _first(gen.events, "kv_cache_transfer_end"),
    )
    assert g["kv_cache_transfer_time"] == kv_end - kv_start == truth.kv_transfer_ns
    assert gen.start_ns < kv_start and kv_end < gen.start_ns + g["time_in_queue"]
    assert int(_event_attrs(built, gen)["kv_cache_transfer_end"]["kv_cache_size"]) > 0
    b = truth.buckets
    assert b["queue"] == c["time_in_queue"] + g["time_in_queue"] - g["kv_cache_transfer_time"]
    assert b["prefill"] == c["time_to_first_token"] - c["time_in_queue"]
    assert b["decode"] == g["e2e"] - g["time_in_queue"]
    assert b["other"] == proxy.duration_ns - b["queue"] - b["prefill"] - b["decode"]
    assert truth.server_ttft_ns == ctx.start_ns - proxy.start_ns + c["time_to_first_token"]
    assert truth.figures["gen.kv_cache_transfer_time"] == truth.kv_transfer_ns
    assert truth.attempts == 1


# -- Triton ---------------------------------------------------------------------------------------

_COMPUTE_EVENTS = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")


def _triton_intervals(
    spans: list[SpanRecord], root: SpanRecord, backend: str
) -> list[tuple[str, int, int]]:
    """The phase intervals by the rules of tests/engine_traces.py, read from the events."""
    responses = sorted(t for n, t in root.events if n == "INFER_RESPONSE_COMPLETE")
    out = []
    for model in (s for s in spans if s.attributes.get("triton.model_name")):
        (compute,) = _children(spans, model, "compute") or [None]
        if compute is None:
            continue
        c = dict(compute.events)
        start, in_end, out_start, end = (c[n] for n in _COMPUTE_EVENTS)
        out.append(("queue", dict(model.events)["QUEUE_START"], start))
        if model.name == "preprocessing":
            out.append(("preprocess", start, end))
        elif model.name == "postprocessing":
            out.append(("postprocess", start, end))
        elif backend == "vllm":
            out += [
                ("preprocess", start, end),
                ("prefill", end, responses[0]),
                ("decode", responses[0], responses[-1]),
            ]
        else:
            out += [
                ("preprocess", start, in_end),
                ("prefill", in_end, responses[0]),
                ("decode", responses[0], out_start),
                ("postprocess", out_start, end),
            ]
    return out


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_triton_buckets_follow_its_stage_events(seed: int, backend: str) -> None:
    built = triton_request(seed, backend=backend)
    truth = built.truth
    spans = _trace(built, truth)
    root = _server(built, truth)
    assert root.name == "InferRequest"
    assert {s.kind for s in spans if s.span_id != _named(built, truth).span_id} == {"Server"}
    names = [n for n, _ in root.events]
    assert names[:2] == ["HTTP_RECV_START", "HTTP_RECV_END"]
    assert max(t for n, t in root.events if n.startswith("HTTP_RECV")) < root.start_ns
    sends = [t for n, t in root.events if n.startswith("HTTP_SEND")]
    assert sends and all(t < root.start_ns - SECOND for t in sends), "stamped zero: boot time"
    responses = [t for n, t in root.events if n == "INFER_RESPONSE_COMPLETE"]
    assert truth.server_ttft_ns == min(responses) - root.start_ns
    (top,) = _children(spans, root)
    assert top.attributes["triton.model_name"] == top.name == truth.model
    assert top.attributes["triton.trace_parent_id"] == "0"
    for model in (s for s in spans if s.attributes.get("triton.model_name")):
        assert [n for n, _ in model.events] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
        assert dict(model.events)["REQUEST_START"] == model.start_ns
        assert dict(model.events)["REQUEST_END"] == model.end_ns
        for compute in _children(spans, model, "compute"):
            assert [n for n, _ in compute.events] == list(_COMPUTE_EVENTS)
            times = [t for _, t in compute.events]
            assert times == sorted(times) and times[0] == compute.start_ns
            assert times[-1] == compute.end_ns
    buckets = paint((root.start_ns, root.end_ns), _triton_intervals(spans, root, backend))
    assert {b: truth.buckets[b] for b in buckets} == buckets
    assert truth.buckets["network"] == _named(built, truth).duration_ns - root.duration_ns
    if backend == "ensemble":
        composing = _children(spans, top)
        posts = [s for s in composing if s.name == "postprocessing"]
        assert [s.name for s in composing[:2]] == ["preprocessing", "tensorrt_llm"]
        assert len(posts) == len(responses)
        assert {s.attributes["triton.trace_parent_id"] for s in composing} == {
            top.attributes["triton.trace_id"]
        }
        assert not _children(spans, top, "compute"), "an ensemble has no compute span"


@pytest.mark.parametrize("seed", SEEDS)
def test_triton_vllm_engine_trace_stands_alone(seed: int) -> None:
    built = triton_request(seed, backend="vllm", engine_trace=True)
    triton, engine = built.truths
    assert triton.trace_id != engine.trace_id
    (span,) = _trace(built, engine)
    assert span.name == "llm_request" and not span.parent_span_id
    lat = _latency(span)
    assert engine.buckets["network"] is None
    assert engine.buckets["decode"] == lat["time_in_model_decode"]
    root = _server(built, triton)
    responses = [t for n, t in root.events if n == "INFER_RESPONSE_COMPLETE"]
    # On one host clock: the engine works inside the backend's model span.
    (model,) = _children(_trace(built, triton), root)
    assert model.start_ns < span.start_ns and span.end_ns < max(responses)
    assert engine.output_tokens == len(responses)


# -- TGI ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("stream", [True, False])
def test_tgi_buckets_are_its_formatted_durations(seed: int, stream: bool) -> None:
    built = tgi_request(seed, stream=stream)
    truth = built.truth
    spans = _trace(built, truth)
    handler = _server(built, truth)
    assert handler.name == ("generate_stream" if stream else "generate")
    assert {s.kind for s in spans if s.span_id != _named(built, truth).span_id} == {"Internal"}
    f = {
        k: parse_rust_duration(handler.attributes[k])
        for k in ("total_time", "validation_time", "queue_time", "inference_time", "time_per_token")
    }
    assert re.fullmatch(r"[0-9.]+(s|ms|µs|ns)", handler.attributes["queue_time"])
    (schedule,) = (s for s in spans if s.name == "schedule")
    (queued,) = _children(spans, schedule, "queued")
    infers = _children(spans, schedule, "infer")
    assert queued.duration_ns == f["queue_time"]
    assert queued.end_ns == infers[0].start_ns
    assert all(a.end_ns == b.start_ns for a, b in itertools.pairwise(infers))
    assert [len(_children(spans, i, "send_generation")) for i in infers] == [1] * len(infers)
    assert f["time_per_token"] == f["inference_time"] // len(infers)
    assert f["total_time"] == f["validation_time"] + f["queue_time"] + f["inference_time"]
    b = truth.buckets
    assert b["preprocess"] == f["validation_time"]
    assert b["queue"] == f["queue_time"]
    assert b["prefill"] == infers[0].duration_ns
    assert b["decode"] == sum(i.duration_ns for i in infers[1:])
    hop = f["inference_time"] - sum(i.duration_ns for i in infers)
    assert b["other"] == handler.duration_ns - f["total_time"] + hop
    assert truth.server_ttft_ns == infers[0].end_ns - handler.start_ns
    assert handler.attributes["seed"].startswith("Some(")


# -- vLLM beyond llm_request ----------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("modules", [("all",), ("model",), ("worker",), ("model", "worker")])
def test_vllm_detailed_figures_are_sums_inside_the_model_time(
    seed: int, modules: tuple[str, ...]
) -> None:
    built = vllm_detailed_request(seed, modules=modules)
    truth = built.truth
    lat = _latency(_server(built, truth))
    forward_on = bool({"model", "all"} & set(modules))
    execute_on = bool({"worker", "all"} & set(modules))
    assert ("time_in_model_forward" in lat) is forward_on
    assert ("time_in_model_execute" in lat) is execute_on
    assert "time_in_model_prefill" not in lat and "time_in_model_decode" not in lat
    model_time = lat["e2e"] - lat["time_in_queue"]
    assert 0 < lat["time_in_scheduler"] < lat["e2e"]
    if forward_on:
        assert lat["time_in_model_forward"] == truth.figures["time_in_model_forward"]
    if execute_on:
        assert lat["time_in_model_execute"] <= model_time
        assert lat["time_in_model_execute"] == truth.figures["time_in_model_execute"]
    if forward_on and execute_on:
        assert lat["time_in_model_forward"] <= lat["time_in_model_execute"]
    b = truth.buckets
    assert (b["queue"], b["prefill"], b["decode"]) == (
        lat["time_in_queue"],
        lat["time_to_first_token"] - lat["time_in_queue"],
        lat["e2e"] - lat["time_to_first_token"],
    )


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    ("style", "kv"),
    [("upstream", False), ("upstream", True), ("vendor", False), ("vendor-wait", False)],
)
def test_vllm_stage_spans_win_over_the_attributes(seed: int, style: str, kv: bool) -> None:
    built = vllm_stages_request(seed, style=style, kv=kv)
    truth = built.truth
    spans = _trace(built, truth)
    server = _server(built, truth)
    children = _children(spans, server)
    queue, prefill, decode = VLLM_STAGE_NAMES[style]
    expected = [queue, *(["vllm_async_kv_transfer"] if kv else []), prefill, decode]
    assert [c.name for c in children] == expected
    assert {c.kind for c in children} == {"Internal"}
    assert all(server.start_ns <= c.start_ns and c.end_ns <= server.end_ns for c in children)
    by_name = {c.name: c.duration_ns for c in children}
    lat = _latency(server)
    assert lat["time_in_queue"] == by_name[queue]
    kv_ns = by_name.get("vllm_async_kv_transfer", 0)
    assert lat["time_in_model_prefill"] == by_name[prefill] + kv_ns
    b = truth.buckets
    assert (b["queue"], b["prefill"], b["decode"]) == (
        by_name[queue],
        by_name[prefill],
        by_name[decode],
    )
    assert b["other"] == server.duration_ns - sum(by_name.values()) + kv_ns
    assert truth.kv_transfer_ns == (kv_ns or None)


@pytest.mark.parametrize("seed", SEEDS)
def test_vllm_startup_trace_gives_the_replica_load_time(seed: int) -> None:
    made = vllm_startup(seed)
    startup, built = made.startup, made.built
    spans = span_records(built.resource_spans)[startup.trace_id]
    by_name = {s.name: s for s in spans}
    assert set(by_name) == set(VLLM_STARTUP_SPANS)
    assert {s.kind for s in spans} == {"Internal"}
    loading, executor = by_name["Overall Loading"], by_name["Executor init"]
    assert not loading.parent_span_id
    assert executor.parent_span_id == by_name["Prepare model"].parent_span_id == loading.span_id
    for name in ("Worker init", "Init device", "Load model"):
        span = by_name[name]
        assert span.parent_span_id == executor.span_id
        assert executor.start_ns <= span.start_ns and span.end_ns <= executor.end_ns
        assert span.resource["vllm.process_kind"] == "Worker"
    for span in spans:
        kind = VLLM_STARTUP_SPANS[span.name]
        assert ("vllm.process_kind" in span.resource) is (kind != "api")
        assert span.resource["k8s.pod.name"] == startup.replica
        assert span.attributes["code.lineno"].isdigit()
    assert startup.loading_ns == loading.duration_ns
    assert startup.load_model_ns == by_name["Load model"].duration_ns
    assert startup.prepare_ns == by_name["Prepare model"].duration_ns
    assert startup.ready_ns == loading.end_ns
    assert len(built.truths) == 3
    first = built.truths[0]
    for truth in built.truths:
        truth.check()
        server = _server(built, truth)
        assert server.resource["k8s.pod.name"] == startup.replica
        assert server.start_ns > startup.ready_ns
    assert first.buckets["prefill"] >= 200 * MS, "the first request pays the first-use costs"


# -- Dynamo ---------------------------------------------------------------------------------------


def _engine_buckets(spans: list[SpanRecord], engine: SpanRecord) -> dict[str, int]:
    """One engine span's buckets by its own figures: vLLM's and TensorRT-LLM's attributes, or
    SGLang's stage slices."""
    if engine.name.lstrip().startswith("Req") or " Req " in engine.name:
        per: dict[str, list[tuple[int, int]]] = {}
        for s in spans:
            if s.name in SGLANG_BUCKET_OF:
                per.setdefault(SGLANG_BUCKET_OF[s.name], []).append((s.start_ns, s.end_ns))
        out = {bucket: _union(per.get(bucket, [])) for bucket in per}
        return {**out, "other": engine.duration_ns - sum(out.values())}
    lat = _latency(engine)
    queue = lat["time_in_queue"] - lat.get("kv_cache_transfer_time", 0)
    if "time_in_model_prefill" in lat:  # vLLM v1
        prefill, decode = lat["time_in_model_prefill"], lat["time_in_model_decode"]
    elif lat["e2e"] == lat["time_to_first_token"]:  # TensorRT-LLM context-only
        prefill, decode = lat["time_to_first_token"] - lat["time_in_queue"], 0
    elif "kv_cache_transfer_time" in lat:  # TensorRT-LLM generation-only: all decode
        prefill, decode = 0, lat["e2e"] - lat["time_in_queue"]
    else:
        prefill = lat["time_to_first_token"] - lat["time_in_queue"]
        decode = lat["e2e"] - lat["time_to_first_token"]
    return {"queue": queue, "prefill": prefill, "decode": decode}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    ("backend", "disagg", "route"),
    [
        ("vllm", False, False),
        ("vllm", False, True),
        ("sglang", False, False),
        ("trtllm", False, False),
        ("vllm", True, False),
        ("trtllm", True, False),
    ],
)
def test_dynamo_buckets_are_its_engines_figures(
    seed: int, backend: str, disagg: bool, route: bool
) -> None:
    built = dynamo_request(seed, backend=backend, disagg=disagg, route=route)
    truth = built.truth
    spans = _trace(built, truth)
    frontend = _server(built, truth)
    assert frontend.name == "http-request" and frontend.kind == "Internal"
    assert frontend.attributes["trace_id"] == truth.trace_id
    below = _children(spans, frontend)
    if route:
        (route_span,) = below
        assert route_span.name == "router.route_request" and route_span.kind == "Client"
        below = _children(spans, route_span)
    payloads = [s for s in below if s.name == "handle_payload"]
    assert len(payloads) == (2 if disagg else 1) == len(below)
    assert {p.kind for p in payloads} == {"Server" if route else "Internal"}
    components = [p.attributes["component"] for p in payloads]
    assert components == (["prefill", "backend"] if disagg else ["backend"])
    assert all(a.end_ns < b.start_ns for a, b in itertools.pairwise(payloads))
    totals = dict.fromkeys(("queue", "prefill", "decode", "preprocess"), 0)
    engines = []
    for payload in payloads:
        (engine,) = _children(spans, payload)
        engines.append(engine)
        assert payload.service != frontend.service
        assert engine.service == payload.service
        for bucket, ns in _engine_buckets(spans, engine).items():
            if bucket != "other":
                totals[bucket] += ns
    for bucket, ns in totals.items():
        assert truth.buckets[bucket] == ns, bucket
    known = sum(truth.buckets[b] for b in ("queue", "preprocess", "prefill", "decode"))
    assert truth.buckets["other"] == frontend.duration_ns - known
    first = engines[0]
    lat = _latency(first)
    if "time_to_first_token" in lat and backend != "sglang":
        assert (
            truth.server_ttft_ns == first.start_ns - frontend.start_ns + lat["time_to_first_token"]
        )
    if backend == "trtllm" and disagg:
        kv = _latency(engines[1])["kv_cache_transfer_time"]
        assert truth.kv_transfer_ns == kv and truth.buckets["other"] >= kv
    else:
        assert truth.kv_transfer_ns is None
