"""The C OTLP decoder is built where the project is tested, and the collector runs without it."""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from bench.ingest.traces import make_batch
from latscope.collector import mapping
from latscope.storage import Store
from tests.collector_harness import count_spans, start_collector, store_fixture  # noqa: F401

#: Set where an install without a C compiler is intended: the Python decoder is then expected.
ALLOW_PYTHON = "LATSCOPE_ALLOW_PYTHON_DECODER"


def test_the_c_decoder_is_built() -> None:
    if os.environ.get(ALLOW_PYTHON):
        pytest.skip(f"{ALLOW_PYTHON} is set: the Python decoder is allowed")
    assert mapping.NATIVE, (
        "latscope.collector._otlp was not built: reinstall with a C compiler and the Python "
        f"headers (pip install -e .), or set {ALLOW_PYTHON}=1 if that is intended"
    )


def test_without_the_c_decoder_the_collector_maps_in_python_and_says_so(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(mapping, "NATIVE", False)
    with caplog.at_level(logging.WARNING, logger="latscope.collector"):
        c = start_collector(store, tmp_path / "spool")
    try:
        warnings = [r.getMessage() for r in caplog.records if "C OTLP decoder" in r.getMessage()]
        assert len(warnings) == 1 and "decoding spans in Python" in warnings[0]
        service = f"py-{random.getrandbits(48):012x}"
        request = make_batch(random.Random(2), 1_763_000_000_000_000_000, 2)
        for rs in request.resource_spans:
            rs.resource.attributes[0].value.string_value = service
        with grpc.insecure_channel(c.grpc) as channel:
            trace_service_pb2_grpc.TraceServiceStub(channel).Export(request, timeout=10)
            with pytest.raises(grpc.RpcError) as err:
                channel.unary_unary(
                    "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                    request_serializer=None,
                    response_deserializer=None,
                )(b"\xff\xff", timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        c.wait_stored()
        assert count_spans(store, service) == 14
    finally:
        c.stop()
