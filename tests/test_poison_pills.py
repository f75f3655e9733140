"""No poison pill: what one client sends can neither stop attribution nor fail an answer for a
trace (issue 44). Values beyond any sensible range, cycles in the parent links and chains deeper
than Python's stack go through the real server and both attribution paths."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from latscope.attribution.engine import attribute_requests
from latscope.attribution.model import SpanRecord
from latscope.attribution.runs import explain_run
from latscope.semconv import SpanKind, VllmAttributes
from latscope.storage import Store
from tests.attribution_support import sql_check
from tests.serve_support import Server, metric, store_sql

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
MS = 1_000_000
#: Values a client can write where the rules read a number: past every range a figure can have.
EXTREMES = ("1e308", "-1e308", "1e999", "-1e999", "9" * 40, "-" + "9" * 40, "1e-320", "0")


def _value(v: float | int | str) -> common_pb2.AnyValue:
    if isinstance(v, float):
        return common_pb2.AnyValue(double_value=v)
    if isinstance(v, int):
        return common_pb2.AnyValue(int_value=v)
    return common_pb2.AnyValue(string_value=v)


def _span(
    trace_id: bytes,
    span_id: bytes,
    parent: bytes = b"",
    *,
    name: str = "op",
    kind: int = trace_pb2.Span.SPAN_KIND_INTERNAL,
    start: int,
    duration: int = 100 * MS,
    attrs: Sequence[tuple[str, float | int | str]] = (),
) -> trace_pb2.Span:
    return trace_pb2.Span(
        trace_id=trace_id, span_id=span_id, parent_span_id=parent, name=name, kind=kind,
        start_time_unix_nano=start, end_time_unix_nano=start + duration,
        attributes=[common_pb2.KeyValue(key=k, value=_value(v)) for k, v in attrs],
    )  # fmt: skip


def _send(server: Server, spans: list[trace_pb2.Span], service: str = "poison") -> None:
    request = trace_service_pb2.ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.add(key="service.name", value=_value(service))
    rs.scope_spans.add().spans.extend(spans)
    with grpc.insecure_channel(server.grpc) as channel:
        call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        call(request.SerializeToString(), timeout=30)


def _vllm_trace(trace_id: bytes, start: int, ttft: float | str) -> list[trace_pb2.Span]:
    """One vLLM ``llm_request`` span (no client) with its latency figures."""
    figures = [
        (VllmAttributes.TIME_TO_FIRST_TOKEN, ttft),
        (VllmAttributes.E2E, 0.3),
        (VllmAttributes.TIME_IN_QUEUE, ttft),
        (VllmAttributes.TIME_IN_MODEL_DECODE, ttft),
    ]
    server = trace_pb2.Span.SPAN_KIND_SERVER
    return [
        _span(
            trace_id,
            os.urandom(8),
            name="llm_request",
            kind=server,
            start=start,
            duration=300 * MS,
            attrs=figures,
        )
    ]


def _record(span_id: str, parent: str, start_ms: int, end_ms: int, **attrs: str) -> SpanRecord:
    return SpanRecord(
        span_id=span_id, parent_span_id=parent, name=span_id, kind=SpanKind.SERVER,
        service="svc", start_ns=start_ms * MS, duration_ns=(end_ms - start_ms) * MS,
        attributes=dict(attrs),
    )  # fmt: skip


@pytest.mark.parametrize("value", EXTREMES)
def test_extreme_figures_attribute_alike_in_both_paths(store: Store, value: str) -> None:
    # Each latency figure and GPU-free value the rules read, at a value no figure can have:
    # both paths answer (the reference engine without OverflowError, the SQL without
    # CANNOT_CONVERT_TYPE) and answer the same.
    keys = [
        VllmAttributes.TIME_IN_QUEUE, VllmAttributes.TIME_TO_FIRST_TOKEN,
        VllmAttributes.TIME_IN_MODEL_PREFILL, VllmAttributes.TIME_IN_MODEL_DECODE,
        VllmAttributes.E2E, "gen_ai.usage.prompt_tokens", "gen_ai.usage.completion_tokens",
    ]  # fmt: skip
    spans = [_record("00000000000000a1", "", 0, 300, **dict.fromkeys(keys, value))]
    got = sql_check(store, {"extreme": spans})["extreme"]
    assert len(got) == 1 and sum(v or 0 for v in got[0].buckets_ns.values()) == 300 * MS


def test_a_cycle_or_a_deep_chain_is_walked_without_recursion() -> None:
    self_parent = [_record("0000000000000001", "0000000000000001", 0, 100)]
    two = [
        _record("0000000000000001", "0000000000000002", 0, 100),
        _record("0000000000000002", "0000000000000001", 10, 90),
    ]
    three = [
        _record("0000000000000001", "0000000000000003", 0, 100),
        _record("0000000000000002", "0000000000000001", 10, 90),
        _record("0000000000000003", "0000000000000002", 20, 80),
    ]
    for spans in (self_parent, two, three):
        run = explain_run("t", spans)
        assert run is not None and run.cycles, spans
        assert run.app_ns + run.tool_ns + sum(run.llm_ns.values()) == run.e2e_ns
        attribute_requests("t", spans)
    # Far deeper than Python's recursion limit, each span inside its parent.
    deep = [
        _record(f"{i + 1:016x}", f"{i:016x}" if i else "", i, 100_000 - i) for i in range(20_000)
    ]
    run = explain_run("t", deep)
    assert run is not None and not run.cycles and run.app_ns == run.e2e_ns


@pytest.mark.subprocess
def test_a_poison_figure_neither_stops_attribution_nor_fails_a_route(serve: Server) -> None:
    # A TTFT of 1e308 once failed every attribution pass that read it, for good, and the
    # per-request routes with a 500; the traces around it were never attributed.
    now = time.time_ns()
    poison, good = os.urandom(16), os.urandom(16)
    before = metric(serve, "latscope_attributed_requests_total")
    _send(serve, _vllm_trace(poison, now - 2_000 * MS, 1e308) + _vllm_trace(good, now, 0.05))
    for trace_id in (poison, good):
        r = httpx.get(serve.url(f"/v1/requests/{trace_id.hex()}/attribution"), timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["e2e_ms"] == 300.0
    deadline = time.monotonic() + 60
    while metric(serve, "latscope_attributed_requests_total") < before + 2:
        assert time.monotonic() < deadline, "the attributor stopped at the poison figure"
        time.sleep(0.2)
    assert "CANNOT_CONVERT_TYPE" not in serve.text()
    set_aside = httpx.get(serve.url("/v1/attribution/set-aside"), timeout=30)
    assert set_aside.status_code == 200 and set_aside.json() == {"traces": []}


@pytest.mark.subprocess
def test_cycles_in_a_trace_are_answered_with_the_cycle_named(serve: Server) -> None:
    now = time.time_ns() - 1_000 * MS
    a, b, c = os.urandom(8), os.urandom(8), os.urandom(8)
    traces = {
        "self": (os.urandom(16), [(a, a)]),
        "two": (os.urandom(16), [(a, b), (b, a)]),
        "three": (os.urandom(16), [(a, c), (b, a), (c, b)]),
    }
    for trace_id, links in traces.values():
        _send(serve, [
            _span(trace_id, span_id, parent, start=now + i * MS, duration=(50 - 2 * i) * MS,
                  kind=trace_pb2.Span.SPAN_KIND_SERVER)
            for i, (span_id, parent) in enumerate(links)
        ])  # fmt: skip
    for name, (trace_id, links) in traces.items():
        for route in ("/run", "", "/spans", "/requests"):
            r = httpx.get(serve.url(f"/v1/traces/{trace_id.hex()}{route}"), timeout=30)
            assert r.status_code == 200, (name, route, r.text[:300])
        run = httpx.get(serve.url(f"/v1/traces/{trace_id.hex()}/run"), timeout=30).json()
        assert run["cycles"], (name, run)
        spans = httpx.get(serve.url(f"/v1/traces/{trace_id.hex()}"), timeout=30).json()["spans"]
        assert len(spans) == len(links) and max(s["depth"] for s in spans) < len(links)


class _Killed(BaseException):
    """The process dies here (kill -9): nothing after it runs."""


class _DiesBeforeTombstones:
    """The store, but the attributor's process is killed as it is about to write tombstones."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def command(self, sql: str, parameters: dict | None = None) -> object:
        if "IsDeleted, SpansIngestedAt)" in sql:
            raise _Killed
        return self._store.command(sql, parameters)


