"""Each engine's own traces, attributed by the rulebook (``latscope.attribution.rules``).

The shapes are ``tests/engine_traces.py``'s (built as each engine builds them, with the truth by
the engine's own figures). The reference engine's answer is held to that truth, and the SQL
attributor's to the reference's on every shape of every engine in the rulebook.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from mcp import Client as McpClient
from mcp.client.stdio import StdioServerParameters
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from latscope.attribution import rules
from latscope.attribution.engine import attribute_requests
from latscope.storage import Store
from tests.attribution_support import sql_check
from tests.engine_traces import ENGINE_BUILDERS, EngineTruth, StartupTruth, vllm_startup
from tests.serve_support import Server, start_serve
from tests.upstream_traces import MS, SECOND, T0, Built, Host, TraceBuilder, span_records

CLIENT, INTERNAL = Span.SPAN_KIND_CLIENT, Span.SPAN_KIND_INTERNAL

#: The shapes the rulebook reads: every shape built.
READ = [
    "trtllm",
    "trtllm-httpx-skew",
    "trtllm-no-client",
    "trtllm-disagg",
    "trtllm-disagg-openai-v2",
    "triton-tensorrtllm",
    "triton-ensemble",
    "triton-bls",
    "triton-vllm",
    "tgi-stream",
    "tgi-generate",
    "tgi-no-client",
    "vllm-detailed-all",
    "vllm-detailed-model",
    "vllm-stages-upstream",
    "vllm-stages-upstream-kv",
    "vllm-stages-vendor",
    "vllm-stages-vendor-wait",
    "triton-vllm-engine-trace",
    "dynamo-vllm",
    "dynamo-vllm-route",
    "dynamo-sglang",
    "dynamo-trtllm",
    "dynamo-vllm-disagg",
    "dynamo-trtllm-disagg",
    "vllm-startup",
]
BUILDERS: dict[str, Callable[[int], Built]] = dict(ENGINE_BUILDERS)


def _answers(built: Built, truth: EngineTruth):
    spans = span_records(built.resource_spans)[truth.trace_id]
    return attribute_requests(truth.trace_id, spans)


@pytest.mark.parametrize("label", READ)
@pytest.mark.parametrize("seed", range(4))
def test_each_engine_is_attributed_by_its_own_figures(label: str, seed: int) -> None:
    built = BUILDERS[label](seed)
    for truth in built.truths:
        (got,) = _answers(built, truth)
        assert got.request_id == truth.request_id, label
        assert got.buckets_ns == dict(truth.buckets), label
        assert got.e2e_ns == truth.e2e_ns, label
        assert got.attempts == truth.attempts, label
        assert got.kv_transfer_ns == truth.kv_transfer_ns, label
        assert got.ttft_server_ns == truth.server_ttft_ns, label
        assert got.output_tokens == truth.output_tokens, label
        assert got.input_tokens == truth.input_tokens, label


def _events(span) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for name, t in span.events:
        out.setdefault(name, []).append(t)
    return out


@pytest.mark.parametrize("backend", ["tensorrtllm", "bls", "vllm"])
@pytest.mark.parametrize("seed", range(3))
def test_triton_buckets_are_its_own_event_figures(backend: str, seed: int) -> None:
    """Triton's buckets read straight from its span events (src/tracer.cc's names): queue is
    the model's QUEUE_START -> COMPUTE_START; the TensorRT-LLM model's input (COMPUTE_START ->
    COMPUTE_INPUT_END) is preprocess, its output (COMPUTE_OUTPUT_START -> COMPUTE_END)
    postprocess, and its inference (COMPUTE_INPUT_END -> COMPUTE_OUTPUT_START) prefill up to the
    first INFER_RESPONSE_COMPLETE and decode after; the vLLM backend's hand-over compute is
    preprocess and its generation runs to the last response. The server's TTFT is the first
    response, from InferRequest's start."""
    built = BUILDERS[f"triton-{backend}" if backend != "bls" else "triton-bls"](seed)
    (truth,) = built.truths
    spans = span_records(built.resource_spans)[truth.trace_id]
    by_name = {s.name: s for s in spans}
    root, compute = by_name["InferRequest"], by_name["compute"]
    model = next(s for s in spans if s.span_id == compute.parent_span_id)
    assert model.attributes["triton.model_name"] == model.name
    c, m, r = _events(compute), _events(model), _events(root)
    first, last = min(r["INFER_RESPONSE_COMPLETE"]), max(r["INFER_RESPONSE_COMPLETE"])
    (got,) = attribute_requests(truth.trace_id, spans)
    assert got.buckets_ns["queue"] == c["COMPUTE_START"][0] - m["QUEUE_START"][0]
    assert got.ttft_server_ns == first - root.start_ns
    if backend == "vllm":
        assert got.buckets_ns["preprocess"] == c["COMPUTE_END"][0] - c["COMPUTE_START"][0]
        assert got.buckets_ns["prefill"] == first - c["COMPUTE_END"][0]
        assert got.buckets_ns["decode"] == last - first
        assert got.buckets_ns["postprocess"] == 0
    else:
        assert got.buckets_ns["preprocess"] == c["COMPUTE_INPUT_END"][0] - c["COMPUTE_START"][0]
        assert got.buckets_ns["postprocess"] == c["COMPUTE_END"][0] - c["COMPUTE_OUTPUT_START"][0]
        inference = c["COMPUTE_OUTPUT_START"][0] - c["COMPUTE_INPUT_END"][0]
        assert got.buckets_ns["prefill"] == first - c["COMPUTE_INPUT_END"][0]
        assert got.buckets_ns["prefill"] + got.buckets_ns["decode"] == inference
    assert got.attempts == 1


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2))
def test_sql_agrees_with_the_reference_on_every_engine(store: Store, seed: int) -> None:
    """One statement over a trace of every shape: the rendered SQL gives the reference's rows."""
    traces = {}
    for label, build in ENGINE_BUILDERS:
        built = build(seed)
        records = span_records(built.resource_spans)
        for i, trace_id in enumerate(sorted(records)):
            traces[f"{label}-{i}"] = records[trace_id]
    sql_check(store, traces)


