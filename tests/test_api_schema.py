"""Schemathesis over the served OpenAPI spec: generated requests (valid and invalid) never get a
5xx, and every answer matches the spec's status codes, content types and schemas."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests.conftest import Server, start_serve
from tests.surfaces import dataset_store


@pytest.fixture(scope="module")
def served() -> Iterator[Server]:
    store, _ = dataset_store()
    server = start_serve(store)
    try:
        yield server
    finally:
        server.stop()


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def test_generated_requests_get_no_server_error_and_conform(served: Server) -> None:
    # The schemathesis pytest plugin does not run on this pytest; its Python API with
    # hypothesis does the same, one operation at a time.
    schema = schemathesis.openapi.from_url(served.url("/openapi.json"))
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15
    for operation in operations:

        @given(
            case=st.one_of(
                operation.as_strategy(GenerationMode.POSITIVE),
                operation.as_strategy(GenerationMode.NEGATIVE),
            )
        )
        @settings(
            max_examples=25,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def check(case) -> None:
            case.call_and_validate(checks=CHECKS)

        check()


def test_openapi_is_complete(served: Server) -> None:
    spec = httpx.get(served.url("/openapi.json"), timeout=10).json()
    routes = {path for path in spec["paths"] if path.startswith("/v1/")}
    assert routes == {
        "/v1/traces",  # OTLP/HTTP ingest, served by the same process
        "/v1/metrics",
        "/v1/requests/{request_id}/attribution",
        "/v1/requests/{request_id}",
        "/v1/requests/{request_id}/tokens",
        "/v1/traces/{trace_id}/spans",
        "/v1/traces/{trace_id}/requests",
        "/v1/traces/{trace_id}/run",
        "/v1/traces/{trace_id}",
        "/v1/live",
        "/v1/attribution/summary",
        "/v1/attribution/tail",
        "/v1/attribution/compare",
        "/v1/attribution/diagnose",
        "/v1/attribution/timeseries",
        "/v1/attribution/heatmap",
        "/v1/attribution/why",
        "/v1/attribution/coldstart",
        "/v1/slo",
        "/v1/gpu",
        "/v1/services",
        "/v1/requests",
        "/v1/export/requests",
    }
    for path in ("/v1/traces", "/v1/metrics"):
        operation = spec["paths"][path]["post"]
        assert operation.get("description") or operation.get("summary"), path
    for path in routes - {"/v1/traces", "/v1/metrics"}:
        operation = spec["paths"][path]["get"]
        assert operation.get("description") or operation.get("summary"), path
        for status in ("400", "401", "422"):
            example = operation["responses"][status]["content"]["application/json"]["example"]
            assert set(example) == {"error", "detail"}, (path, status)
        content = operation["responses"]["200"]["content"]
        if path == "/v1/export/requests":  # a file, not a JSON answer
            assert content["application/vnd.apache.parquet"]["schema"]["format"] == "binary"
        else:
            name = content["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
            assert spec["components"]["schemas"][name].get("examples"), (path, name)
        for param in operation.get("parameters", []):
            assert param.get("description"), (path, param["name"])
    # A request is named by its request id or a single-call trace id; a trace id of a trace
    # with several calls is a documented 409.
    for path in ("/v1/requests/{request_id}", "/v1/requests/{request_id}/attribution"):
        operation = spec["paths"][path]["get"]
        (param,) = operation["parameters"][:1]
        assert param["schema"]["pattern"] == "^[0-9a-fA-F]{32}(-[0-9a-fA-F]{16})?$"
        conflict = operation["responses"]["409"]["content"]["application/json"]["example"]
        assert conflict["error"] == "several_requests"
    # The answers about traces are closed: the spec forbids keys they do not document.
    for name in ("TraceRequests", "Run", "RunCall", "TraceExplain", "Live"):
        assert spec["components"]["schemas"][name]["additionalProperties"] is False, name
