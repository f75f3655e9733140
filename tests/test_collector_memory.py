"""The collector's memory limit in bytes, through the real gRPC and HTTP servers: what Exports hold
(received, decoded, waiting for ClickHouse) stays under it, Exports beyond it are refused
RESOURCE_EXHAUSTED / 429 (before they are decoded where their size tells), and nothing refused
or acknowledged is lost. Peak RSS under load is bench/memory's to measure."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from latscope.collector import receiver
from latscope.collector.mapping import decode_spans, table_bytes
from latscope.collector.memory import MemoryLimit
from latscope.collector.writer import Refused
from latscope.storage import Store
from tests.collector_harness import (
    FlakyStore,
    count_spans,
    start_collector,
    store_fixture,  # noqa: F401 (fixture)
)

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
METRICS_EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
T0 = 1_763_000_000_000_000_000
PROTOBUF = {"content-type": "application/x-protobuf"}


def _export(
    service: str, spans: int, *, attr_bytes: int = 0, resource_bytes: int = 0, seed: int = 0
) -> ExportTraceServiceRequest:
    rng = random.Random(seed)
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.append(
        KeyValue(key="service.name", value=AnyValue(string_value=service))
    )
    for i in range(resource_bytes // 8192):
        text = rng.randbytes(4096).hex()
        rs.resource.attributes.append(KeyValue(key=f"r{i}", value=AnyValue(string_value=text)))
    ss = rs.scope_spans.add()
    for n in range(spans):
        span = ss.spans.add(
            trace_id=rng.randbytes(16), span_id=rng.randbytes(8), name="chat", kind=2,
            start_time_unix_nano=T0 + n, end_time_unix_nano=T0 + n + 1000,
        )  # fmt: skip
        if attr_bytes:
            text = rng.randbytes(attr_bytes // 2).hex()
            span.attributes.append(KeyValue(key="gen_ai.prompt", value=AnyValue(string_value=text)))
    return req


@pytest.mark.subprocess
def test_shared_resource_attributes_are_held_once_and_stored_on_every_span(
    store: Store, tmp_path: Path
) -> None:
    # One Export, 64 kB of resource attributes, 2,000 spans: copied per row that was 128 MB of
    # columns; held once it is the Export's own size, and ClickHouse stores it on every span.
    service = f"svc-{uuid.uuid4().hex[:12]}"
    req = _export(service, 2000, resource_bytes=64 * 1024)
    data = req.SerializeToString()
    for native in (True, False):
        decoded = decode_spans(data, native=native)
        assert decoded.rows == 2000
        assert decoded.nbytes < 2 * len(data) + 2000 * 200, (native, decoded.nbytes)
    c = start_collector(store, tmp_path / "spool")
    try:
        with grpc.insecure_channel(c.grpc) as channel:
            call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            call(data, timeout=30)
        c.wait_stored()
    finally:
        c.stop()
    expected = {kv.key: kv.value.string_value for kv in req.resource_spans[0].resource.attributes}
    rows = store.query_rows(
        "SELECT count(), uniqExact(ResourceAttributes), any(ResourceAttributes) "
        "FROM otel_traces WHERE ServiceName = {s:String}",
        {"s": service},
    )
    assert rows[0][0] == 2000 and rows[0][1] == 1
    assert dict(rows[0][2]) == expected


@pytest.mark.subprocess
def test_exports_beyond_the_memory_limit_are_refused_and_none_acknowledged_is_lost(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ClickHouse stalls; the queue of spans is large, the spool larger: only the memory limit
    # (4 MiB here) stops Exports of 200 spans x 2 kB from piling up decoded in memory.
    limit = 4 << 20
    slow = FlakyStore(store)
    slow.gate = threading.Event()
    c = start_collector(
        slow, tmp_path / "spool", memory_limit_bytes=limit, queue_max_spans=10_000_000,
        spool_max_bytes=1 << 30,
    )  # fmt: skip
    decoded: list[int] = []
    real_decode = receiver.decode_spans

    def counting_decode(data: bytes, *args: object, **kwargs: object) -> object:
        decoded.append(len(data))
        return real_decode(data, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(receiver, "decode_spans", counting_decode)
    service = f"svc-{uuid.uuid4().hex[:12]}"
    acked = refused = 0
    peak = 0
    first_done: list[object] = []
    try:
        with grpc.insecure_channel(c.grpc) as channel:
            call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            # A quiet collector acknowledges after the insert: the first Export waits for
            # ClickHouse (the gate); the ones behind it are journaled and held in memory.
            first_payload = _export(service, 200, attr_bytes=2048).SerializeToString()
            first = threading.Thread(
                target=lambda: first_done.append(call(first_payload, timeout=60))
            )
            # The insert held up counts its copy of the rows and their Arrow stream too.
            inserting = 2 * table_bytes(decode_spans(first_payload).table)
            first.start()
            while not slow.blocked:
                time.sleep(0.01)
            for seed in range(1, 12):
                payload = _export(service, 200, attr_bytes=2048, seed=seed).SerializeToString()
                try:
                    call(payload, timeout=30)
                    acked += 1
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                    assert "memory limit" in (exc.details() or "")
                    refused += 1
                peak = max(peak, c.collector.memory.held)
            assert acked >= 1 and refused >= 1, (acked, refused)
            assert peak <= limit + inserting
            # An Export larger than what is left is refused before it is decoded.
            before = len(decoded)
            big = _export(service, 1500, attr_bytes=2048, seed=99).SerializeToString()
            assert len(big) > c.collector.memory.available
            with pytest.raises(grpc.RpcError) as err:
                call(big, timeout=30)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert len(decoded) == before
            # OTLP/HTTP: a declared Content-Length that does not fit is refused unread.
            r = httpx.post(f"{c.http}/v1/traces", content=big, headers=PROTOBUF, timeout=30)
            assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
            assert len(decoded) == before
            metrics = httpx.get(f"{c.http}/metrics", timeout=10).text
            line = next(
                x for x in metrics.splitlines() if x.startswith("latscope_collector_memory_l")
            )
            assert float(line.split()[-1]) == limit
            assert 'latscope_collector_memory_refused_total{signal="traces"}' in metrics
            slow.gate.set()
            first.join(60)
        assert len(first_done) == 1
        c.wait_stored()
        assert count_spans(store, service) == 200 * (acked + 1)
        # Everything inserted: nothing is held any more.
        deadline = time.monotonic() + 10
        while c.collector.memory.held:
            assert time.monotonic() < deadline, c.collector.memory.held
            time.sleep(0.05)
    finally:
        slow.gate.set()
        c.stop()


@pytest.mark.subprocess
def test_one_export_larger_than_the_whole_limit_is_invalid_not_retried_forever(
    store: Store, tmp_path: Path
) -> None:
    # Its bytes alone exceed the limit: no retry can ever fit it. It is refused as
    # RESOURCE_EXHAUSTED like any other (the exporter retries, then drops it), and the collector
    # stays healthy for the Exports that fit.
    c = start_collector(store, tmp_path / "spool", memory_limit_bytes=256 * 1024)
    service = f"svc-{uuid.uuid4().hex[:12]}"
    try:
        with grpc.insecure_channel(c.grpc) as channel:
            call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            with pytest.raises(grpc.RpcError) as err:
                call(_export(service, 200, attr_bytes=2048).SerializeToString(), timeout=30)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            call(_export(service, 10, seed=1).SerializeToString(), timeout=30)
        c.wait_stored()
        assert count_spans(store, service) == 10
    finally:
        c.stop()


def test_a_grpc_export_that_does_not_fit_is_refused_before_its_message_is_read(
    store: Store, tmp_path: Path
) -> None:
    # An Export is counted as the largest recent one before it is read: with less than that
    # left, a call is refused before its message exists (the client has not sent it: the
    # answer comes first), a metrics Export too (counted as its parse, 1 MiB before any). Once
    # memory is free again, the same sender's Exports are stored.
    c = start_collector(store, tmp_path / "spool", memory_limit_bytes=8 << 20)
    service = f"svc-{uuid.uuid4().hex[:12]}"
    memory = c.collector.memory
    try:
        with grpc.insecure_channel(c.grpc) as channel:
            unary = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            recent = _export(service, 200, attr_bytes=2048).SerializeToString()  # ~420 kB
            unary(recent, timeout=30)
            small = _export(service, 10, seed=1).SerializeToString()
            assert len(small) < 2000
            c.wait_stored()
            # Less left than the recent Export, more than the small one.
            held = memory.available - len(recent) // 2
            assert memory.reserve(held)
            sent = threading.Event()
            release = threading.Event()

            def message_later() -> Iterator[bytes]:
                release.wait(30)
                sent.set()
                yield small

            for method in (EXPORT, METRICS_EXPORT):
                streaming = channel.stream_unary(
                    method, request_serializer=None, response_deserializer=None
                )
                with pytest.raises(grpc.RpcError) as err:
                    streaming(message_later(), timeout=20)
                assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, method
                assert "memory limit" in (err.value.details() or "")
                assert not sent.is_set()
            release.set()
            memory.release(held)
            unary(small, timeout=30)
        c.wait_stored()
        assert count_spans(store, service) == 210
    finally:
        release.set()
        c.stop()


def test_a_grpc_export_counted_before_it_is_read_is_then_counted_as_its_size() -> None:
    # The count before the read is the largest of the last 64 Exports (1 MiB before any), at
    # most an eighth of the limit; once read, the Export's own size replaces it, refused if
    # that does not fit.
    memory = MemoryLimit(800_000)
    ingest = receiver.Ingest(None, None, None, memory=memory)  # type: ignore[arg-type]
    with ingest.receiving("traces") as received:
        assert memory.held == 100_000  # 1 MiB, capped at an eighth
        received(3_000)
        assert memory.held == 3_000
    assert memory.held == 0
    for _ in range(64):
        ingest.export_sizes["traces"].add(2_000)
    with ingest.receiving("traces") as received:
        assert memory.held == 2_000
        received(60_000)  # bigger: counted in full, and the largest recent one
        assert memory.held == 60_000
        assert memory.reserve(700_000)
        with pytest.raises(Refused), ingest.receiving("traces"):
            pytest.fail("counted: 40,000 left, the estimate is 60,000")  # pragma: no cover
        memory.release(700_000)
        with ingest.receiving("traces"):
            assert memory.held == 120_000
    assert memory.held == 0
    with ingest.receiving("traces") as received:
        assert memory.reserve(730_000)
        with pytest.raises(Refused):
            received(80_000)  # read, 20,000 more than counted, 10,000 left
        memory.release(730_000)
    assert memory.held == 0


def test_decoded_rows_are_counted_as_the_arrow_buffers_they_hold() -> None:
    data = _export("svc", 300, attr_bytes=1024).SerializeToString()
    decoded = decode_spans(data)
    assert decoded.nbytes == table_bytes(decoded.table) > 300 * 1024
    # Shrunk to fit: no decoder buffer keeps the doubling's spare capacity.
    assert decoded.nbytes < 1.5 * len(data)


def test_a_segment_of_exports_with_different_resources_goes_in_as_one_insert(
    store: Store, tmp_path: Path
) -> None:
    # Each Export brings its own resource dictionary; a segment joins them (Arrow's own
    # combine_chunks cannot unify map dictionaries) and the rows keep their resources.
    import pyarrow as pa

    from latscope.collector.mapping import combine

    services = [f"svc-{uuid.uuid4().hex[:12]}" for _ in range(3)]
    tables = [decode_spans(_export(s, 5, seed=i).SerializeToString()).table for i, s in
              enumerate(services)]  # fmt: skip
    joined = combine(pa.concat_tables(tables))
    assert all(c.num_chunks == 1 for c in joined.columns)
    assert joined.column("ResourceAttributes").to_pylist() == [
        row for t in tables for row in t.column("ResourceAttributes").to_pylist()
    ]
    store.insert_arrow("otel_traces", joined)
    for s in services:
        got = store.query_rows(
            "SELECT count(), any(ResourceAttributes['service.name']) FROM otel_traces "
            "WHERE ServiceName = {s:String}",
            {"s": s},
        )[0]
        assert got == (5, s)