# -- a user's rule file for an engine latscope never heard of ----------------------------------

FASTGEN_RULES = Path(__file__).parent / "rules" / "fastgen.toml"
FASTGEN = Host("fastgen-server")
APP = Host("fastgen-app")


def fastgen_request(seed: int) -> tuple[Built, dict[str, int]]:
    """An app's client span over fastgen's request span (INTERNAL, figures in ms, the first
    token as an event): the truth by fastgen's own figures."""
    rng = random.Random(seed)
    tb = TraceBuilder(rng)
    start = T0 + seed * SECOND
    lead, queue, prefill, decode, tail = (rng.randrange(1, 90) * MS for _ in range(5))
    leg = rng.randrange(1, 9) * MS
    s_lo = start + leg
    s_hi = s_lo + lead + queue + prefill + decode + tail
    client = tb.add(APP, ("app", "1"), "POST /generate", CLIENT, start, s_hi + leg)
    tb.add(
        FASTGEN,
        ("fastgen", "1"),
        "fastgen.request",
        INTERNAL,
        s_lo,
        s_hi,
        parent=client,
        attributes={
            "fastgen.queue_ms": (lead + queue) / MS,
            "fastgen.compute_ms": (prefill + decode) / MS,
        },
        events=[("first_token_sent", s_lo + lead + queue + prefill, {})],
    )
    truth = {
        "network": 2 * leg,
        "queue": lead + queue,
        "prefill": prefill,
        "decode": decode,
        "other": tail,
        "ttft_server": lead + queue + prefill,
        "e2e": s_hi + leg - start,
        "client": int(client.hex(), 16),
    }
    return Built(tb.resource_spans(), [], [tb.trace_hex]), truth


def test_a_user_rule_file_reads_an_unknown_engine_in_both_attributors(store: Store) -> None:
    book = rules.load([FASTGEN_RULES])
    assert book.engines[0].name == "fastgen"
    shipped = rules.active()
    rules.install(book)
    try:
        built, truth = fastgen_request(1)
        (trace_id,) = built.trace_ids
        spans = span_records(built.resource_spans)[trace_id]
        (got,) = attribute_requests(trace_id, spans)
        assert got.ttft_server_ns == truth["ttft_server"]
        assert got.e2e_ns == truth["e2e"]
        buckets = {b: v for b, v in got.buckets_ns.items() if v}
        assert buckets == {b: truth[b] for b in ("network", "queue", "prefill", "decode", "other")}
        sql_check(store, {trace_id: spans})
    finally:
        rules.install(shipped)
    assert attribute_requests(trace_id, spans) == [], "without the file: not an inference call"


