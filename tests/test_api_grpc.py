"""The gRPC QueryService: generated code is current, answers match the REST API, Watch streams."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import httpx
import pytest

from latscope.api.codegen import PROTO_DIR, generate
from latscope.api.grpc_service import QueryServicer, attribution_dict
from latscope.api.live import LiveHub, observe
from latscope.config import Settings
from latscope.v1 import query_pb2, query_pb2_grpc


def test_generated_code_is_current(tmp_path: Path) -> None:
    written = generate(tmp_path)
    assert {p.name for p in written} == {"query_pb2.py", "query_pb2.pyi", "query_pb2_grpc.py"}
    for path in written:
        committed = PROTO_DIR / "latscope" / "v1" / path.name
        assert committed.read_text() == path.read_text(), (
            f"{committed} is stale: run `python -m latscope.api.codegen` and commit the result"
        )


@pytest.fixture(scope="module")
def stub(served) -> Iterator[query_pb2_grpc.QueryServiceStub]:
    server, _ = served
    with grpc.insecure_channel(server.grpc) as channel:
        yield query_pb2_grpc.QueryServiceStub(channel)


@pytest.mark.subprocess
def test_get_attribution_matches_rest(served, stub) -> None:
    server, specs = served
    for spec in (specs[4], specs[33]):  # with a client span, and server-only
        message = stub.GetAttribution(
            query_pb2.GetAttributionRequest(trace_id=spec.trace_id), timeout=30
        )
        rest = httpx.get(server.url(f"/v1/requests/{spec.trace_id}/attribution"), timeout=30)
        got = attribution_dict(message)
        got.pop("start_unix_nano")
        assert got == rest.json()
    assert not message.buckets_ms.HasField("network")  # unknown, not zero


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("trace_id", "code"),
    [("nope", grpc.StatusCode.INVALID_ARGUMENT), ("ab" * 16, grpc.StatusCode.NOT_FOUND)],
)
def test_get_attribution_errors(stub, trace_id: str, code: grpc.StatusCode) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.GetAttribution(query_pb2.GetAttributionRequest(trace_id=trace_id), timeout=30)
    assert info.value.code() == code
    assert info.value.details()


@pytest.mark.subprocess
def test_summary_matches_rest(served, stub) -> None:
    server, _ = served
    message = stub.Summary(
        query_pb2.SummaryRequest(since="2h", until="1m", group_by="model"), timeout=30
    )
    rest = httpx.get(
        server.url("/v1/attribution/summary"),
        params={"since": "2h", "until": "1m", "group_by": "model"},
        timeout=30,
    ).json()
    assert message.count == rest["count"] == 61
    assert message.e2e_ms.p99 == pytest.approx(rest["e2e_ms"]["p99"])
    assert message.buckets_ms["queue"].share == pytest.approx(rest["buckets_ms"]["queue"]["share"])
    assert {g.key: g.count for g in message.groups} == {
        g["key"]: g["count"] for g in rest["groups"]
    }
    with pytest.raises(grpc.RpcError) as info:
        stub.Summary(query_pb2.SummaryRequest(since="soon"), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def _row(trace_id: str, service: str, model: str, e2e_ms: float) -> dict:
    ns = int(e2e_ms * 1e6)
    return {
        "TraceId": trace_id,
        "ServiceName": service,
        "Model": model,
        "Timestamp": 1_763_000_000_000_000_000,
        "E2eNs": ns,
        "NetworkNs": None,
        "QueueNs": ns // 2,
        "PreprocessNs": 0,
        "PrefillNs": ns - ns // 2,
        "DecodeNs": 0,
        "PostprocessNs": 0,
        "OtherNs": 0,
        "Gpu": {"prefill.energy_mj": 5.0},
    }


def test_watch_streams_matching_requests_as_they_come() -> None:
    """A real gRPC server on loopback with the servicer, fed the way the poller feeds it."""
    hub = LiveHub()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    query_pb2_grpc.add_QueryServiceServicer_to_server(
        QueryServicer(None, Settings(), hub=hub),  # type: ignore[arg-type] (Watch needs no store)
        server,
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = query_pb2_grpc.QueryServiceStub(channel)
            stream = stub.Watch(
                query_pb2.WatchRequest(service="llm", model="m1", min_e2e_ms=100), timeout=30
            )
            got: list[query_pb2.RequestAttribution] = []
            done = threading.Event()

            def read() -> None:
                for message in stream:
                    got.append(message)
                    if len(got) == 2:
                        break
                done.set()

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            while hub.subscribers == 0:
                done.wait(0.01)
            batch = [
                _row("a" * 32, "llm", "m1", 150),
                _row("b" * 32, "llm", "m2", 500),  # other model
                _row("c" * 32, "llm", "m1", 50),  # too fast
                _row("d" * 32, "other", "m1", 900),  # other service
                _row("e" * 32, "llm", "m1", 100),
            ]
            assert observe(batch, hub=hub) == 5
            assert done.wait(20)
            stream.cancel()
        assert [m.trace_id for m in got] == ["a" * 32, "e" * 32]
        first = attribution_dict(got[0])
        assert first["buckets_ms"]["queue"] == pytest.approx(75)
        assert first["buckets_ms"]["network"] is None
        assert first["gpu"] == {"prefill": {"energy_mj": 5.0}}
        deadline = threading.Event()
        while hub.subscribers and not deadline.wait(0.05):
            pass  # the cancelled stream unsubscribes
        assert hub.subscribers == 0
    finally:
        server.stop(None)
