"""End to end: plain OpenTelemetry SDK -> OTLP/gRPC -> latscope serve -> attribution over HTTP."""

from __future__ import annotations

import random
import signal
import subprocess
import sys

import httpx
import pytest
from opentelemetry.trace import SpanKind, set_span_in_context

from tests.serve_support import Server, start_serve
from tests.skeleton_support import EXPECTED, LAYOUT, provider

pytestmark = pytest.mark.subprocess

MS = 1_000_000
T0 = 1_763_000_000_000_000_000  # a fixed instant, ns since the epoch


def send_request_trace(
    endpoint: str, layout: dict[str, tuple[int, int]], *, client: bool = True, skew_ns: int = 0
) -> str:
    """Emit a client span, a server span under it and phase spans under that.

    ``layout`` maps "client", "server" and phase names to (start_ms, end_ms) from T0; server-side
    times are shifted by ``skew_ns`` as if the server's clock ran ahead. Returns the trace id.
    """
    client_tp = provider(endpoint, "chat-frontend")
    server_tp = provider(endpoint, "llm-server")
    ctracer, stracer = client_tp.get_tracer("test.client"), server_tp.get_tracer("test.server")
    ctx = None
    c_span = None
    if client:
        cs, _ce = layout["client"]
        c_span = ctracer.start_span(
            "POST /v1/chat/completions", kind=SpanKind.CLIENT, start_time=T0 + cs * MS
        )
        ctx = set_span_in_context(c_span)
    ss, se = layout["server"]
    s_span = stracer.start_span(
        "chat llama",
        context=ctx,
        kind=SpanKind.SERVER,
        start_time=T0 + ss * MS + skew_ns,
        attributes={
            "gen_ai.request.model": "llama-3-8b",
            "gen_ai.usage.input_tokens": 812,
            "gen_ai.operation.name": "chat",
        },
    )
    s_ctx = set_span_in_context(s_span)
    for phase, (ps, pe) in layout.items():
        if phase in ("client", "server"):
            continue
        p = stracer.start_span(
            phase,
            context=s_ctx,
            start_time=T0 + ps * MS + skew_ns,
            attributes={"latscope.phase": phase},
        )
        p.end(end_time=T0 + pe * MS + skew_ns)
    s_span.end(end_time=T0 + se * MS + skew_ns)
    trace_id = format(s_span.get_span_context().trace_id, "032x")
    if c_span is not None:
        c_span.end(end_time=T0 + layout["client"][1] * MS)
    for tp in (server_tp, client_tp):
        tp.force_flush()
        tp.shutdown()
    return trace_id


def get_attribution(server: Server, trace_id: str) -> dict:
    response = httpx.get(server.url(f"/v1/requests/{trace_id}/attribution"), timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def assert_buckets(body: dict, expected: dict[str, float | None]) -> None:
    for bucket, value in expected.items():
        got = body["buckets_ms"][bucket]
        if value is None:
            assert got is None, (bucket, got)
        else:
            assert got == pytest.approx(value, abs=1.0), (bucket, got, value)


def test_client_server_phases_attribution(serve: Server) -> None:
    trace_id = send_request_trace(serve.grpc, LAYOUT)
    body = get_attribution(serve, trace_id)
    assert body["trace_id"] == trace_id
    assert body["service"] == "llm-server"
    assert body["model"] == "llama-3-8b"
    assert body["input_tokens"] == 812
    assert body["e2e_ms"] == pytest.approx(1000, abs=1.0)
    assert_buckets(body, EXPECTED)
    assert sum(body["buckets_ms"].values()) == pytest.approx(body["e2e_ms"], abs=1e-6)
    assert body["clock_skew_ms"] == 0


def test_server_only_trace_has_unknown_network(serve: Server) -> None:
    trace_id = send_request_trace(serve.grpc, LAYOUT, client=False)
    body = get_attribution(serve, trace_id)
    assert body["e2e_ms"] == pytest.approx(920, abs=1.0)
    assert_buckets(body, {**EXPECTED, "network": None})


def test_skewed_server_clock_keeps_buckets_and_reports_skew(serve: Server) -> None:
    skew = random.choice([-1, 1]) * 3_000 * MS  # the server's clock 3 s off
    trace_id = send_request_trace(serve.grpc, LAYOUT, skew_ns=skew)
    body = get_attribution(serve, trace_id)
    assert_buckets(body, EXPECTED)
    # Symmetric-network estimate: the server interval centred in the client's.
    assert body["clock_skew_ms"] == pytest.approx(skew / MS, abs=1.0)


def test_unknown_trace_is_404_json(serve: Server) -> None:
    response = httpx.get(serve.url("/v1/requests/" + "ab" * 16 + "/attribution"), timeout=10)
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("application/json")
    assert response.json()["error"] == "trace_not_found"


def test_malformed_trace_id_is_400_json(serve: Server) -> None:
    response = httpx.get(serve.url("/v1/requests/not-a-trace/attribution"), timeout=10)
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_request_id"


@pytest.mark.slow
def test_sigterm_keeps_every_acknowledged_span(tmp_path) -> None:
    server = start_serve(tmp_path / "store")
    trace_ids = [send_request_trace(server.grpc, LAYOUT) for _ in range(5)]
    assert server.stop(signal.SIGTERM) == 0, "\n".join(server.output)
    assert any("stopped" in line for line in server.output)
    # A new process over the same store sees all 5 traces, 7 spans each.
    again = start_serve(tmp_path / "store")
    try:
        for trace_id in trace_ids:
            assert_buckets(get_attribution(again, trace_id), EXPECTED)
    finally:
        again.stop()


def test_a_signal_delivered_to_another_thread_still_stops_serve() -> None:
    # The kernel may hand a process's SIGTERM to any thread (gRPC's, chDB's); Python runs the
    # handler only when the main thread next runs bytecode, so the main loop must not block in
    # a lock. Here the signal goes to a busy worker thread on purpose.
    script = """
import signal, threading, time
from latscope.serve import Shutdown
stop = Shutdown()
stop.install()
def worker():
    time.sleep(0.3)
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    time.sleep(30)
threading.Thread(target=worker, daemon=True).start()
stop.wait()
print("stopped on", signal.Signals(stop.signum).name)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=20
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped on SIGTERM"
