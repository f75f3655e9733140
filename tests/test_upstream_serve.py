"""Every upstream-shaped trace and random agent run goes through the collector and is stored span
for span: over OTLP/gRPC into the in-process collector (exact rows in the embedded ClickHouse),
and into a real ``latscope serve`` process (read back over its REST API). Spans as older
ClickHouse exporters wrote them, and the exporter's JSON table layout, land in the store too.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from latscope.storage import Store
from tests.agent_traces import agent_run
from tests.collector_harness import (
    Collector,
    collector_fixture,  # noqa: F401 (fixture)
    store_fixture,  # noqa: F401 (fixture)
)
from tests.serve_support import Server, start_serve
from tests.upstream_traces import (
    BUILDERS,
    JSON_EXPORTER_TRACES_DDL,
    MS,
    OLD_EXPORTER_TRACES_DDL,
    Built,
    old_exporter_arrow,
    old_exporter_rows,
    sdk_request,
    span_records,
    vllm_v1_request,
)


def _export(target: str, built: Built) -> None:
    request = trace_service_pb2.ExportTraceServiceRequest(resource_spans=built.resource_spans)
    with grpc.insecure_channel(target) as channel:
        reply = trace_service_pb2_grpc.TraceServiceStub(channel).Export(request, timeout=10)
    assert reply.partial_success.rejected_spans == 0, reply.partial_success.error_message


_STORED = """
SELECT SpanId, ParentSpanId, SpanName, SpanKind, ServiceName, toUnixTimestamp64Nano(Timestamp),
       Duration, StatusCode, SpanAttributes, Events.Name, Links.SpanId
FROM otel_traces WHERE TraceId = {t:String} ORDER BY SpanId
"""


def _assert_stored(store: Store, built: Built) -> None:
    sent = {s.span_id.hex(): s for s in built.spans}
    records = span_records(built.resource_spans)
    for trace_id in built.trace_ids:
        rows = store.query_rows(_STORED, {"t": trace_id})
        want = {r.span_id: r for r in records[trace_id]}
        assert sorted(r[0] for r in rows) == sorted(want), trace_id
        for sid, parent, name, kind, service, start, dur, status, attrs, events, links in rows:
            w, s = want[sid], sent[sid]
            assert (parent, name, kind, service) == (w.parent_span_id, w.name, w.kind, w.service)
            assert (int(start), int(dur)) == (w.start_ns, w.duration_ns)
            assert status == w.status
            assert dict(attrs) == w.attributes
            assert list(events) == [e.name for e in s.events]
            assert list(links) == [ln.span_id.hex() for ln in s.links]


@pytest.mark.parametrize(("label", "build"), BUILDERS, ids=[b[0] for b in BUILDERS])
def test_builder_traces_are_stored_span_for_span(
    collector: Collector, store: Store, label: str, build: Callable[[int], Built]
) -> None:
    built = build(zlib.crc32(label.encode()))
    _export(collector.grpc, built)
    collector.wait_stored()
    _assert_stored(store, built)


def test_random_agent_runs_are_stored_span_for_span(collector: Collector, store: Store) -> None:
    runs = [agent_run(seed) for seed in range(12)]
    for run in runs:
        _export(collector.grpc, run.built)
    collector.wait_stored()
    for run in runs:
        _assert_stored(store, run.built)


def test_old_exporter_rows_land_in_the_spans_table(store: Store) -> None:
    # A table shared with an older Collector -> ClickHouse pipeline: enum-name kinds and codes.
    built = vllm_v1_request(41)
    store.insert_arrow("otel_traces", old_exporter_arrow(built.resource_spans))
    rows = store.query_rows(
        "SELECT SpanName, SpanKind, StatusCode, SpanAttributes['otel.scope.name'], ScopeName "
        "FROM otel_traces WHERE TraceId = {t:String} ORDER BY SpanName",
        {"t": built.trace_ids[0]},
    )
    assert rows == [
        ("POST /v1/chat/completions", "SPAN_KIND_CLIENT", "STATUS_CODE_UNSET", "latscope", ""),
        ("llm_request", "SPAN_KIND_SERVER", "STATUS_CODE_UNSET", "vllm.llm_engine", ""),
    ]


def test_old_and_json_exporter_layouts_create_and_take_rows(store: Store) -> None:
    built = sdk_request(43, retries=1)  # one attempt failed: a STATUS_CODE_ERROR span
    rows = old_exporter_rows(built.resource_spans)
    assert {r["StatusCode"] for r in rows} == {"STATUS_CODE_UNSET", "STATUS_CODE_ERROR"}
    old, js = "upstream_old_exporter_traces", "upstream_json_exporter_traces"
    try:
        store.command(OLD_EXPORTER_TRACES_DDL.format(table=old))
        store.command(JSON_EXPORTER_TRACES_DDL.format(table=js))
        client = store.client
        columns = list(rows[0])
        client.insert(old, [[r[c] for c in columns] for r in rows], column_names=columns)
        got = store.query_rows(f"SELECT SpanKind, count() FROM {old} GROUP BY SpanKind ORDER BY 1")
        assert got == [("SPAN_KIND_CLIENT", 1), ("SPAN_KIND_INTERNAL", 6), ("SPAN_KIND_SERVER", 2)]
        types = dict(
            store.query_rows(
                "SELECT name, type FROM system.columns WHERE table = {t:String} "
                "AND name IN ('SpanAttributes', 'ResourceAttributes')",
                {"t": js},
            )
        )
        assert types == {"SpanAttributes": "JSON", "ResourceAttributes": "JSON"}
    finally:
        store.command(f"DROP TABLE IF EXISTS {old}")
        store.command(f"DROP TABLE IF EXISTS {js}")


# -- a real latscope serve ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_serve(Path(tmp_path_factory.mktemp("upstream-serve")) / "store")
    try:
        yield server
    finally:
        server.stop()


def _spans_over_rest(server: Server, trace_id: str, count: int) -> list[dict]:
    deadline = time.monotonic() + 30
    while True:
        response = httpx.get(server.url(f"/v1/traces/{trace_id}/spans"), timeout=10)
        if response.status_code == 200 and len(response.json()["spans"]) == count:
            return response.json()["spans"]
        assert time.monotonic() < deadline, (response.status_code, response.text[:300])
        time.sleep(0.1)


@pytest.mark.subprocess
def test_upstream_shapes_and_agent_runs_through_latscope_serve(serve: Server) -> None:
    # Seeds differ per builder: the same seed through two builders that draw alike would repeat
    # the trace and span ids.
    builds = [build(zlib.crc32(label.encode()) + 1) for label, build in BUILDERS]
    builds += [agent_run(seed).built for seed in (101, 102, 103)]
    trace_ids = [t for b in builds for t in b.trace_ids]
    assert len(set(trace_ids)) == len(trace_ids)
    for built in builds:
        _export(serve.grpc, built)
    for built in builds:
        records = span_records(built.resource_spans)
        for trace_id in built.trace_ids:
            want = {r.span_id: r for r in records[trace_id]}
            got = {s["span_id"]: s for s in _spans_over_rest(serve, trace_id, len(want))}
            assert set(got) == set(want)
            for sid, span in got.items():
                w = want[sid]
                assert (span["parent_span_id"], span["name"], span["kind"]) == (
                    w.parent_span_id,
                    w.name,
                    w.kind,
                )
                assert span["duration_ms"] == pytest.approx(w.duration_ns / MS, abs=1e-6)
                assert span["attributes"] == w.attributes
