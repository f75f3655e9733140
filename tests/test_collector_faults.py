"""Storage faults: every acknowledged span is stored exactly once, across outages and restarts."""

from __future__ import annotations

import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import grpc
import httpx
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from bench.ingest.traces import make_request
from latscope.collector.mapping import decode_spans
from latscope.collector.spool import Spool
from latscope.storage import Store
from tests.collector_harness import (
    Collector,
    FlakyStore,
    count_spans,
    distinct_spans,
    start_collector,
    store_fixture,  # noqa: F401 (fixture)
)
from tests.serve_support import start_serve

pytestmark = pytest.mark.subprocess

T0 = 1_763_000_000_000_000_000


def _export(
    rng: random.Random, service: str, i: int
) -> trace_service_pb2.ExportTraceServiceRequest:
    req = make_request(rng, T0 + i * 1_000_000_000, service=service)
    # Both resources carry the test's service so counts are per test.
    for rs in req.resource_spans:
        rs.resource.attributes[0].value.string_value = service
    return req


def _send(c: Collector, service: str, n: int, seed: int = 0) -> int:
    """Send n Exports of 7 spans; returns how many were acknowledged."""
    rng = random.Random(seed)
    acked = 0
    with grpc.insecure_channel(c.grpc) as channel:
        stub = trace_service_pb2_grpc.TraceServiceStub(channel)
        for i in range(n):
            try:
                stub.Export(_export(rng, service, i), timeout=10)
                acked += 1
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
    return acked


def _wait_drained(c: Collector, timeout: float = 30) -> None:
    c.wait_stored(timeout)  # the spool replayed, and the journal inserted


def _spooled(directory: Path) -> list[Path]:
    """Batches waiting in a spool directory: journal segments, or Arrow batches."""
    return sorted([*directory.glob("*.otlp"), *directory.glob("*.arrow")])


def test_store_failing_mid_stream_loses_and_duplicates_nothing(
    store: Store, tmp_path: Path
) -> None:
    flaky = FlakyStore(store)
    flaky.fail_after = 2  # the third insert and everything after fail until the store is back
    c = start_collector(flaky, tmp_path / "spool", batch_max_spans=14)
    try:
        service = f"svc-{uuid.uuid4().hex[:12]}"
        assert _send(c, service, 20) == 20
        deadline = time.monotonic() + 10
        while not flaky.failures and time.monotonic() < deadline:
            time.sleep(0.02)  # inserts follow the acknowledgements
        assert flaky.failures >= 1 and len(c.collector.spans.spool) > 0
        flaky.down = False
        _wait_drained(c)
        assert count_spans(store, service) == 140
        assert distinct_spans(store, service) == 140
        metrics = httpx.get(f"{c.http}/metrics").text
        assert 'latscope_collector_dropped_total{signal="traces"} 0.0' in metrics
        assert 'latscope_collector_replayed_total{signal="traces"}' in metrics
    finally:
        c.stop()


