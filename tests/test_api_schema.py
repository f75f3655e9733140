"""Schemathesis over the served OpenAPI spec: generated requests (valid and invalid) never get a
5xx, and every answer matches the spec's status codes, content types and schemas."""

from __future__ import annotations

import httpx
import pydantic
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

from latscope.api import schemas
from tests.hypothesis_support import examples
from tests.serve_support import Server

pytestmark = pytest.mark.subprocess

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.mark.slow
def test_generated_requests_get_no_server_error_and_conform(served: tuple[Server, list]) -> None:
    server, _ = served
    # The schemathesis pytest plugin does not run on this pytest; its Python API with
    # hypothesis does the same, one operation at a time.
    schema = schemathesis.openapi.from_url(server.url("/openapi.json"))
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
            max_examples=examples(15),
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def check(case) -> None:
            case.call_and_validate(checks=CHECKS)

        check()


def test_openapi_is_complete(served: tuple[Server, list]) -> None:
    server, _ = served
    spec = httpx.get(server.url("/openapi.json"), timeout=10).json()
    routes = {path for path in spec["paths"] if path.startswith("/v1/")}
    assert routes == {
        "/v1/traces",  # OTLP/HTTP ingest, served by the same process
        "/v1/metrics",
        "/v1/requests/{request_id}/attribution",
        "/v1/requests/{request_id}",
        "/v1/requests/{request_id}/tokens",
        "/v1/traces/{trace_id}/spans",
        "/v1/traces/{trace_id}/spans/{span_id}",
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
        "/v1/conversations",
        "/v1/conversations/{conversation_id}",
        "/v1/attribution/set-aside",  # served by the attributor beside the API
    }
    for path in ("/v1/traces", "/v1/metrics"):
        operation = spec["paths"][path]["post"]
        assert operation.get("description") or operation.get("summary"), path
    for path in routes - {"/v1/traces", "/v1/metrics"}:
        operation = spec["paths"][path]["get"]
        assert operation.get("description") or operation.get("summary"), path
        # Every route names its errors; a route without parameters has none to refuse.
        for status in ("400", "401", "422") if operation.get("parameters") else ("401",):
            example = operation["responses"][status]["content"]["application/json"]["example"]
            assert set(example) == {"error", "detail"}, (path, status)
        for param in operation.get("parameters", []):
            assert param.get("description"), (path, param["name"])
        if path == "/v1/export/requests":  # a file, not a JSON answer
            ok = operation["responses"]["200"]["content"]["application/vnd.apache.parquet"]
            assert ok["schema"] == {"type": "string", "format": "binary"}
            continue
        ok = operation["responses"]["200"]["content"]["application/json"]["schema"]
        name = ok["$ref"].rsplit("/", 1)[-1]
        assert spec["components"]["schemas"][name].get("examples"), (path, name)
    # A request is named by its request id or a single-call trace id; a trace id of a trace
    # with several calls is a documented 409.
    for path in ("/v1/requests/{request_id}", "/v1/requests/{request_id}/attribution"):
        operation = spec["paths"][path]["get"]
        (param,) = operation["parameters"][:1]
        assert param["schema"]["pattern"] == "^[0-9a-fA-F]{32}(-[0-9a-fA-F]{16})?$"
        conflict = operation["responses"]["409"]["content"]["application/json"]["example"]
        assert conflict["error"] == "several_requests"


def _answer_schemas(spec: dict, schema: dict, seen: set[str]) -> None:
    """Every component schema ``schema`` names, directly or inside arrays, maps and unions."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        if name not in seen:
            seen.add(name)
            _answer_schemas(spec, spec["components"]["schemas"][name], seen)
        return
    for value in schema.values():
        if isinstance(value, dict):
            _answer_schemas(spec, value, seen)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, dict):
                    _answer_schemas(spec, item, seen)


def test_every_answer_is_closed_and_lists_what_it_always_has(served: tuple[Server, list]) -> None:
    """Each answer and each part of one: no undocumented keys (additionalProperties false), and
    every key listed as required (the answers always carry every key; null where its type
    says it can be)."""
    server, _ = served
    spec = httpx.get(server.url("/openapi.json"), timeout=10).json()
    names: set[str] = set()
    for path, item in spec["paths"].items():
        content = item.get("get", {}).get("responses", {}).get("200", {}).get("content", {})
        if path.startswith("/v1/") and "application/json" in content:  # not the Parquet export
            ok = content["application/json"]["schema"]
            _answer_schemas(spec, ok, names)
    assert {"Attribution", "Summary", "Streaming", "Run", "Why", "ColdStart", "Verdict"} <= names
    for name in sorted(names):
        schema = spec["components"]["schemas"][name]
        assert schema.get("additionalProperties") is False, name
        assert sorted(schema.get("required", [])) == sorted(schema["properties"]), name


def test_every_example_is_a_valid_answer() -> None:
    """The examples the OpenAPI document shows validate against their own models."""
    checked = 0
    for model in vars(schemas).values():
        if isinstance(model, type) and issubclass(model, schemas.Answer):
            for example in (model.model_config.get("json_schema_extra") or {}).get("examples", []):
                model.model_validate(example)
                checked += 1
    assert checked >= 20


def test_a_row_is_closed_as_an_answer_is() -> None:
    """The rows of an answer's long lists are typed dicts (``base.row``): on its own too (a
    trace's rows are validated before an answer holds them), a row refuses a key it does not
    name and a key it lacks, as a model does, where the answer is built."""
    step = {"span_id": "a", "name": "chat", "category": "llm", "bucket": None,
            "request_id": None, "start_ms": 1.0, "end_ms": 2.0}  # fmt: skip
    span = schemas.TraceSpans.model_json_schema()["examples"][0]["spans"][0]
    tool = schemas.Run.model_json_schema()["examples"][0]["tools"][0]
    for row, value in ((schemas.PathStep, step), (schemas.Span, span), (schemas.RunTool, tool)):
        rows = pydantic.TypeAdapter(list[row])
        assert rows.validate_python([value]) == [value]
        with pytest.raises(pydantic.ValidationError, match="extra"):
            rows.validate_python([{**value, "stop_ms": 2.0}])
        with pytest.raises(pydantic.ValidationError, match="missing"):
            rows.validate_python([{k: v for k, v in value.items() if k != "name"}])
    with pytest.raises(pydantic.ValidationError, match="extra"):
        pydantic.TypeAdapter(schemas.Span).validate_python(
            {**span, "events": [{"name": "x", "at_ms": 1.0, "extra": 1}]}
        )