# -- through latscope serve ---------------------------------------------------------------------


def _export(target: str, built: Built) -> None:
    request = trace_service_pb2.ExportTraceServiceRequest(resource_spans=built.resource_spans)
    with grpc.insecure_channel(target) as channel:
        reply = trace_service_pb2_grpc.TraceServiceStub(channel).Export(request, timeout=10)
    assert reply.partial_success.rejected_spans == 0, reply.partial_success.error_message


def _requests_over_rest(server: Server, trace_id: str) -> list[dict]:
    deadline = time.monotonic() + 60
    while True:
        response = httpx.get(server.url(f"/v1/traces/{trace_id}/requests"), timeout=10)
        if response.status_code == 200 and response.json()["requests"]:
            return response.json()["requests"]
        assert time.monotonic() < deadline, (response.status_code, response.text[:300])
        time.sleep(0.1)


def _stored_rows(server: Server, trace_ids: set[str]) -> dict[str, dict]:
    """The attribution table's rows of these traces (the SQL attributor's), once all are there."""
    deadline = time.monotonic() + 90
    window = {"since": "2025-11-01T00:00:00Z", "until": "2026-01-01T00:00:00Z", "limit": 1000}
    while True:
        response = httpx.get(server.url("/v1/requests"), params=window, timeout=10)
        assert response.status_code == 200, response.text[:300]
        rows = {r["trace_id"]: r for r in response.json()["requests"]}
        if trace_ids <= rows.keys():
            return rows
        assert time.monotonic() < deadline, sorted(trace_ids - rows.keys())
        time.sleep(0.2)


def _ms(ns: int | None) -> float | None:
    return None if ns is None else ns / 1e6


def _assert_startup_over_rest(server: Server, startup: StartupTruth) -> None:
    """The cold-start answer gives the replica's load time from its startup spans."""
    window = {"since": "2025-11-13T00:00:00Z", "until": "2025-11-15T00:00:00Z"}
    response = httpx.get(server.url("/v1/attribution/coldstart"), params=window, timeout=30)
    assert response.status_code == 200, response.text[:300]
    (replica,) = [r for r in response.json()["replicas"] if r["replica"] == startup.replica]
    assert replica["requests"] == 3
    loaded = replica["startup"]
    assert loaded["trace_id"] == startup.trace_id
    assert loaded["ready_ns"] == startup.ready_ns
    assert loaded["loading_ms"] == pytest.approx(startup.loading_ns / 1e6, abs=1e-6)
    assert loaded["load_model_ms"] == pytest.approx(startup.load_model_ns / 1e6, abs=1e-6)
    assert loaded["prepare_ms"] == pytest.approx(startup.prepare_ns / 1e6, abs=1e-6)


@pytest.mark.subprocess
def test_every_engine_and_a_user_engine_through_latscope_serve(tmp_path: Path) -> None:
    """``latscope serve --rules`` with a user's file: each engine's trace, sent over OTLP, is
    attributed by its own figures (buckets against the truth, e2e against the client)."""
    server = start_serve(tmp_path / "store", "--rules", str(FASTGEN_RULES))
    try:
        builds = [(label, BUILDERS[label](zlib.crc32(label.encode()) % 1000)) for label in READ]
        fastgen, fastgen_truth = fastgen_request(7)
        loading = vllm_startup(11)
        for _, built in builds:
            _export(server.grpc, built)
        _export(server.grpc, fastgen)
        _export(server.grpc, loading.built)
        for label, built in builds:
            for truth in built.truths:
                (got,) = _requests_over_rest(server, truth.trace_id)
                assert got["request_id"] == truth.request_id, label
                assert got["e2e_ms"] == pytest.approx(truth.e2e_ns / 1e6, abs=1e-6), label
                want = {b: _ms(v) for b, v in truth.buckets.items()}
                assert got["buckets_ms"] == pytest.approx(want, abs=1e-6), label
        stored = _stored_rows(
            server,
            {t.trace_id for _, b in builds for t in b.truths}
            | set(fastgen.trace_ids)
            | {t.trace_id for t in loading.built.truths},
        )
        for label, built in builds:
            for truth in built.truths:
                row = stored[truth.trace_id]
                want = {b: _ms(v) for b, v in truth.buckets.items()}
                assert row["buckets_ms"] == pytest.approx(want, abs=1e-6), label
        (got,) = _requests_over_rest(server, fastgen.trace_ids[0])
        assert stored[fastgen.trace_ids[0]]["buckets_ms"] == pytest.approx(got["buckets_ms"])
        assert got["e2e_ms"] == pytest.approx(fastgen_truth["e2e"] / 1e6, abs=1e-6)
        assert got["ttft_server_ms"] == pytest.approx(fastgen_truth["ttft_server"] / 1e6, abs=1e-6)
        for bucket in ("network", "queue", "prefill", "decode", "other"):
            assert got["buckets_ms"][bucket] == pytest.approx(fastgen_truth[bucket] / 1e6, abs=1e-6)
        _assert_startup_over_rest(server, loading.startup)
    finally:
        server.stop()


