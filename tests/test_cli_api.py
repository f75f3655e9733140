"""``latscope api``: the API, page and gRPC query service alone, as a separate process."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import grpc
import httpx
import pytest

from latscope.v1 import query_pb2, query_pb2_grpc
from tests.surfaces import dataset_store

pytestmark = pytest.mark.subprocess


def test_api_process_serves_rest_grpc_and_page() -> None:
    store, specs = dataset_store()
    proc = subprocess.Popen(
        [sys.executable, "-m", "latscope.cli", "api", "--store", f"chdb://{store}",
         "--http", "127.0.0.1:0", "--otlp-grpc", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []
    http = grpc_addr = None
    try:
        for line in proc.stdout:
            lines.append(line)
            if m := re.search(r"gRPC query\s+(\S+)", line):
                grpc_addr = m.group(1)
            if m := re.search(r"HTTP\s+(http://\S+)", line):
                http = m.group(1)
            if http and grpc_addr:
                break
        assert http and grpc_addr, "".join(lines)
        summary = httpx.get(f"{http}/v1/attribution/summary", timeout=30).json()
        assert summary["count"] == 41
        assert httpx.get(f"{http}/", timeout=10).status_code == 200
        assert httpx.get(f"{http}/readyz", timeout=10).json() == {"status": "ready"}
        with grpc.insecure_channel(grpc_addr) as channel:
            stub = query_pb2_grpc.QueryServiceStub(channel)
            message = stub.GetAttribution(
                query_pb2.GetAttributionRequest(trace_id=specs[0].trace_id), timeout=30
            )
            assert message.e2e_ms == specs[0].e2e_ms
        proc.send_signal(signal.SIGTERM)
        try:
            rest, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"no exit after SIGTERM:\n{''.join(lines)}{exc.output}") from None
        assert proc.returncode == 0, "".join(lines) + rest
        assert "latscope api: stopped" in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def test_api_process_reports_an_unusable_store() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "latscope.cli", "api", "--store", "ftp://nowhere/db",
         "--http", "127.0.0.1:0", "--otlp-grpc", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "unsupported store DSN" in done.stderr and "Traceback" not in done.stderr