def test_a_kill_between_a_moved_row_and_its_tombstone_leaves_one_live_row(store: Store) -> None:
    from latscope.attribution.attributor import Attributor
    from latscope.storage import SPANS_TABLE
    from tests.attribution_support import T0, server_spans, span_rows

    trace_id = os.urandom(16).hex()
    store.insert_arrow(SPANS_TABLE, span_rows(trace_id, server_spans()))
    Attributor(store, settle_s=0).run_until_idle()  # a row keyed by the server span
    time.sleep(0.01)
    # The client span arrives late: the request's key moves to it (another start, another hour).
    client = {"id": "c1" * 8, "kind": "Client", "start": T0 - 3_600_000 * MS, "end": T0 + 2000 * MS}
    store.insert_arrow(SPANS_TABLE, span_rows(trace_id, [client]))
    with pytest.raises(_Killed):
        Attributor(_DiesBeforeTombstones(store), settle_s=0).run_until_idle()  # type: ignore[arg-type]
    live = "SELECT RequestSpanId FROM latscope_attribution FINAL WHERE TraceId = {t:String}"
    assert len(store.query_rows(live, {"t": trace_id})) == 2  # killed between the two
    Attributor(store, settle_s=0).run_until_idle()  # the restarted process
    assert store.query_rows(live, {"t": trace_id}) == [("c1" * 8,)]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _live_rows(server: Server) -> dict[str, int]:
    """Trace id -> live attribution rows (after FINAL), from the API's Parquet export."""
    import io

    import pyarrow.parquet as pq

    r = httpx.get(server.url("/v1/export/requests"), params={"since": "2d"}, timeout=60)
    r.raise_for_status()
    counts: dict[str, int] = {}
    for trace_id in pq.read_table(io.BytesIO(r.content)).column("TraceId").to_pylist():
        counts[trace_id] = counts.get(trace_id, 0) + 1
    return counts


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.timeout(600)
def test_repeated_kills_while_client_spans_arrive_late_leave_one_live_row_per_call(
    tmp_path: Path,
) -> None:
    # Each call's server span is sent first and its client span 0.5-4 s later (a client exporting
    # later than its server, as in production), so the attributor often writes a row keyed by
    # the server span and must then move it to the client's key. latscope serve is killed -9
    # every few seconds meanwhile; every call must end with exactly one live row.
    import random
    import signal
    import threading

    from tests.serve_support import serve_temp_dir, start_serve

    rng = random.Random(44)
    ports = ("--otlp-grpc", f"127.0.0.1:{_free_port()}", "--http", f"127.0.0.1:{_free_port()}")
    args = (*ports, "--attribution-settle-s", "0.5", "--attribution-poll-s", "0.2")
    server = start_serve(tmp_path / "store", *args)
    halt = threading.Event()
    sent: list[str] = []
    pending: list[tuple[float, list[trace_pb2.Span]]] = []

    def export(spans: list[trace_pb2.Span]) -> None:
        request = trace_service_pb2.ExportTraceServiceRequest()
        rs = request.resource_spans.add()
        rs.resource.attributes.add(key="service.name", value=_value("kill-test"))
        rs.scope_spans.add().spans.extend(spans)
        while True:  # until acknowledged: the server may be down or starting
            try:
                with grpc.insecure_channel(ports[1]) as channel:
                    call = channel.unary_unary(
                        EXPORT, request_serializer=None, response_deserializer=None
                    )
                    call(request.SerializeToString(), timeout=10)
                return
            except grpc.RpcError:
                time.sleep(0.2)

    def sender() -> None:
        while not halt.is_set() or pending:
            now = time.time_ns()
            due = [spans for at, spans in pending if at <= time.monotonic()]
            pending[:] = [(at, spans) for at, spans in pending if at > time.monotonic()]
            if not halt.is_set():
                trace_id, client, server_id = os.urandom(16), os.urandom(8), os.urandom(8)
                start = now - 500 * MS
                client_span = _span(
                    trace_id, client, name="chat", kind=trace_pb2.Span.SPAN_KIND_CLIENT,
                    start=start, duration=400 * MS,
                )  # fmt: skip
                server_span = _span(
                    trace_id, server_id, client, name="generate",
                    kind=trace_pb2.Span.SPAN_KIND_SERVER, start=start + 20 * MS,
                    duration=300 * MS, attrs=[("gen_ai.request.model", "m")],
                )  # fmt: skip
                due.append([server_span])
                pending.append((time.monotonic() + rng.uniform(0.5, 4.0), [client_span]))
                sent.append(trace_id.hex())
            for spans in due:
                export(spans)
            time.sleep(0.02)

    thread = threading.Thread(target=sender)
    thread.start()
    try:
        # Five kills at least, and on until 60 calls were sent (a loaded machine sends slower:
        # each restart holds the sender's Exports back until serve answers again).
        kills, until = 0, time.monotonic() + 240
        while kills < 5 or (len(sent) <= 60 and time.monotonic() < until):
            time.sleep(rng.uniform(2.0, 4.0))
            server.stop(signal.SIGKILL)
            server = start_serve(tmp_path / "store", *args)
            kills += 1
        time.sleep(2)
    finally:
        halt.set()
        thread.join(120)
    try:
        deadline = time.monotonic() + 90
        while True:
            counts = _live_rows(server)
            twice = {t: n for t, n in counts.items() if n > 1}
            missing = [t for t in sent if t not in counts]
            if not twice and not missing:
                break
            assert time.monotonic() < deadline, (len(sent), len(missing), twice)
            time.sleep(1)
    finally:
        server.stop()
    assert len(sent) > 60
    # Killed mid-insert five times and more, serve left no file in its temporary directory.
    assert not list(serve_temp_dir(tmp_path / "store").iterdir())


