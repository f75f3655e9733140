"""Ground truth bookkeeping, the check's arithmetic, and the delaying proxy on real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from latscope.demo.check import compare, tolerance_ns
from latscope.demo.proxy import DelayProxy
from latscope.demo.truth import RequestTruth, TruthRecorder, truth_buckets
from latscope.semconv import BUCKETS

MS = 1_000_000


def _server(**phases: tuple[int, int]) -> dict:
    record = RequestTruth("r1", arrived_ns=0, arrived_after_ns=10)
    for name, (low, high) in phases.items():
        record.add(name, low, high)
    record.ended_ns, record.ended_after_ns = 100 * MS, 100 * MS + 20
    return record.to_json()


def test_truth_buckets_add_up_and_bracket_network_and_other() -> None:
    server = _server(queue=(30 * MS, 30 * MS + 5), decode=(60 * MS, 60 * MS + 5))
    buckets = truth_buckets((130 * MS, 130 * MS + 40), server)
    assert list(buckets) == list(BUCKETS)
    assert buckets["network"] == (130 * MS - (100 * MS + 20), 130 * MS + 40 - (100 * MS - 10))
    assert buckets["other"] == (100 * MS - 10 - (90 * MS + 10), 100 * MS + 20 - 90 * MS)
    assert buckets["prefill"] == (0, 0)
    lows = sum(low for low, _ in buckets.values())
    highs = sum(high for _, high in buckets.values())
    assert lows <= 130 * MS <= highs


def test_recorder_is_bounded_and_reports_only_finished_requests() -> None:
    rec = TruthRecorder(capacity=2)
    for i in range(3):
        rec.begin(f"r{i}")
    done = rec.begin("r3")
    done.ended_ns = done.ended_after_ns = 5
    out = rec.to_json()
    assert out["forgotten"] == 2
    assert [r["request_id"] for r in out["requests"]] == ["r3"]


def _attr(**ms: float | None) -> dict:
    return {"buckets_ms": {b: ms.get(b, 0.0) for b in BUCKETS}, "clock_skew_ms": 0.0}


def test_check_accepts_figures_inside_the_bracket_or_within_tolerance() -> None:
    truth = {b: (0, 0) for b in BUCKETS}
    truth["decode"] = (100 * MS, 100 * MS + 50_000)
    truth["queue"] = (10 * MS, 10 * MS)
    result = compare([("t1", truth, _attr(decode=100.04, queue=10.9))])
    assert result.ok
    by = {b.bucket: b for b in result.buckets}
    assert by["decode"].max_abs_error_ms == 0.0
    assert by["queue"].max_abs_error_ms == pytest.approx(0.9)


def test_check_fails_a_bucket_off_by_more_than_the_tolerance() -> None:
    truth = {b: (0, 0) for b in BUCKETS}
    truth["prefill"] = (200 * MS, 200 * MS)
    # 2 % of 200 ms is 4 ms: 205 ms is out, and the time it took from decode shows there too.
    result = compare([("t1", truth, _attr(prefill=205.0, decode=-5.0))])
    assert not result.ok
    bad = {b.bucket for b in result.buckets if not b.ok}
    assert bad == {"prefill", "decode"}
    # Worst first, relative to each bucket's tolerance: 5 ms over 1 ms beats 5 ms over 4 ms.
    assert [w[1] for w in result.worst] == ["decode", "prefill"]


def test_check_fails_on_unknown_network_and_missing_requests() -> None:
    truth = {b: (0, 0) for b in BUCKETS}
    assert not compare([("t1", truth, _attr(network=None))]).ok
    assert not compare([("t1", truth, _attr())], missing=["t2"]).ok
    assert not compare([]).ok


def test_tolerance_is_one_ms_or_two_percent() -> None:
    assert tolerance_ns(10 * MS) == 1 * MS
    assert tolerance_ns(1000 * MS) == 20 * MS


@pytest.mark.subprocess
def test_proxy_delays_both_ways_and_records_what_it_added() -> None:
    delay = 0.03

    async def main() -> tuple[bytes, dict]:
        async def upstream(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            head = await r.readuntil(b"\r\n\r\n")
            w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n" + head[:5])
            await w.drain()
            w.close()

        server = await asyncio.start_server(upstream, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        proxy = DelayProxy(("127.0.0.1", port), delay)
        host, pport = await proxy.start()
        r, w = await asyncio.open_connection(host, pport)
        w.write(b"POST /x HTTP/1.1\r\nhost: a\r\nX-Request-Id: abc123\r\n\r\n")
        await w.drain()
        body = await r.read()
        w.close()
        await proxy.stop()
        server.close()
        await server.wait_closed()
        return body, dict(proxy.records)

    body, records = asyncio.run(main())
    assert body.endswith(b"\r\n\r\nPOST ")  # bytes arrive intact, in order
    rec = records["abc123"]
    assert rec.up_ns >= delay * 1e9 and rec.down_ns >= delay * 1e9
    assert rec.added_ns == rec.up_ns + rec.down_ns


@pytest.mark.subprocess
def test_proxy_stop_with_open_connections_reports_no_error() -> None:
    # stop() while clients still hold connections: asyncio must report nothing (each one was a
    # CancelledError traceback in the demo's output).
    async def main() -> list[dict]:
        errors: list[dict] = []
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))

        async def upstream(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await r.read()  # holds the connection until the other side closes
            w.close()

        server = await asyncio.start_server(upstream, "127.0.0.1", 0)
        proxy = DelayProxy(("127.0.0.1", server.sockets[0].getsockname()[1]), 0.0)
        host, port = await proxy.start()
        clients = [await asyncio.open_connection(host, port) for _ in range(4)]
        for _, w in clients:
            w.write(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
            await w.drain()
        while proxy.connections < len(clients):
            await asyncio.sleep(0.01)
        await proxy.stop()
        for _, w in clients:
            w.close()
            with contextlib.suppress(ConnectionError):  # the proxy closed its end first
                await w.wait_closed()
        server.close()
        await server.wait_closed()
        return errors

    assert asyncio.run(main()) == []


def test_the_longest_gap_between_two_tokens_is_kept() -> None:
    record = RequestTruth("r")
    record.token()
    assert record.max_token_gap_ns == 0  # one token: no gap yet
    time.sleep(0.02)
    record.token()
    record.token()
    assert record.max_token_gap_ns >= 20_000_000  # the sleep, not the last, shorter gap
    assert record.to_json()["max_token_gap_ns"] == record.max_token_gap_ns
