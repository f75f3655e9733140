"""``latscope collector`` over TLS: OTLP/gRPC and OTLP/HTTP with a certificate and key."""

from __future__ import annotations

import re
import shutil
import ssl
import subprocess
import sys
from pathlib import Path

import grpc
import httpx
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult

pytestmark = pytest.mark.subprocess

OPENSSL = shutil.which("openssl")


@pytest.fixture
def cert(tmp_path: Path) -> tuple[Path, Path]:
    if OPENSSL is None:
        pytest.fail("openssl is needed to make a test certificate")
    key, crt = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [OPENSSL, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(key), "-out", str(crt)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return crt, key


def test_collector_serves_otlp_over_tls(tmp_path: Path, cert: tuple[Path, Path]) -> None:
    crt, key = cert
    cmd = [
        sys.executable, "-m", "latscope.cli", "collector",
        "--store", f"chdb://{tmp_path / 'store'}",
        "--otlp-grpc", "127.0.0.1:0", "--http", "127.0.0.1:0",
        "--tls-cert", str(crt), "--tls-key", str(key), "--token", "t0k",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines: list[str] = []
    grpc_addr = http_url = None
    for line in proc.stdout:
        lines.append(line)
        if m := re.search(r"OTLP/gRPC\s+(\S+)", line):
            grpc_addr = m.group(1)
        if m := re.search(r"HTTP\s+(\S+)", line):
            http_url = m.group(1)
            break
    try:
        assert grpc_addr and http_url and http_url.startswith("https://"), "".join(lines)
        exporter = OTLPSpanExporter(
            endpoint=f"https://{grpc_addr}",
            credentials=grpc.ssl_channel_credentials(crt.read_bytes()),
            headers={"authorization": "Bearer t0k"},
            timeout=10,
        )
        provider = TracerProvider(resource=Resource.create({"service.name": "tls"}))
        results: list[SpanExportResult] = []

        class Recording(SimpleSpanProcessor):
            def on_end(self, span):  # type: ignore[no-untyped-def]
                results.append(exporter.export([span]))

        provider.add_span_processor(Recording(exporter))
        with provider.get_tracer("t").start_as_current_span("over-tls"):
            pass
        provider.shutdown()
        assert results == [SpanExportResult.SUCCESS]
        with httpx.Client(verify=ssl.create_default_context(cafile=crt), timeout=10) as client:
            assert client.get(f"{http_url}/healthz").status_code == 200
            denied = client.post(
                f"{http_url}/v1/traces", content=b"", headers={"content-type": "application/json"}
            )
            assert denied.status_code == 401
            metrics = client.get(f"{http_url}/metrics").text
        assert 'latscope_collector_accepted_total{signal="traces"} 1.0' in metrics
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert proc.returncode == 0