@pytest.mark.subprocess
def test_garbage_to_grpc_methods_is_invalid_argument_logged_once_a_minute(serve: Server) -> None:
    methods = [
        "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
        "/latscope.v1.QueryService/GetAttribution",
        "/latscope.v1.QueryService/ListRequests",
        "/latscope.v1.QueryService/GetRun",
        "/latscope.v1.QueryService/Summary",
    ]
    garbage = b"\xff\xff\xff\xff\x0f"  # a field number past the largest protobuf allows
    with grpc.insecure_channel(serve.grpc) as channel:
        for method in methods:
            call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
            for _ in range(20):
                with pytest.raises(grpc.RpcError) as info:
                    call(garbage, timeout=10)
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, info.value)
                assert "not a valid message" in info.value.details()
        # Watch streams its answers; its garbage is refused the same way.
        watch = channel.unary_stream(
            "/latscope.v1.QueryService/Watch", request_serializer=None, response_deserializer=None
        )
        with pytest.raises(grpc.RpcError) as info:
            list(watch(garbage, timeout=10))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    deadline = time.monotonic() + 10
    while sum("malformed gRPC request" in line for line in serve.output) < len(methods) + 1:
        assert time.monotonic() < deadline, serve.text()[-2000:]
        time.sleep(0.1)
    lines = [line for line in serve.output if "malformed gRPC request" in line]
    assert len(lines) == len(methods) + 1, lines  # one per method and cause, Watch's included
    assert "Traceback" not in serve.text() and "Exception deserializing" not in serve.text()