@pytest.mark.subprocess
@pytest.mark.parametrize("command", ["serve", "collector"])
def test_a_bad_rule_file_stops_serve_naming_the_line(tmp_path: Path, command: str) -> None:
    """Every command that attributes (serve, and the collector beside a ClickHouse server) puts
    the ``--rules`` files in force, so a bad one stops it before it binds a port."""
    bad = tmp_path / "bad.toml"
    bad.write_text(
        FASTGEN_RULES.read_text()
        .replace('bucket = "prefill"', 'bucket = "prefil"')
        .replace('unit = "ms" }\ncompute', 'unit = "msec" }\ncompute')
    )
    done = subprocess.run(
        [sys.executable, "-m", "latscope.cli", command, "--rules", str(bad), "--store",
         f"chdb://{tmp_path / 'store'}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    lines = {n + 1: line for n, line in enumerate(bad.read_text().splitlines())}
    problems = [line for line in done.stderr.splitlines() if line.startswith(str(bad))]
    assert len(problems) == 2, done.stderr
    unit, bucket = problems
    assert "unit 'msec' is not one of" in unit and "msec" in lines[int(unit.split(":")[1])]
    assert "did you mean 'prefill'" in bucket and "prefil" in lines[int(bucket.split(":")[1])]


def _mcp_explain(store_dir: Path, request_id: str, *rules_args: str) -> tuple[bool, Any]:
    """``explain_request`` over ``latscope mcp --store`` (stdio): (is_error, structured answer)."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "latscope.cli", "mcp", "--store", f"chdb://{store_dir}", *rules_args],
    )

    async def session() -> tuple[bool, Any]:
        async with McpClient(params) as client:
            result = await client.call_tool("explain_request", {"request_id": request_id})
            return bool(result.is_error), result.structured_content

    return asyncio.run(session())


@pytest.mark.subprocess
def test_mcp_takes_rules_like_serve(tmp_path: Path) -> None:
    """``latscope mcp --rules``: a bad file stops it naming the line; over a store, a request of
    an engine only a user's file names is explained by that file, as serve attributed it."""
    bad = tmp_path / "bad.toml"
    bad.write_text(FASTGEN_RULES.read_text().replace('bucket = "prefill"', 'bucket = "prefil"'))
    done = subprocess.run(
        [sys.executable, "-m", "latscope.cli", "mcp", "--store", f"chdb://{tmp_path / 'none'}",
         "--rules", str(bad)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"{bad}:" in done.stderr and "did you mean 'prefill'" in done.stderr
    store = tmp_path / "store"
    server = start_serve(store, "--rules", str(FASTGEN_RULES))
    try:
        built, truth = fastgen_request(3)
        _export(server.grpc, built)
        (served,) = _requests_over_rest(server, built.trace_ids[0])
    finally:
        server.stop()
    failed, answer = _mcp_explain(store, served["request_id"], "--rules", str(FASTGEN_RULES))
    assert not failed, answer
    assert answer["attribution"]["buckets_ms"] == pytest.approx(served["buckets_ms"])
    assert answer["attribution"]["ttft_server_ms"] == pytest.approx(truth["ttft_server"] / 1e6)
    failed, _ = _mcp_explain(store, served["request_id"])
    assert failed, "without the file the trace holds no inference call"
