"""Bearer token: with one set, every /v1 route and gRPC query needs it; health stays open."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from latscope.auth import UNAUTHORIZED
from latscope.v1 import query_pb2, query_pb2_grpc
from tests.serve_support import Server, start_serve

pytestmark = pytest.mark.subprocess

TOKEN = "s3cret-token"
TRACE = "ab" * 16
SPAN = "cd" * 8
V1_ROUTES = [
    f"/v1/requests/{TRACE}/attribution",
    f"/v1/requests/{TRACE}",
    f"/v1/requests/{TRACE}/tokens",
    f"/v1/traces/{TRACE}/spans",
    f"/v1/traces/{TRACE}/spans/{SPAN}",
    "/v1/export/requests",
    f"/v1/traces/{TRACE}/requests",
    f"/v1/traces/{TRACE}/run",
    f"/v1/traces/{TRACE}",
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
    "/v1/conversations",
    "/v1/conversations/conv-1",
    "/v1/attribution/set-aside",
]
#: OTLP/HTTP ingest (POST), served by the same process.
INGEST_ROUTES = ["/v1/traces", "/v1/metrics"]


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_serve(tmp_path_factory.mktemp("auth") / "store", env={"LATSCOPE_TOKEN": TOKEN})
    try:
        yield server
    finally:
        server.stop()


def test_the_spec_lists_every_v1_route(guarded: Server) -> None:
    spec = httpx.get(guarded.url("/openapi.json"), timeout=10).json()

    def template(path: str) -> str:
        name = "{request_id}" if path.startswith("/v1/requests/") else "{trace_id}"
        path = path.replace(TRACE, name).replace(SPAN, "{span_id}")
        return path.replace("conv-1", "{conversation_id}")

    assert {p for p in spec["paths"] if p.startswith("/v1/")} == {
        template(p) for p in V1_ROUTES
    } | set(INGEST_ROUTES)


@pytest.mark.parametrize("path", INGEST_ROUTES)
def test_otlp_http_ingest_needs_the_token(guarded: Server, path: str) -> None:
    # An empty Export (protobuf encoding of no resource spans/metrics) is valid OTLP.
    headers = {"Content-Type": "application/x-protobuf"}
    denied = httpx.post(guarded.url(path), content=b"", headers=headers, timeout=30)
    assert denied.status_code == 401
    allowed = httpx.post(
        guarded.url(path),
        content=b"",
        headers={**headers, "Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    )
    assert allowed.status_code == 200, allowed.text


@pytest.mark.parametrize("path", V1_ROUTES)
@pytest.mark.parametrize("header", [None, "Bearer wrong", f"Basic {TOKEN}", "Bearer"])
def test_v1_needs_the_token(guarded: Server, path: str, header: str | None) -> None:
    headers = {"Authorization": header} if header else {}
    response = httpx.get(guarded.url(path), headers=headers, timeout=30)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"] == "unauthorized"


@pytest.mark.parametrize("path", V1_ROUTES)
def test_v1_answers_with_the_token(guarded: Server, path: str) -> None:
    response = httpx.get(
        guarded.url(path), headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
    )
    assert response.status_code in (200, 404), response.text
    assert response.status_code == (404 if TRACE in path or "conv-1" in path else 200)


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics", "/", "/openapi.json"])
def test_health_metrics_and_page_stay_open(guarded: Server, path: str) -> None:
    assert httpx.get(guarded.url(path), timeout=10).status_code == 200


def test_grpc_query_needs_the_token(guarded: Server) -> None:
    with grpc.insecure_channel(guarded.grpc) as channel:
        stub = query_pb2_grpc.QueryServiceStub(channel)
        request = query_pb2.GetAttributionRequest(trace_id=TRACE)
        with pytest.raises(grpc.RpcError) as info:
            stub.GetAttribution(request, timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as info:
            stub.GetAttribution(
                request, timeout=10, metadata=[("authorization", f"Bearer {TOKEN}")]
            )
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as info:
            next(iter(stub.Watch(query_pb2.WatchRequest(), timeout=10)))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        for call, message in (
            (stub.ListRequests, query_pb2.ListRequestsRequest(trace_id=TRACE)),
            (stub.GetRun, query_pb2.GetRunRequest(trace_id=TRACE)),
        ):
            with pytest.raises(grpc.RpcError) as info:
                call(message, timeout=10)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.RpcError) as info:
                call(message, timeout=10, metadata=[("authorization", f"Bearer {TOKEN}")])
            assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_cli_says_how_to_pass_the_token(guarded: Server, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "latscope.cli", "report", "--url", guarded.http]
    denied = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert denied.returncode == 1
    assert "needs a token" in denied.stderr and "--token-file" in denied.stderr
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    allowed = subprocess.run(
        [*cmd, "--token-file", str(token_file), "--json"], capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert allowed.returncode == 0, allowed.stderr
    assert '"count": 0' in allowed.stdout


def test_every_transport_refuses_with_the_same_sentence(guarded: Server) -> None:
    """REST, the gRPC query service, OTLP/gRPC and OTLP/HTTP ingest share one check: each keeps
    its own status and says the same thing."""
    rest = httpx.get(guarded.url("/v1/services"), headers={"Authorization": "Bearer x"}, timeout=30)
    assert (rest.status_code, rest.json()["detail"]) == (401, UNAUTHORIZED)
    ingest_http = httpx.post(
        guarded.url("/v1/traces"), content=b"", headers={"Content-Type": "application/x-protobuf"},
        timeout=30,
    )  # fmt: skip
    assert ingest_http.status_code == 401
    assert status_pb2.Status.FromString(ingest_http.content).message == UNAUTHORIZED
    with grpc.insecure_channel(guarded.grpc) as channel:
        query = query_pb2_grpc.QueryServiceStub(channel)
        ingest = trace_service_pb2_grpc.TraceServiceStub(channel)
        for call, message in (
            (query.Summary, query_pb2.SummaryRequest()),
            (ingest.Export, trace_service_pb2.ExportTraceServiceRequest()),
        ):
            with pytest.raises(grpc.RpcError) as info:
                call(message, timeout=10, metadata=[("authorization", "Bearer wrong")])
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert info.value.details() == UNAUTHORIZED
        ingest.Export(
            trace_service_pb2.ExportTraceServiceRequest(), timeout=10,
            metadata=[("authorization", f"Bearer {TOKEN}")],
        )  # fmt: skip
