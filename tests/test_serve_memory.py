"""``latscope serve``'s memory bound, through the real server: spans that carry prompts (two
16 kB strings each) from 12 senders, Exports of 1-12 MB, a spool of 8 GB; its RSS, sampled every
0.5 s (and its high-water mark), stays under the bound docs/deploy.md states, and every span it
acknowledged is stored."""

from __future__ import annotations

import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import httpx
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from latscope.config import Settings, memory_bound_bytes
from tests.serve_support import start_serve

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
T0 = 1_763_000_000_000_000_000
SERVICE = "memory-bound"
SENDERS = 12
#: Spans an Export carries, drawn per Export: 32 kB of attributes each, so 1-12 MB.
SPANS = (32, 384)
LOAD_S = 25.0
#: Longest the senders go on past LOAD_S until serve first refuses an Export.
PRESS_S = 60.0
SAMPLE_S = 0.5


def _export(rng: random.Random, n: int, spans: int) -> bytes:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.append(
        KeyValue(key="service.name", value=AnyValue(string_value=SERVICE))
    )
    ss = rs.scope_spans.add()
    for i in range(spans):
        start = T0 + (n * 1000 + i) * 1_000_000
        span = ss.spans.add(
            trace_id=rng.randbytes(16), span_id=rng.randbytes(8), name="chat", kind=2,
            start_time_unix_nano=start, end_time_unix_nano=start + 500_000_000,
        )  # fmt: skip
        for key in ("gen_ai.prompt", "gen_ai.completion"):
            # 16 kB that compress like text, not like zeros.
            text = rng.randbytes(8192).hex()
            span.attributes.append(KeyValue(key=key, value=AnyValue(string_value=text)))
    return req.SerializeToString()


def _retry_after(exc: grpc.RpcError) -> float:
    for key, value in exc.trailing_metadata() or ():  # type: ignore[attr-defined]
        if key == "grpc-status-details-bin":
            for detail in status_pb2.Status.FromString(value).details:
                info = error_details_pb2.RetryInfo()
                if detail.Unpack(info):
                    return info.retry_delay.ToTimedelta().total_seconds()
    return 1.0


def _rss(pid: int, field: str) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(rf"{field}:\s+(\d+) kB", text)
    assert match, text
    return int(match.group(1)) * 1024


def _metric(text: str, name: str) -> float:
    match = re.search(rf'^{name}{{signal="traces"}} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


@pytest.mark.slow
@pytest.mark.subprocess
def test_serve_stays_under_its_memory_bound_with_prompt_sized_spans(tmp_path: Path) -> None:
    server = start_serve(tmp_path / "store", "--spool-max-bytes", str(8 * 10**9))
    pid = server.proc.pid
    bound = memory_bound_bytes(Settings().memory_limit_bytes)
    acked = refused = 0
    failures: list[str] = []
    lock = threading.Lock()
    numbers = iter(range(1_000_000))
    deadline = time.monotonic() + LOAD_S

    def sender(seed: int) -> None:
        nonlocal acked, refused
        rng = random.Random(seed)
        with grpc.insecure_channel(
            server.grpc, options=[("grpc.max_send_message_length", 64 << 20)]
        ) as channel:
            call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            # Send for LOAD_S, and on until serve has refused an Export for its memory limit (a
            # serve that keeps up with LOAD_S of this load is pressed longer), PRESS_S at most.
            while time.monotonic() < deadline or (
                not refused and time.monotonic() < deadline + PRESS_S
            ):
                spans = rng.randint(*SPANS)
                with lock:
                    n = next(numbers)
                payload = _export(rng, n, spans)
                while True:
                    try:
                        call(payload, timeout=60)
                    except grpc.RpcError as exc:
                        if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                            with lock:
                                failures.append(f"{exc.code()}: {exc.details()}")
                            return
                        with lock:
                            refused += 1
                        time.sleep(_retry_after(exc))
                        continue
                    with lock:
                        acked += spans
                    break

    samples: list[int] = []
    senders = [threading.Thread(target=sender, args=(seed,)) for seed in range(SENDERS)]
    try:
        for thread in senders:
            thread.start()
        # Sample while sending and until every acknowledged span is in ClickHouse (the
        # inserts and merges of the last Exports come after them).
        drained_at: float | None = None
        while any(t.is_alive() for t in senders) or drained_at is None:
            samples.append(_rss(pid, "VmRSS"))
            if not any(t.is_alive() for t in senders) and drained_at is None:
                metrics = httpx.get(server.url("/metrics"), timeout=10).text
                if not _metric(metrics, "latscope_collector_queue_depth") and not _metric(
                    metrics, "latscope_collector_spool_bytes"
                ):
                    drained_at = time.monotonic()
            stored_by = deadline + PRESS_S + 300
            assert time.monotonic() < stored_by, "the spans were not stored in 5 minutes"
            time.sleep(SAMPLE_S)
        high_water = _rss(pid, "VmHWM")
    finally:
        for thread in senders:
            thread.join(120)
        assert server.stop() == 0, server.text()
    assert not failures, failures
    assert refused, "the senders never met the memory limit: the load is too light to test it"
    mib = 1024**2
    assert max(samples) < bound, (max(samples) // mib, bound // mib)
    assert high_water < bound, (high_water // mib, bound // mib)
    count = subprocess.run(
        [sys.executable, "-c",
         "import sys; from latscope.storage import Store; s = Store.open(sys.argv[1]); "
         "print(s.query_rows('SELECT uniqExact(SpanId) FROM otel_traces "
         "WHERE ServiceName = {s:String}', {'s': sys.argv[2]})[0][0])",
         f"chdb://{server.store_dir}", SERVICE],
        check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert int(count.stdout.split()[-1]) == acked
