"""A long agent run in one trace through a real ``latscope serve`` with its defaults: the trace is
too wide for the attributor's SQL (its general path's memory grows with the square of a trace's
spans, past the embedded engine's limit), so the attributor gives it to the reference engine
without trying the SQL (``--attribution-reference-spans``), or after the SQL is refused when that
bound is above the trace, and every call lands in the attribution table as the trace routes
answer it; a one-call trace sent beside it is attributed as ever, and nothing is set aside. Past
``--max-trace-spans`` the wide trace is set aside instead, saying why."""

from __future__ import annotations

import re
import time
from pathlib import Path

import grpc
import httpx
import pytest

from bench.api.wide import wide_run
from tests.serve_support import Server, metric, start_serve, store_sql

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

WIDE = bytes.fromhex("0d" * 16)
CALLS = 1_100  # 6,601 spans: the SQL's general path asks the engine for about 1.1 GiB
ONE = bytes.fromhex("0e" * 16)
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
ROWS = """
SELECT RequestSpanId, E2eNs, QueueNs, PrefillNs, DecodeNs, NetworkNs, OtherNs, Version
FROM latscope_attribution FINAL WHERE TraceId = {t:String} AND IsDeleted = 0
"""


def _rows(store_dir: Path, trace_id: bytes) -> dict[str, list[int]]:
    """The trace's live attribution rows, by request span id."""
    rows = store_sql(store_dir, ROWS, params={"t": trace_id.hex()})
    return {r[0]: [int(v) for v in r[1:]] for r in rows}


def _send(server: Server) -> None:
    with grpc.insecure_channel(server.grpc) as channel:
        export = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        for message in [*wide_run(WIDE, CALLS), *wide_run(ONE, 1, seed=1)]:
            export(message.SerializeToString(), timeout=60)


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ((), "6,601 spans, at least --attribution-reference-spans"),
        # The bound above the trace's spans: the SQL is tried, refused for its memory, and the
        # trace alone goes to the reference engine all the same.
        (("--attribution-reference-spans", "100000"), "the SQL refused it: "),
        # The reference engine in the attributor's thread, not a process of its own.
        (("--attribution-reference-process", "off"), "6,601 spans, at least --attribution-"),
    ],
    ids=["routed", "refused", "in-thread"],
)
def test_a_trace_too_wide_for_the_sql_is_attributed_by_the_reference_engine(
    tmp_path: Path, args: tuple[str, ...], why: str
) -> None:
    store_dir = tmp_path / "store"
    server = start_serve(store_dir, *args)
    try:
        _send(server)
        deadline = time.monotonic() + 180
        while metric(server, "latscope_attributed_requests_total") < CALLS + 1:
            set_aside = httpx.get(server.url("/v1/attribution/set-aside"), timeout=30).json()
            assert set_aside == {"traces": []}, set_aside
            assert time.monotonic() < deadline, server.text()[-3000:]
            time.sleep(0.5)
        assert metric(server, "latscope_attribution_by_reference_traces_total") == 1
        assert httpx.get(server.url("/v1/attribution/set-aside"), timeout=30).json() == {
            "traces": []
        }
        # Routed, no statement asks the engine for the memory the SQL would (1.1 GiB here).
        assert ("MEMORY_LIMIT_EXCEEDED" in server.text()) == ("100000" in args)
        worker = re.search(r"the reference engine's process started \(pid (\d+)\)", server.text())
        assert (worker is None) == ("off" in args)
        assert (
            f"attributed trace {WIDE.hex()} (6601 spans, {CALLS} calls) with the reference "
            f"engine: {why}"
        ) in server.text()
        # What the trace routes answer (the reference engine over the stored spans), call by call.
        answered = {}
        for trace_id in (WIDE, ONE):
            r = httpx.get(server.url(f"/v1/traces/{trace_id.hex()}/requests"), timeout=60)
            assert r.status_code == 200, r.text
            answered[trace_id] = r.json()["requests"]
    finally:
        assert server.stop() == 0
    if worker is not None:  # serve's stop ended it
        assert not Path(f"/proc/{worker.group(1)}").exists()
    for trace_id, spans in ((WIDE, 6 * CALLS + 1), (ONE, 7)):
        rows = _rows(store_dir, trace_id)
        want = answered[trace_id]
        assert len(rows) == len(want) == (CALLS if trace_id == WIDE else 1)
        for call in want:
            e2e, queue, prefill, decode, network, other, version = rows[
                call["request_id"].split("-")[1]
            ]
            buckets = call["buckets_ms"]
            assert e2e == round(call["e2e_ms"] * 1e6)
            assert [queue, prefill, decode, network, other] == [
                round(buckets[b] * 1e6) for b in ("queue", "prefill", "decode", "network", "other")
            ]
            assert version == spans


def test_past_the_span_cap_a_trace_the_sql_refuses_is_set_aside_saying_why(tmp_path: Path) -> None:
    """The reference engine takes traces of up to ``--max-trace-spans`` spans, as the trace
    routes answer them: a wider one the SQL refuses is set aside (listed, retried later) with
    the reason, and the trace beside it is attributed."""
    store_dir = tmp_path / "store"
    server = start_serve(store_dir, "--max-trace-spans", "5000")
    try:
        _send(server)
        deadline = time.monotonic() + 180
        while True:
            listed = httpx.get(server.url("/v1/attribution/set-aside"), timeout=30).json()
            if listed["traces"] and metric(server, "latscope_attributed_requests_total") >= 1:
                break
            assert time.monotonic() < deadline, server.text()[-3000:]
            time.sleep(0.5)
        (aside,) = listed["traces"]
        assert aside["trace_id"] == WIDE.hex()
        assert "6,601 spans, more than the reference engine takes" in aside["error"]
        assert "--max-trace-spans 5,000" in aside["error"]
        assert metric(server, "latscope_attribution_by_reference_traces_total") == 0
        assert "MEMORY_LIMIT_EXCEEDED" not in server.text()  # its retries do not try the SQL
    finally:
        assert server.stop() == 0
    assert len(_rows(store_dir, ONE)) == 1
    assert _rows(store_dir, WIDE) == {}
