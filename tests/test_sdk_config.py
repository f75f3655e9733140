"""``configure()``: environment variables, precedence, twice, next to the app's own OTel setup."""

from __future__ import annotations

import logging

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from latscope import sdk
from latscope.sdk._options import ExportOptions, from_env, grpc_headers, grpc_target, parse_headers
from latscope.sdk._runtime import RT
from tests.sdk_support import capture, collector


def test_env_is_read_in_one_place() -> None:
    env = {
        "OTEL_SERVICE_NAME": "otel-name",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4317",
        "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=a%20b,Api-Key=k",
        "OTEL_SDK_DISABLED": "false",
        "LATSCOPE_TOKEN": "s3cret",
        "LATSCOPE_GPU_SAMPLE_HZ": "2",
        "CUDA_VISIBLE_DEVICES": "0, 2",
    }
    got = from_env(env)
    assert got == {
        "service_name": "otel-name",
        "endpoint": "https://collector:4317",
        "headers": {"x-tenant": "a b", "api-key": "k"},
        "disabled": False,
        "token": "s3cret",
        "gpu_sample_hz": 2.0,
        "gpu_devices": ("0", "2"),
    }
    # LATSCOPE_* wins over OTEL_*.
    assert from_env({**env, "LATSCOPE_SERVICE_NAME": "ls-name"})["service_name"] == "ls-name"


def test_bad_headers_say_what_to_write() -> None:
    with pytest.raises(ValueError, match="k1=v1"):
        parse_headers("novalue")


def test_endpoint_scheme_decides_tls_and_token_becomes_bearer() -> None:
    assert grpc_target(ExportOptions(endpoint="http://h:4317")) == ("h:4317", True)
    assert grpc_target(ExportOptions(endpoint="https://h:4317")) == ("h:4317", False)
    assert grpc_target(ExportOptions(endpoint="h:4317")) == ("h:4317", True)
    assert grpc_target(ExportOptions(endpoint="h:4317", insecure=False)) == ("h:4317", False)
    assert grpc_headers(ExportOptions(token="t", headers={"X-A": "1"})) == {
        "x-a": "1",
        "authorization": "Bearer t",
    }


def test_arguments_win_over_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:1")
    with capture(service_name="from-arg"):
        assert RT.options.service_name == "from-arg"
        assert RT.options.export.endpoint == "http://env:1"
    with capture():
        assert RT.options.service_name == "test-svc"  # capture() passes one


def test_configure_twice_replaces_and_keeps_working() -> None:
    first, second = InMemorySpanExporter(), InMemorySpanExporter()

    @sdk.inference(model="m")
    def handle() -> int:
        return 1

    try:
        sdk.configure(service_name="one", span_exporter=first, gpu=False, metrics=False)
        handle()
        sdk.configure(service_name="two", span_exporter=second, gpu=False, metrics=False)
        handle()
    finally:
        sdk.shutdown()
    assert [s.resource.attributes["service.name"] for s in first.get_finished_spans()] == ["one"]
    assert [s.resource.attributes["service.name"] for s in second.get_finished_spans()] == ["two"]


def test_alongside_the_apps_own_tracer_provider() -> None:
    """latscope never replaces the global provider; spans still nest across the two."""
    app_spans = InMemorySpanExporter()
    app_provider = TracerProvider()
    app_provider.add_span_processor(SimpleSpanProcessor(app_spans))
    app_tracer = app_provider.get_tracer("app")

    with capture() as cap:
        before = trace.get_tracer_provider()

        @sdk.inference(model="m")
        def handle() -> None:
            with sdk.phase("preprocess"), app_tracer.start_as_current_span("app.db_lookup"):
                pass

        with app_tracer.start_as_current_span("app.request"):
            handle()
        assert trace.get_tracer_provider() is before
        server = cap.one("chat m")
        by_name = {s.name: s for s in app_spans.get_finished_spans()}
        assert set(by_name) == {"app.request", "app.db_lookup"}
        assert server.parent.span_id == by_name["app.request"].context.span_id
        assert by_name["app.db_lookup"].parent.span_id == server.context.span_id
        assert not cap.named("app.db_lookup")


def test_token_and_otel_headers_reach_the_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=blue")
    monkeypatch.setenv("LATSCOPE_TOKEN", "s3cret")

    @sdk.inference(model="m")
    def handle() -> None:
        pass

    with collector("ok") as (servicer, addr):
        sdk.configure(service_name="auth", endpoint=f"http://{addr}", gpu=False)
        try:
            handle()
            assert sdk.force_flush(timeout_s=10)
        finally:
            sdk.shutdown(timeout_s=2)
    assert servicer.names == ["chat m"]
    assert servicer.metadata[0]["authorization"] == "Bearer s3cret"
    assert servicer.metadata[0]["x-tenant"] == "blue"


def test_instrumentation_before_configure_warns_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Without ``configure()`` nothing is traced; the SDK says so once, not per request."""
    from latscope.sdk import _runtime

    monkeypatch.setattr(_runtime, "_configured", False)
    monkeypatch.setattr(_runtime, "_warned_unconfigured", False)
    assert not RT.enabled

    @sdk.inference(model="m")
    def handle() -> None:
        with sdk.phase("decode"):
            sdk.record_token()

    def said() -> int:
        return sum("before sdk.configure()" in r.getMessage() for r in caplog.records)

    with caplog.at_level(logging.WARNING, logger="latscope.sdk"):
        handle()
        handle()
        with sdk.client_call("POST", "http://llm/v1/chat/completions"):
            pass
        assert said() == 1
        assert sdk.stats()["enabled"] is False
        # Switched off on purpose (configure(disabled=True)), or shut down: no warning.
        caplog.clear()
        monkeypatch.setattr(_runtime, "_warned_unconfigured", False)
        sdk.configure(disabled=True)
        handle()
        sdk.shutdown()
        handle()
        assert said() == 0
