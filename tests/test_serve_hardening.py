"""Hardening of a running latscope process, through the real servers: exclusive ports reported
before anything is created, query streams that cannot starve ingest, UNAVAILABLE (not CANCELLED)
at shutdown, no secret in logs or answers, 4xx for bad input, no litter left behind."""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx
import pytest
import uvicorn

from bench.ingest.traces import make_batch
from latscope.api import create_app
from latscope.collector.standalone import DeferredStore
from latscope.config import Settings
from latscope.serve import bind_http
from latscope.storage import Store, StoreError
from latscope.v1 import query_pb2, query_pb2_grpc
from tests.collector_harness import (
    Collector,
    collector_fixture,  # noqa: F401 (fixture)
    start_collector,
    store_fixture,  # noqa: F401 (fixture)
)
from tests.serve_support import Server, start_serve, store_sql

T0 = 1_763_000_000_000_000_000
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def _export_bytes(seed: int, requests: int = 8) -> bytes:
    return make_batch(random.Random(seed), T0 + seed * 10**9, requests).SerializeToString()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One ``latscope serve`` with few ingest threads, so a handful of streams could fill them."""
    store_dir = tmp_path_factory.mktemp("first") / "store"
    server = start_serve(store_dir, "--grpc-workers", "4", "--attributor", "off")
    try:
        yield server
    finally:
        server.stop()
    # A clean stop leaves no empty spool folder beside the store.
    assert not Path(f"{store_dir}-spool").exists()


def _second(
    tmp_path: Path, grpc_addr: str, http_addr: str
) -> tuple[subprocess.CompletedProcess, Path]:
    store_dir = tmp_path / "second"
    proc = subprocess.run(
        [sys.executable, "-m", "latscope.cli", "serve", "--store", f"chdb://{store_dir}",
         "--otlp-grpc", grpc_addr, "--http", http_addr],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return proc, store_dir


@pytest.mark.subprocess
def test_a_busy_grpc_port_stops_a_second_serve_before_it_creates_anything(
    first: Server, tmp_path: Path
) -> None:
    # gRPC's SO_REUSEPORT would let the second process share the port and take part of the
    # traffic into its own store; it must refuse to start instead, saying which address.
    proc, store_dir = _second(tmp_path, first.grpc, f"127.0.0.1:{_free_port()}")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"cannot listen for OTLP/gRPC on {first.grpc}" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not store_dir.exists() and not Path(f"{store_dir}-spool").exists()


@pytest.mark.subprocess
def test_a_busy_http_port_is_reported_with_its_address(first: Server, tmp_path: Path) -> None:
    http = first.http.removeprefix("http://")
    proc, store_dir = _second(tmp_path, f"127.0.0.1:{_free_port()}", http)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"cannot listen for HTTP on {http}" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not store_dir.exists() and not Path(f"{store_dir}-spool").exists()


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(0.05)


@pytest.mark.subprocess
def test_idle_watch_streams_do_not_starve_ingest(first: Server) -> None:
    # As many open Watch streams as the server allows (64), 16 times its ingest threads (4 here,
    # 32 by default), and one more: that one is refused only once the others all hold their
    # subscription, and so the thread each is served on.
    from latscope.api.live import MAX_SUBSCRIBERS

    channel = grpc.insecure_channel(first.grpc)
    stub = query_pb2_grpc.QueryServiceStub(channel)
    streams = [
        stub.Watch(query_pb2.WatchRequest(service="nobody")) for _ in range(MAX_SUBSCRIBERS + 1)
    ]
    try:
        _wait_for(lambda: any(s.done() for s in streams), "a stream over the limit refused")
        (refused,) = [s for s in streams if s.done()]
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.details()
        export = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        # A starved Export would wait for a thread as long as the streams stay open: past any
        # deadline, so a generous one tells it apart whatever the machine's load.
        export(_export_bytes(1), timeout=60)
        open_streams = [s for s in streams if s is not refused]
        assert all(s.running() for s in open_streams)  # still open, not refused
    finally:
        for s in streams:
            s.cancel()
        channel.close()


@pytest.mark.slow
@pytest.mark.subprocess
def test_exports_in_flight_at_sigterm_get_unavailable_not_cancelled(tmp_path: Path) -> None:
    # Few handler threads: at SIGTERM many Exports are still waiting for a thread. Each must be
    # answered UNAVAILABLE ("shutting down", which exporters retry elsewhere), never CANCELLED,
    # and none acknowledged may be lost. The grace is what an Export already in a handler gets
    # to finish (its decode and journal fsync): 5 s, as a loaded CI machine running two test
    # workers beside this serve needed more than 2 s for one of ~250 Exports.
    server = start_serve(
        tmp_path / "store", "--grpc-workers", "2", "--shutdown-grace-s", "5",
        "--attributor", "off",
    )  # fmt: skip
    payloads = [_export_bytes(seed, requests=400) for seed in range(16)]
    codes: Counter[str] = Counter()
    lock = threading.Lock()
    halt = threading.Event()

    def sender(i: int) -> None:
        with grpc.insecure_channel(server.grpc) as channel:
            call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            n = 0
            while not halt.is_set():
                try:
                    call(payloads[(i + n) % len(payloads)], timeout=30)
                    code = "OK"
                except grpc.RpcError as exc:
                    code = exc.code().name
                with lock:
                    codes[code] += 1
                n += 1
                if code not in ("OK", "RESOURCE_EXHAUSTED"):
                    return  # the server is going away

    threads = [threading.Thread(target=sender, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()

    def acknowledged() -> int:
        with lock:
            return codes["OK"]

    # Exports are flowing (and many more waiting for one of the two threads) at SIGTERM.
    _wait_for(lambda: acknowledged() >= 20, "20 Exports acknowledged")
    assert server.stop(signal.SIGTERM) == 0
    halt.set()
    for t in threads:
        t.join(60)
    assert codes["OK"] > 0, codes
    assert codes["CANCELLED"] == 0, codes
    assert set(codes) <= {"OK", "UNAVAILABLE", "RESOURCE_EXHAUSTED"}, codes


@pytest.mark.subprocess
def test_the_store_password_never_appears_in_the_collectors_log_or_answers(
    tmp_path: Path,
) -> None:
    secret = f"pw-{uuid.uuid4().hex}"
    dsn = f"http://latscope:{secret}@127.0.0.1:{_free_port()}/latscope?password={secret}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "latscope.cli", "collector", "--store", dsn,
         "--otlp-grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--attributor", "off",
         "--spool-dir", str(tmp_path / "spool"), "--store-retry-s", "0.2",
         "--log-level", "debug"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []
    grpc_addr = http_addr = ""
    while not (grpc_addr and http_addr):
        line = proc.stdout.readline()
        assert line, "\n".join(lines)
        lines.append(line)
        # The addresses' lines as serve prints them; debug logs may also name HTTP and URLs.
        words = line.split()
        if words[:1] == ["OTLP/gRPC"]:
            grpc_addr = words[-1]
        if words[:1] == ["HTTP"] and words[-1].startswith("http"):
            http_addr = words[-1]
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        with grpc.insecure_channel(grpc_addr) as channel:
            call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            for seed in range(5):
                call(_export_bytes(seed), timeout=10)  # acknowledged from the spool
        # The retries of the store (every 0.2 s) log its failure with the DSN.
        _wait_for(
            lambda: all(w in "".join(lines) for w in ("unreachable", "latscope:***@", "refused")),
            "a retry's failure logged",
        )
        metrics = httpx.get(f"{http_addr}/metrics", timeout=10).text
        assert secret not in metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        reader.join(5)
        proc.stdout.close()
    text = "".join(lines)
    assert "unreachable" in text and "latscope:***@" in text
    assert secret not in text
    # The README's DSN form (a password parameter) reaches ClickHouse's client as its password:
    # the store is unreachable because nothing listens there, not because of the DSN.
    assert "Connection refused" in text and "multiple values" not in text


@pytest.mark.subprocess
def test_a_dsn_with_two_different_passwords_is_refused_at_start(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "latscope.cli", "collector", "--store",
         f"http://latscope:one-pw@127.0.0.1:{_free_port()}/latscope?password=other-pw",
         "--otlp-grpc", "127.0.0.1:0", "--http", "127.0.0.1:0",
         "--spool-dir", str(tmp_path / "spool")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "gives the password twice" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "one-pw" not in proc.stderr + proc.stdout and "other-pw" not in proc.stderr


def _serve_app(app: object) -> tuple[uvicorn.Server, threading.Thread, str]:
    sock, addr = bind_http(Settings(http="127.0.0.1:0"))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        time.sleep(0.01)
    return server, thread, f"http://{addr}"


def test_readyz_names_the_store_without_its_password() -> None:
    secret = f"pw-{uuid.uuid4().hex}"
    store = DeferredStore(f"http://latscope:{secret}@127.0.0.1:{_free_port()}/latscope", 60)
    server, thread, url = _serve_app(create_app(store, Settings()))
    try:
        r = httpx.get(f"{url}/readyz", timeout=10)
        assert r.status_code == 503
        assert secret not in r.text and "latscope:***@127.0.0.1" in r.json()["detail"]
    finally:
        server.should_exit = True
        thread.join(10)


def test_a_wrong_method_gets_405_with_allow(store: Store) -> None:
    server, thread, url = _serve_app(create_app(store, Settings()))
    try:
        r = httpx.post(f"{url}/v1/attribution/summary", timeout=10)
        assert r.status_code == 405 and r.headers["allow"] == "GET"
        assert r.json()["error"] == "http_error"
        r = httpx.delete(f"{url}/healthz", timeout=10)
        assert r.status_code == 405 and r.headers["allow"] == "GET"
    finally:
        server.should_exit = True
        thread.join(10)


def test_deeply_nested_otlp_json_is_a_400_with_a_message(collector: Collector) -> None:
    deep = (
        '{"resourceSpans": [{"resource": {"attributes": [{"key": "k", "value": '
        + ('{"arrayValue": {"values": [' * 5000)
        + "]}}" * 5000
        + "}]}}]}"
    )
    for path in ("/v1/traces", "/v1/metrics"):
        r = httpx.post(
            f"{collector.http}{path}", content=deep,
            headers={"content-type": "application/json"}, timeout=30,
        )  # fmt: skip
        assert r.status_code == 400, (path, r.status_code, r.text[:200])
        assert "nested too deeply" in r.json()["message"]


@pytest.mark.subprocess
def test_a_clean_stop_leaves_no_spool_folder(store: Store, tmp_path: Path) -> None:
    c = start_collector(store, tmp_path / "spool")
    with grpc.insecure_channel(c.grpc) as channel:
        call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        call(_export_bytes(7), timeout=10)
    c.wait_stored()
    c.stop()
    assert not (tmp_path / "spool").exists()


@pytest.mark.subprocess
def test_a_failing_spool_disk_logs_a_few_lines_not_one_per_export(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from latscope.collector import spool as spool_module

    def full(self: object, records: list[bytes], rows: int) -> bool:
        raise OSError(28, "No space left on device")

    c = start_collector(store, tmp_path / "spool")
    monkeypatch.setattr(spool_module.Segment, "append", full)
    refused = 0
    try:
        with grpc.insecure_channel(c.grpc) as channel:
            call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            for seed in range(40):
                try:
                    call(_export_bytes(seed, requests=1), timeout=10)
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    refused += 1
    finally:
        monkeypatch.undo()
        c.stop()
    assert refused == 40
    lines = [r for r in caplog.records if "cannot write the journal" in r.getMessage()]
    assert 1 <= len(lines) <= 2, len(lines)


def test_every_query_runs_under_the_time_limit(store: Store) -> None:
    limited = Store(store.client, store.dsn, query_timeout_s=1)
    # A trillion rows would take hours: the limit's error is what ends the query.
    with pytest.raises(StoreError, match="TIMEOUT_EXCEEDED"):
        limited.query_rows("SELECT count() FROM numbers(1000000000000)")
    assert Settings.from_env({"LATSCOPE_QUERY_TIMEOUT_S": "7"}).query_timeout_s == 7


def test_an_insert_completes_while_a_long_query_runs(store: Store) -> None:
    # No process-wide lock: a slow query on one thread (a rollup build, a wide API query) does
    # not hold up a span insert on another. With one chDB client the driver serialised them.
    import pyarrow as pa

    assert not store.locked
    store.command("CREATE TABLE IF NOT EXISTS lock_probe (i UInt64) ENGINE = MergeTree ORDER BY i")
    slow_done = threading.Event()
    errors: list[BaseException] = []

    def slow() -> None:
        try:  # runs 4 s, then returns what it has (break, not an error)
            store.query_rows(
                "SELECT count() FROM numbers(100000000000) WHERE sipHash64(number) = 0 "
                "SETTINGS max_execution_time = 4, timeout_overflow_mode = 'break'"
            )
        except BaseException as exc:
            errors.append(exc)
        finally:
            slow_done.set()

    thread = threading.Thread(target=slow)
    thread.start()
    try:
        time.sleep(0.5)
        assert not slow_done.is_set(), "the slow query ended too soon to tell anything"
        store.insert_arrow("lock_probe", pa.table({"i": pa.array([1, 2, 3], pa.uint64())}))
        inserted_first = not slow_done.is_set()
        assert store.query_rows("SELECT count() FROM lock_probe")[0][0] >= 3
    finally:
        thread.join(60)
    assert not errors, errors
    assert inserted_first, "the insert waited for the slow query"


@pytest.mark.subprocess
def test_a_request_id_and_a_trace_id_fit_the_published_patterns(first: Server) -> None:
    import re

    spec = httpx.get(first.url("/openapi.json"), timeout=10).json()
    params = {
        (path, p["name"]): p["schema"]
        for path, ops in spec["paths"].items()
        for p in ops.get("get", {}).get("parameters", [])
    }
    tid = "4bf92f3577b34da6a3ce929d0e0e4736"
    request = re.compile(params[("/v1/requests/{request_id}/attribution", "request_id")]["pattern"])
    assert request.match(tid) and request.match(f"{tid}-00f067aa0ba902b7")
    assert not request.match("not-a-trace") and not request.match(f"{tid}-xyz")
    trace = re.compile(params[("/v1/traces/{trace_id}/spans", "trace_id")]["pattern"])
    assert trace.match(tid) and not trace.match(f"{tid}-00f067aa0ba902b7")
    since = re.compile(params[("/v1/attribution/summary", "since")]["pattern"])
    assert since.match("15m") and since.match("2026-01-02T15:04:05Z")
    assert not since.match("yesterday") and not since.match("2026-01-02")
    objective = re.compile(params[("/v1/slo", "objective")]["items"]["pattern"])
    assert objective.match("ttft:500:0.99:30") and not objective.match("ttft:fast")
    # What fits the pattern but not the server is still a 4xx with a message.
    r = httpx.get(first.url("/v1/attribution/summary"), params={"since": "2026-13-01T00:00:00Z"})
    assert r.status_code == 400 and r.json()["detail"]


@pytest.mark.subprocess
def test_a_memory_limit_too_small_to_open_the_store_says_what_to_raise(tmp_path: Path) -> None:
    """An embedded store that cannot even apply its schema under the engine's limit stops serve
    at once (exit 1), saying the engine's limit and the setting to raise, without a traceback."""
    proc = subprocess.run(
        [sys.executable, "-m", "latscope.cli", "serve", "--store", f"chdb://{tmp_path / 'store'}",
         "--otlp-grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--memory-limit-bytes", "1000"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "MEMORY_LIMIT_EXCEEDED" in proc.stderr
    assert "(3 x --memory-limit-bytes: 0.0 MiB)" in proc.stderr
    assert "raise --memory-limit-bytes" in proc.stderr and "Traceback" not in proc.stderr


def test_a_query_refused_for_memory_is_a_503_to_retry(tmp_path: Path) -> None:
    """A query ClickHouse refuses for its memory limit is a 503 ``store_busy`` with Retry-After
    (the same question may pass once an insert or a merge is done), not a 500. Here the engine's
    limit (48 MiB) leaves room for the process at rest, not for an exact summary of 2,000,000
    stored requests (every value of each figure held at once); the process still answers."""
    store = tmp_path / "store"
    store_sql(
        store,
        "INSERT INTO latscope_attribution (Timestamp, TraceId, RequestSpanId, ServiceName, "
        "Model, E2eNs, QueueNs, DecodeNs, SpansIngestedAt, Version) "
        "SELECT toDateTime64('2025-11-01 00:00:00', 9, 'UTC') "
        "+ toIntervalMillisecond(number * 40), hex(number), hex(number), 'svc', 'm', "
        "number, number, number, now64(6), 1 "
        "FROM numbers(2000000)",
        "SELECT count() FROM latscope_attribution",
    )
    server = start_serve(store, "--memory-limit-bytes", str(16 << 20), "--attributor", "off")
    try:
        r = httpx.get(
            server.url(
                "/v1/attribution/summary?since=2025-11-01T00:00:00Z&until=2025-11-02T00:00:00Z"
                "&exact=true"
            ),
            timeout=30,
        )
        assert r.status_code == 503, r.text
        assert r.headers["Retry-After"] == "1"
        body = r.json()
        assert body["error"] == "store_busy"
        assert (
            "MEMORY_LIMIT_EXCEEDED" in body["detail"] and "--memory-limit-bytes" in body["detail"]
        )
        assert httpx.get(server.url("/healthz"), timeout=10).status_code == 200
    finally:
        server.stop()
