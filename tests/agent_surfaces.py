"""Agent runs (tests/agent_traces.py) sent to a real ``latscope serve``, for the tests of the
surfaces that show a trace with several calls: REST, gRPC, CLI and the web page."""

from __future__ import annotations

import time

import grpc
import httpx
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from tests.agent_traces import AgentRun, LlmStep, Parallel, agent_run
from tests.serve_support import Server

#: Seeds of runs with calls in parallel (a group of two or more LLM calls) and tools between:
#: 0 (4 calls under an HTTP server and an agent span), 16 (9 calls, two parallel groups).
PARALLEL_SEEDS = (0, 16)
#: A run with one call (its trace id still names the request).
SINGLE_CALL_SEED = 23


def has_parallel_calls(run: AgentRun) -> bool:
    return any(
        isinstance(e, Parallel) and sum(isinstance(b, LlmStep) for b in e.branches) >= 2
        for _, e in run.plan.items
    )


def recent_run(seed: int, *, ago_s: float = 30.0) -> AgentRun:
    """The run of ``seed``, started ``ago_s`` seconds ago (inside every live and time window)."""
    return agent_run(seed, start_ns=time.time_ns() - int(ago_s * 1e9))


def export(target: str, run: AgentRun) -> None:
    """Send the run's spans over OTLP/gRPC; every span accepted."""
    request = trace_service_pb2.ExportTraceServiceRequest(resource_spans=run.built.resource_spans)
    with grpc.insecure_channel(target) as channel:
        reply = trace_service_pb2_grpc.TraceServiceStub(channel).Export(request, timeout=10)
    assert reply.partial_success.rejected_spans == 0, reply.partial_success.error_message


def wait_stored(server: Server, run: AgentRun, timeout: float = 30.0) -> None:
    """Until every span of the run can be read back over REST."""
    want = len(run.built.spans)
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(server.url(f"/v1/traces/{run.trace_id}/spans"), timeout=10)
        if r.status_code == 200 and len(r.json()["spans"]) == want:
            return
        assert time.monotonic() < deadline, (r.status_code, r.text[:300])
        time.sleep(0.1)


def send_runs(server: Server, seeds: tuple[int, ...]) -> list[AgentRun]:
    runs = [recent_run(seed) for seed in seeds]
    for run in runs:
        export(server.grpc, run)
    for run in runs:
        wait_stored(server, run)
    return runs


def wait_runs_attributed(server: Server, runs: list[AgentRun], timeout_s: float = 60.0) -> None:
    """Until every request of ``runs`` can be read back by its id (``send_runs`` waits for the
    spans only: the attributor writes the rows a settle window later)."""
    deadline = time.monotonic() + timeout_s
    for rid in (t.request_id for run in runs for t in run.requests):
        while (
            httpx.get(server.url(f"/v1/requests/{rid}/attribution"), timeout=10).status_code != 200
        ):
            assert time.monotonic() < deadline, f"{rid} never attributed"
            time.sleep(0.1)


def wait_live_caught_up(server: Server, quiet_s: float = 1.5, timeout: float = 60.0) -> None:
    """Until the live feed has shown every request attributed so far: no new request for
    ``quiet_s`` (its poller reads the attribution table a moment after the attributor writes,
    so a test that follows the feed from now would otherwise see earlier runs arrive)."""
    body = httpx.get(server.url("/v1/live"), timeout=10).json()
    cursor, epoch = body["cursor"], body["epoch"]
    deadline = time.monotonic() + timeout
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < quiet_s:
        assert time.monotonic() < deadline, "the live feed kept moving"
        time.sleep(0.25)
        params = {"after": cursor, "epoch": epoch, "limit": 1000}
        body = httpx.get(server.url("/v1/live"), params=params, timeout=10).json()
        if body["requests"]:
            quiet_since = time.monotonic()
        cursor = body["cursor"]
