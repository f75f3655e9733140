"""Random and mutated Export payloads never crash the collector (gRPC and HTTP)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import grpc
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.ingest.traces import make_batch
from latscope.storage import Store
from tests.collector_harness import Collector, start_collector, store_fixture  # noqa: F401

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
VALID = make_batch(random.Random(7), 1_763_000_000_000_000_000, 2).SerializeToString()


@pytest.fixture(scope="module")
def fuzz_collector(
    store: Store, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Collector, grpc.Channel, httpx.Client]]:
    c = start_collector(store, tmp_path_factory.mktemp("fuzz") / "spool")
    channel = grpc.insecure_channel(c.grpc)
    client = httpx.Client(base_url=c.http, timeout=10)
    try:
        yield c, channel, client
    finally:
        client.close()
        channel.close()
        c.stop()


def _mutate(data: bytes, edits: list[tuple[int, int]], cut: int) -> bytes:
    buf = bytearray(data)
    for pos, value in edits:
        buf[pos % len(buf)] = value
    return bytes(buf[: max(0, len(buf) - cut)])


payloads = st.one_of(
    st.binary(max_size=512),
    st.builds(
        _mutate,
        st.just(VALID),
        st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=8),
        st.integers(0, 64),
    ),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(payload=payloads)
def test_fuzzed_exports_get_an_answer_and_never_crash(
    fuzz_collector: tuple[Collector, grpc.Channel, httpx.Client], payload: bytes
) -> None:
    _c, channel, client = fuzz_collector
    call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
    try:
        call(payload, timeout=10)
    except grpc.RpcError as exc:
        # A payload that is not an Export is refused; the server itself never fails.
        assert exc.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT), exc
        assert "Exception calling application" not in (exc.details() or "")
    response = client.post(
        "/v1/traces", content=payload, headers={"content-type": "application/x-protobuf"}
    )
    assert response.status_code in (200, 400), response.text
    json_response = client.post(
        "/v1/traces", content=payload, headers={"content-type": "application/json"}
    )
    assert json_response.status_code in (200, 400), json_response.text
    assert client.get("/healthz").status_code == 200