def _big_export(size: int) -> bytes:
    """A valid Export of about ``size`` bytes: spans of 60 kB attribute values."""
    trace_id, now = os.urandom(16), time.time_ns()
    spans = [
        _span(
            trace_id,
            os.urandom(8),
            start=now - 10**9,
            attrs=[(f"k{j}", "x" * 60_000) for j in range(16)],
        )
        for _ in range(max(1, size // 960_000))
    ]
    request = trace_service_pb2.ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.add(key="service.name", value=_value("big"))
    rs.scope_spans.add().spans.extend(spans)
    return request.SerializeToString()


@pytest.mark.subprocess
def test_peers_without_the_token_cannot_starve_authenticated_ingest(tmp_path: Path) -> None:
    # 24 connections without the token each send the headers of a 15 MB body and 3 MB of it,
    # then hold: the body once counted against the memory limit (64 MiB here) as it arrived, and
    # authenticated Exports were refused over HTTP and gRPC alike. The token is checked first.
    import socket

    from tests.serve_support import start_serve

    (tmp_path / "token").write_text("s3cret-token\n")
    server = start_serve(
        tmp_path / "store", "--token-file", str(tmp_path / "token"),
        "--memory-limit-bytes", str(64 << 20), "--attributor", "off",
        "--http-body-timeout-s", "3",
    )  # fmt: skip
    host, port = server.http.removeprefix("http://").split(":")
    held = []
    try:
        for _ in range(24):
            sock = socket.create_connection((host, int(port)), timeout=10)
            sock.sendall(
                b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                b"Content-Length: 15000000\r\n\r\n"
            )
            # (answered and closed before all of it went: what is wanted)
            with contextlib.suppress(OSError):
                sock.sendall(b"\0" * (3 << 20))
            held.append(sock)
        for sock in held:
            answer = sock.recv(4096)
            assert answer.startswith(b"HTTP/1.1 401"), answer[:100]
        payload = _big_export(5 << 20)
        auth = {"authorization": "Bearer s3cret-token"}
        for _ in range(5):
            r = httpx.post(
                server.url("/v1/traces"), content=payload, timeout=30,
                headers={**auth, "content-type": "application/x-protobuf"},
            )  # fmt: skip
            assert r.status_code == 200, r.text
            with grpc.insecure_channel(server.grpc, options=[
                ("grpc.max_send_message_length", 16 << 20)
            ]) as channel:  # fmt: skip
                call = channel.unary_unary(
                    EXPORT, request_serializer=None, response_deserializer=None
                )
                call(payload, timeout=30, metadata=(("authorization", "Bearer s3cret-token"),))
        # An authenticated body that stops coming gives back what it holds after the timeout.
        sock = socket.create_connection((host, int(port)), timeout=30)
        sock.sendall(
            b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret-token\r\n"
            b"Content-Type: application/x-protobuf\r\nContent-Length: 15000000\r\n\r\n"
            + b"\0"
            * (1 << 20)
        )
        assert sock.recv(4096).startswith(b"HTTP/1.1 408")
        sock.close()
        assert metric(server, "latscope_collector_memory_bytes") < (1 << 20)
    finally:
        for sock in held:
            sock.close()
        server.stop()


def _export_of(spans: list[trace_pb2.Span], service: str) -> bytes:
    request = trace_service_pb2.ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.add(key="service.name", value=_value(service))
    rs.scope_spans.add().spans.extend(spans)
    return request.SerializeToString()


@pytest.mark.subprocess
def test_spans_outside_the_time_window_are_rejected_at_the_door(tmp_path: Path) -> None:
    from tests.serve_support import start_serve

    server = start_serve(
        tmp_path / "store", "--attributor", "off",
        env={"LATSCOPE_MAX_SPAN_AGE_S": str(7 * 86400), "LATSCOPE_MAX_SPAN_FUTURE_S": "3600"},
    )  # fmt: skip
    now, day = time.time_ns(), 86_400 * 10**9
    trace_id = os.urandom(16)
    spans = [
        _span(trace_id, os.urandom(8), start=now - 8 * day),  # too old
        _span(trace_id, os.urandom(8), start=946_684_800 * 10**9),  # the year 2000
        _span(trace_id, os.urandom(8), start=now + 2 * 3600 * 10**9),  # ahead of the clock
        _span(trace_id, os.urandom(8), start=now - 6 * day),
        _span(trace_id, os.urandom(8), start=now),
    ]
    try:
        with grpc.insecure_channel(server.grpc) as channel:
            call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            answer = trace_service_pb2.ExportTraceServiceResponse.FromString(
                call(_export_of(spans, "window"), timeout=30)
            )
        assert answer.partial_success.rejected_spans == 3
        assert "--max-span-age-s" in answer.partial_success.error_message
        stored = httpx.get(server.url(f"/v1/traces/{trace_id.hex()}/spans"), timeout=30).json()
        assert len(stored["spans"]) == 2
    finally:
        server.stop()


@pytest.mark.subprocess
def test_rows_clickhouse_refuses_take_no_other_senders_spans_with_them(tmp_path: Path) -> None:
    # One sender's 150 spans, each on another day since 2000 (past ClickHouse's 100 partitions in
    # one insert), and a span a CHECK on the table refuses, journaled in the same segments as
    # 2,900 spans of other senders. Every span that can be stored is; the refused one is kept
    # in the quarantine with the reason and stored by a replay once the CHECK is gone.
    import subprocess
    import sys
    import threading

    from tests.serve_support import start_serve

    store_dir = tmp_path / "store"
    check = "ALTER TABLE otel_traces ADD CONSTRAINT no_poison CHECK SpanName != 'poison'"
    store_sql(store_dir, check, "SELECT 1")
    server = start_serve(store_dir, "--attributor", "off", "--batch-timeout-s", "1")
    day = 86_400 * 10**9
    days = [
        _span(os.urandom(16), os.urandom(8), start=946_684_800 * 10**9 + i * day, name="old")
        for i in range(150)
    ]
    poison = [_span(os.urandom(16), os.urandom(8), start=time.time_ns(), name="poison")]

    def others(i: int) -> None:
        with grpc.insecure_channel(server.grpc) as channel:
            call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            for _ in range(29):
                spans = [
                    _span(os.urandom(16), os.urandom(8), start=time.time_ns()) for _ in range(10)
                ]
                call(_export_of(spans, f"other-{i}"), timeout=30)

    try:
        threads = [threading.Thread(target=others, args=(i,)) for i in range(10)]
        for t in threads:
            t.start()
        with grpc.insecure_channel(server.grpc) as channel:
            call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            call(_export_of(days, "days"), timeout=30)
            call(_export_of(poison, "poison"), timeout=30)
        for t in threads:
            t.join(60)
        deadline = time.monotonic() + 60
        while metric(server, 'latscope_collector_quarantined_total{signal="traces"}') < 1:
            assert time.monotonic() < deadline, server.text()[-3000:]
            time.sleep(0.2)
        assert metric(server, 'latscope_collector_dropped_total{signal="traces"}') == 0
    finally:
        server.stop()
    counts = dict(
        store_sql(store_dir, "SELECT ServiceName, count() FROM otel_traces GROUP BY ServiceName")
    )
    assert counts.pop("days") == 150 and "poison" not in counts
    assert counts == {f"other-{i}": 290 for i in range(10)}
    spool = f"{store_dir}-spool"
    listing = subprocess.run(
        [sys.executable, "-m", "latscope.cli", "quarantine", "list", "--spool-dir", spool],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert "1 row(s) in 1 file(s)" in listing and "VIOLATED_CONSTRAINT" in listing, listing
    store_sql(store_dir, "ALTER TABLE otel_traces DROP CONSTRAINT no_poison", "SELECT 1")
    subprocess.run(
        [sys.executable, "-m", "latscope.cli", "quarantine", "replay", "--spool-dir", spool,
         "--store", f"chdb://{store_dir}"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert store_sql(store_dir, "SELECT count() FROM otel_traces WHERE SpanName = 'poison'") == [
        [1]
    ]


def test_a_trace_attribution_fails_on_is_set_aside_and_the_others_go_on(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A value in the store that makes the attribution statement fail: token figures holding
    # infinity, which another writer can store (latscope's collector computes them itself).
    # The traces around it are attributed; it is set aside, counted, listed, and retried.
    import math

    import pyarrow as pa

    from latscope.attribution import setaside
    from latscope.attribution.attributor import Attributor
    from latscope.storage import SPANS_TABLE
    from tests.attribution_support import spans_table, stalls_call, write_resources

    ids = [os.urandom(16).hex() for _ in range(5)]
    poison = ids[2]
    table = spans_table(dict.fromkeys(ids, stalls_call()))
    figures = table.column("LatscopeTokenFigures").to_pylist()
    rows = table.column("TraceId").to_pylist()
    figures = [
        [math.inf] * len(f) if t == poison and f else f for t, f in zip(rows, figures, strict=True)
    ]
    index = table.schema.get_field_index("LatscopeTokenFigures")
    table = table.set_column(
        index, "LatscopeTokenFigures", pa.array(figures, table.schema.field(index).type)
    )
    write_resources(store, table)
    store.insert_arrow(SPANS_TABLE, table)
    att = Attributor(store, settle_s=0)
    att.run_until_idle()
    attributed = (
        "SELECT DISTINCT TraceId FROM latscope_attribution FINAL "
        "WHERE has({t:Array(String)}, TraceId)"
    )
    assert {t for (t,) in store.query_rows(attributed, {"t": ids})} == set(ids) - {poison}
    assert list(att.set_aside) == [poison]
    assert "CANNOT_CONVERT_TYPE" in att.set_aside[poison].error
    # Mended (here: the figures dropped, so they are computed from the offsets): the retry after
    # the backoff attributes it.
    store.command(
        "ALTER TABLE otel_traces UPDATE LatscopeTokenFigures = [] WHERE TraceId = {t:String} "
        "SETTINGS mutations_sync = 1",
        {"t": poison},
    )
    monkeypatch.setattr(setaside, "RETRY_FIRST_S", 0.0)
    att.set_aside[poison] = att.set_aside[poison]._replace(retry_at=0.0)
    time.sleep(0.01)
    att.run_until_idle()
    assert not att.set_aside
    assert {t for (t,) in store.query_rows(attributed, {"t": ids})} == set(ids)


@pytest.mark.slow
@pytest.mark.subprocess
def test_sigterm_under_load_answers_every_export_as_a_sender_retries(
    tmp_path: Path,
) -> None:
    # 8 gRPC and 2 HTTP senders that retry as OTLP exporters do (UNAVAILABLE / 503: back off
    # about a second). At SIGTERM each Export gets an answer: OK, or UNAVAILABLE / 503; no HTTP
    # connection closes without an answer. gRPC's own shutdown cancels a call it has received but
    # not yet handed to a handler at the instant it stops (CANCELLED, which OTLP exporters retry
    # too): serve stops it only once senders have gone quiet, so under load that is at most the
    # odd call of a round (without the wait, the calls of the senders' retries).
    import random
    import signal
    import threading
    from collections import Counter

    from tests.serve_support import start_serve

    outcomes: Counter[str] = Counter()
    lock = threading.Lock()
    cancelled: list[int] = []
    for round_ in range(3):
        server = start_serve(tmp_path / f"store-{round_}", "--attributor", "off")
        stopped = threading.Event()

        def note(outcome: str) -> None:
            with lock:
                outcomes[outcome] += 1

        def payload() -> bytes:
            trace_id, now = os.urandom(16), time.time_ns()
            return _export_of([_span(trace_id, os.urandom(8), start=now) for _ in range(50)], "t")

        def grpc_sender(
            seed: int, server: Server = server, stopped: threading.Event = stopped
        ) -> None:
            rng = random.Random(seed)
            with grpc.insecure_channel(server.grpc) as channel:
                call = channel.unary_unary(
                    EXPORT, request_serializer=None, response_deserializer=None
                )
                while not (stopped.is_set() and server.proc.poll() is not None):
                    try:
                        call(payload(), timeout=10)
                        note("OK")
                    except grpc.RpcError as exc:
                        if (
                            exc.code() == grpc.StatusCode.UNAVAILABLE
                            and server.proc.poll() is not None
                        ):
                            return  # gone: the exporter's retries end here
                        note(exc.code().name)
                        time.sleep(rng.uniform(0.8, 1.2))

        def http_sender(
            seed: int, server: Server = server, stopped: threading.Event = stopped
        ) -> None:
            rng = random.Random(seed)
            with httpx.Client(timeout=10) as client:
                while not (stopped.is_set() and server.proc.poll() is not None):
                    try:
                        r = client.post(
                            server.url("/v1/traces"), content=payload(),
                            headers={"content-type": "application/x-protobuf"},
                        )  # fmt: skip
                        note(f"HTTP {r.status_code}")
                        if r.status_code != 200:
                            time.sleep(rng.uniform(0.8, 1.2))
                    except httpx.ConnectError:
                        if server.proc.poll() is not None:
                            return
                        time.sleep(0.2)
                    except httpx.HTTPError as exc:
                        note(f"HTTP {type(exc).__name__}")
                        time.sleep(rng.uniform(0.8, 1.2))

        threads = [threading.Thread(target=grpc_sender, args=(i,)) for i in range(8)]
        threads += [threading.Thread(target=http_sender, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        time.sleep(2)
        assert server.stop(signal.SIGTERM) == 0
        stopped.set()
        for t in threads:
            t.join(60)
        cancelled.append(outcomes["CANCELLED"] - sum(cancelled))
    assert outcomes["OK"] and outcomes["HTTP 200"], outcomes
    assert set(outcomes) <= {"OK", "UNAVAILABLE", "RESOURCE_EXHAUSTED", "CANCELLED", "HTTP 200",
                             "HTTP 503", "HTTP 429"}, outcomes  # fmt: skip
    assert max(cancelled) <= 1, (cancelled, outcomes)