def test_restart_replays_the_spool_exactly_once(store: Store, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    service = f"svc-{uuid.uuid4().hex[:12]}"
    down = FlakyStore(store)
    down.down = True
    first = start_collector(down, spool)
    assert _send(first, service, 10) == 10  # acknowledged from the spool alone
    first.stop()  # the store is still down: everything stays spooled
    files = _spooled(spool / "traces")
    assert files and count_spans(store, service) == 0
    backup = tmp_path / "backup"
    shutil.copytree(spool / "traces", backup)

    second = start_collector(store, spool)
    _wait_drained(second)
    second.stop()
    assert count_spans(store, service) == 70

    # A crash after the insert but before the file was removed replays the same batches again:
    # their original tokens make ClickHouse drop them. (A drained spool removed its folder.)
    (spool / "traces").mkdir(parents=True, exist_ok=True)
    for f in backup.iterdir():
        shutil.copy(f, spool / "traces" / f.name)
    third = start_collector(store, spool)
    _wait_drained(third)
    third.stop()
    assert count_spans(store, service) == 70


def test_a_torn_journal_record_is_left_out_and_the_rest_replayed(
    store: Store, tmp_path: Path
) -> None:
    # A crash in the middle of an append leaves a partial record at a segment's end; it was
    # never acknowledged (the fsync had not returned), so the replay skips it.
    spool = tmp_path / "spool"
    service = f"svc-{uuid.uuid4().hex[:12]}"
    down = FlakyStore(store)
    down.down = True
    first = start_collector(down, spool)
    assert _send(first, service, 4) == 4
    first.stop()
    segments = sorted((spool / "traces").glob("*.otlp"))
    assert segments
    with open(segments[-1], "ab") as f:
        f.write((5000).to_bytes(4, "little") + b"\x0a\x03abc")  # a length, then too few bytes
    second = start_collector(store, spool)
    _wait_drained(second)
    second.stop()
    assert count_spans(store, service) == 28
    assert not _spooled(spool / "traces")


def test_batches_spooled_by_the_previous_version_are_replayed(store: Store, tmp_path: Path) -> None:
    # Before the journal, a batch ClickHouse could not take was spooled as an Arrow file.
    service = f"svc-{uuid.uuid4().hex[:12]}"
    request = _export(random.Random(5), service, 0)
    table = decode_spans(request.SerializeToString()).table
    old = Spool(tmp_path / "spool" / "traces", 1 << 30)
    assert old.append(uuid.uuid4().hex, table)
    old.close()
    c = start_collector(store, tmp_path / "spool")
    try:
        _wait_drained(c)
        assert count_spans(store, service) == 7
    finally:
        c.stop()


def test_full_spool_refuses_instead_of_dropping(store: Store, tmp_path: Path) -> None:
    down = FlakyStore(store)
    down.down = True
    c = start_collector(down, tmp_path / "spool", spool_max_bytes=200_000)
    try:
        service = f"svc-{uuid.uuid4().hex[:12]}"
        acked = _send(c, service, 60)
        assert 0 < acked < 60  # some were refused with RESOURCE_EXHAUSTED, none dropped
        down.down = False
        _wait_drained(c)
        assert count_spans(store, service) == acked * 7
    finally:
        c.stop()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_collector_process_spools_while_clickhouse_is_down_and_serve_replays(
    tmp_path: Path,
) -> None:
    spool = tmp_path / "spool"
    cmd = [
        sys.executable, "-m", "latscope.cli", "collector",
        "--store", f"http://127.0.0.1:{_closed_port()}",
        "--spool-dir", str(spool),
        "--otlp-grpc", "127.0.0.1:0", "--http", "127.0.0.1:0",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    grpc_addr = None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "OTLP/gRPC" in line:
            grpc_addr = line.split()[-1]
            break
    assert grpc_addr, "".join(lines)
    service = f"svc-{uuid.uuid4().hex[:12]}"
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=grpc_addr, insecure=True, timeout=10))
    )
    tracer = provider.get_tracer("test")
    for i in range(12):
        with tracer.start_as_current_span(f"op-{i}"):
            pass
    provider.shutdown()
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0, output
    assert _spooled(spool / "traces"), output

    server = start_serve(tmp_path / "store", "--spool-dir", str(spool))
    deadline = time.monotonic() + 30
    while _spooled(spool / "traces") and time.monotonic() < deadline:
        time.sleep(0.1)
    server.stop()
    count = subprocess.run(
        [sys.executable, "-c", (
            "import sys; from latscope.storage import Store; "
            "s = Store.open(sys.argv[1]); "
            "print(s.query_rows('SELECT count(), uniqExact(SpanId) FROM otel_traces "
            "WHERE ServiceName = {s:String}', {'s': sys.argv[2]})[0])"
        ), f"chdb://{tmp_path / 'store'}", service],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert count.strip() == "(12, 12)"


def test_an_unexpected_insert_error_keeps_the_batch_and_keeps_serving(
    store: Store, tmp_path: Path
) -> None:
    # The Export was journaled (acknowledged) before the insert: a bug in the insert path
    # leaves the batch in the spool, retried after the backoff, and the next Exports go on.
    flaky = FlakyStore(store)
    flaky.bug = RuntimeError("bug in the insert path (test)")
    c = start_collector(flaky, tmp_path / "spool")
    try:
        service = f"svc-{uuid.uuid4().hex[:12]}"
        rng = random.Random(3)
        with grpc.insecure_channel(c.grpc) as channel:
            stub = trace_service_pb2_grpc.TraceServiceStub(channel)
            stub.Export(_export(rng, service, 0), timeout=10)
            deadline = time.monotonic() + 10
            while flaky.bug is not None and time.monotonic() < deadline:
                time.sleep(0.01)  # the insert hit the bug
            stub.Export(_export(rng, service, 1), timeout=10)
        _wait_drained(c)
        assert count_spans(store, service) == 14
        assert distinct_spans(store, service) == 14
    finally:
        c.stop()


def test_two_collectors_cannot_share_a_spool(store: Store, tmp_path: Path) -> None:
    c = start_collector(store, tmp_path / "spool")
    try:
        with pytest.raises(OSError, match="in use by another collector"):
            start_collector(store, tmp_path / "spool")
    finally:
        c.stop()
    start_collector(store, tmp_path / "spool").stop()  # free again once the first has stopped


def test_an_inserted_segment_stays_in_the_journal_until_clickhouse_synced_it(
    store: Store, tmp_path: Path
) -> None:
    # ClickHouse does not fsync new parts: an Export acknowledged, inserted and dropped from the
    # journal at once could be lost to a power failure. The segment stays until a sync.
    import threading

    spool = tmp_path / "spool"
    service = f"svc-{uuid.uuid4().hex[:12]}"
    flaky = FlakyStore(store)
    flaky.sync_gate = threading.Event()
    c = start_collector(flaky, spool)
    try:
        assert _send(c, service, 3) == 3
        deadline = time.monotonic() + 30
        while count_spans(store, service) < 21:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert flaky.sync_held.wait(30), "no sync after the insert"  # held at the gate
        assert _spooled(spool / "traces"), "the inserted segment was dropped before a sync"
        flaky.sync_gate.set()
        while _spooled(spool / "traces"):
            assert time.monotonic() < deadline, "the synced segment was not dropped"
            time.sleep(0.05)
        assert flaky.syncs >= 1
    finally:
        flaky.sync_gate.set()
        c.stop()
    assert count_spans(store, service) == 21


def test_while_an_insert_runs_the_open_segment_grows_into_one_insert(
    store: Store, tmp_path: Path
) -> None:
    # Closed at batch_timeout_s, a segment would only wait behind the insert that runs; it stays
    # open until that insert is done, so what arrived meanwhile goes in as one insert (fewer
    # parts for ClickHouse to merge). Every Export is still acknowledged once journaled.
    import threading

    service = f"svc-{uuid.uuid4().hex[:12]}"
    flaky = FlakyStore(store)
    flaky.gate = threading.Event()
    c = start_collector(flaky, tmp_path / "spool")
    writer = c.collector.spans
    try:
        first = threading.Thread(target=_send, args=(c, service, 1))
        first.start()  # a quiet collector inserts it at once, and the insert waits at the gate
        deadline = time.monotonic() + 30
        while not flaky.blocked:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        for seed in range(1, 5):
            assert _send(c, service, 1, seed=seed) == 1  # journaled, acknowledged
            # Each arrives after the open segment's timeout has passed.
            since = writer._segment_since
            while time.monotonic() < since + c.settings.batch_timeout_s:
                assert time.monotonic() < deadline
                time.sleep(0.01)
        assert len(_spooled(tmp_path / "spool" / "traces")) == 2  # the inserting one, the open
        flaky.gate.set()
        first.join(30)
        _wait_drained(c)
        # The first segment, then the other four Exports (and the resources' row before them).
        assert flaky.tables.count("otel_traces") == 2, flaky.tables
    finally:
        flaky.gate.set()
        c.stop()
    assert count_spans(store, service) == 5 * 7


def test_an_export_arriving_within_the_grace_is_no_quiet_collector(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # After journaling an Export with nothing else in flight, the journal thread waits
    # QUIET_GRACE_S for another before it inserts at once and acknowledges after the insert (a
    # quiet collector). Steady clients arrive a few ms apart: one arriving in the wait makes it
    # a busy collector's Export, acknowledged once journaled and inserted with what follows. A
    # client alone still reads what it sent once acknowledged. (The grace made long here.)
    import threading

    from latscope.collector import writer as journal

    monkeypatch.setattr(journal, "QUIET_GRACE_S", 2.0)
    service = f"svc-{uuid.uuid4().hex[:12]}"
    counting = FlakyStore(store)
    c = start_collector(counting, tmp_path / "spool")
    spans = c.collector.spans
    try:
        first = threading.Thread(target=_send, args=(c, service, 1))
        first.start()
        deadline = time.monotonic() + 30
        while not spans._in_grace:
            assert time.monotonic() < deadline, "no wait for another Export"
            time.sleep(0.005)
        with spans.arriving():  # another Export on its way
            arrived = time.monotonic()
            first.join(30)
            assert time.monotonic() - arrived < 1.0, "the arrival did not end the wait"
            assert counting.tables.count("otel_traces") == 0  # acknowledged once journaled
        _wait_drained(c)
        assert count_spans(store, service) == 7
        # Alone: the wait passes, the Export is inserted, then acknowledged.
        assert _send(c, service, 1, seed=1) == 1
        assert count_spans(store, service) == 14
    finally:
        c.stop()


def test_span_ingest_is_idle_only_once_every_acknowledged_span_is_stored(
    store: Store, tmp_path: Path
) -> None:
    """``Collector.spans_idle_s`` (the attributor's word on when ingest pauses, over the
    embedded store): 0 while acknowledged spans wait for ClickHouse, then the time since the
    last Export arrived."""
    flaky = FlakyStore(store)
    flaky.down = True
    c = start_collector(flaky, tmp_path / "spool")
    try:
        collector = c.collector
        assert _send(c, f"svc-{uuid.uuid4().hex[:12]}", 3) == 3  # spooled, not stored
        time.sleep(0.3)
        assert collector.spans_idle_s() == 0.0
        flaky.down = False
        _wait_drained(c)
        idle = collector.spans_idle_s()
        assert 0.3 <= idle <= collector.quiet_s()
    finally:
        c.stop()
