"""REST and gRPC for traces with several inference calls (agent runs), against a real
``latscope serve``: the calls of a trace, each fetched by its request id, the run's critical path,
the waterfall with the calls marked, and requests as they are attributed (``/v1/live``, Watch).
The expected figures are the runs' ground truth (tests/agent_traces.py), not latscope's; gRPC
must give what REST gives."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from latscope.api.grpc_service import attribution_dict, run_dict
from latscope.semconv import BUCKETS
from latscope.v1 import query_pb2, query_pb2_grpc
from tests.agent_surfaces import (
    PARALLEL_SEEDS,
    SINGLE_CALL_SEED,
    export,
    has_parallel_calls,
    recent_run,
    send_runs,
)
from tests.agent_traces import AgentRun
from tests.serve_support import Server, start_serve
from tests.surfaces import FAST_ATTRIBUTION

pytestmark = pytest.mark.subprocess

MS = 1e6


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, list[AgentRun]]]:
    server = start_serve(Path(tmp_path_factory.mktemp("traces")) / "store", *FAST_ATTRIBUTION)
    try:
        yield server, send_runs(server, (*PARALLEL_SEEDS, SINGLE_CALL_SEED))
    finally:
        server.stop()


def _get(server: Server, path: str, **params: object) -> httpx.Response:
    return httpx.get(server.url(path), params=params, timeout=30)


def _ok(server: Server, path: str, **params: object) -> dict:
    r = _get(server, path, **params)
    assert r.status_code == 200, r.text
    return r.json()


def _assert_buckets(got_ms: dict, truth_ns: dict) -> None:
    for bucket in BUCKETS:
        want = truth_ns[bucket]
        if want is None:
            assert got_ms[bucket] is None, bucket
        else:
            assert got_ms[bucket] == pytest.approx(want / MS, abs=1e-6), bucket


def test_every_call_of_a_trace_is_listed_with_its_buckets(served) -> None:
    server, runs = served
    for run in runs[:2]:
        assert has_parallel_calls(run)
        body = _ok(server, f"/v1/traces/{run.trace_id}/requests")
        assert body["trace_id"] == run.trace_id
        got = {r["request_id"]: r for r in body["requests"]}
        assert sorted(got) == sorted(t.request_id for t in run.requests)
        starts = [r["request_id"] for r in body["requests"]]
        assert len(starts) == len(run.requests) >= 4
        for truth in run.requests:
            call = got[truth.request_id]
            assert call["trace_id"] == run.trace_id
            assert call["e2e_ms"] == pytest.approx(truth.e2e_ns / MS, abs=1e-6)
            _assert_buckets(call["buckets_ms"], truth.buckets)
            assert call["client_headers_only"] == truth.headers_only


def test_each_call_is_fetched_by_its_request_id(served) -> None:
    server, runs = served
    run = runs[0]
    listed = {
        r["request_id"]: r for r in _ok(server, f"/v1/traces/{run.trace_id}/requests")["requests"]
    }
    for truth in run.requests:
        rid = truth.request_id
        assert _ok(server, f"/v1/requests/{rid}/attribution") == listed[rid]
        explained = _ok(server, f"/v1/requests/{rid.upper()}")
        assert explained["attribution"] == listed[rid]
        # The waterfall is the whole trace on this call's clock: the call starts at 0.
        marked = [s for s in explained["spans"] if s["request_id"] == rid]
        assert len(marked) == 1 and marked[0]["start_ms"] == pytest.approx(0.0, abs=1e-6)
        tokens = _ok(server, f"/v1/requests/{rid}/tokens")
        assert tokens["request_id"] == rid and tokens["trace_id"] == run.trace_id


def test_a_trace_id_names_a_request_only_when_the_trace_has_one(served) -> None:
    server, runs = served
    run, single = runs[0], runs[-1]
    for path in ("", "/attribution", "/tokens"):
        r = _get(server, f"/v1/requests/{run.trace_id}{path}")
        assert r.status_code == 409, r.text
        body = r.json()
        assert body["error"] == "several_requests"
        assert f"holds {len(run.requests)} inference calls" in body["detail"]
        assert f"/v1/traces/{run.trace_id}/requests" in body["detail"]
        assert run.requests[0].request_id in body["detail"]
    (truth,) = single.requests
    by_trace = _ok(server, f"/v1/requests/{single.trace_id}/attribution")
    assert by_trace == _ok(server, f"/v1/requests/{truth.request_id}/attribution")
    assert by_trace["request_id"] == truth.request_id
    _assert_buckets(by_trace["buckets_ms"], truth.buckets)


def test_the_run_splits_its_critical_path_as_the_truth(served) -> None:
    server, runs = served
    for run in runs:
        body = _ok(server, f"/v1/traces/{run.trace_id}/run")
        path = run.critical_path
        assert body["trace_id"] == run.trace_id
        assert body["root"]["span_id"] == run.root_span_id
        assert body["e2e_ms"] == pytest.approx(path.e2e_ns / MS, abs=1e-6)
        budget = body["critical_path_ms"]
        for bucket in BUCKETS:
            assert budget["llm_buckets"][bucket] == pytest.approx(
                path.llm_ns[bucket] / MS, abs=1e-6
            ), bucket
        assert budget["llm"] == pytest.approx(path.llm_total_ns / MS, abs=1e-6)
        assert budget["tool"] == pytest.approx(path.tool_ns / MS, abs=1e-6)
        assert budget["app"] == pytest.approx(path.app_ns / MS, abs=1e-6)
        assert budget["llm"] + budget["tool"] + budget["app"] == pytest.approx(
            body["e2e_ms"], abs=1e-6
        )
        # Every call is listed; those the root waited for are the truth's calls on the path,
        # and a parallel call it did not wait for has nothing on the path.
        assert sorted(c["request_id"] for c in body["calls"]) == sorted(
            t.request_id for t in run.requests
        )
        on_path = sorted(c["request_id"] for c in body["calls"] if c["on_critical_path_ms"] > 0)
        assert on_path == sorted(path.calls)
        for call in body["calls"]:
            assert sum(call["on_critical_path_buckets_ms"].values()) == pytest.approx(
                call["on_critical_path_ms"], abs=1e-6
            )
            assert call["on_critical_path_ms"] <= call["e2e_ms"] + 1e-6
        on_path_tools = [t["span_id"] for t in body["tools"] if t["on_critical_path_ms"] > 0]
        assert sorted(on_path_tools) == sorted(path.tools)
        steps = body["path"]
        assert [s["start_ms"] for s in steps] == sorted(s["start_ms"] for s in steps)
        assert sum(s["end_ms"] - s["start_ms"] for s in steps) == pytest.approx(
            body["e2e_ms"], abs=1e-6
        )


def test_the_trace_view_is_the_run_and_the_waterfall(served) -> None:
    server, runs = served
    run = runs[1]
    body = _ok(server, f"/v1/traces/{run.trace_id}")
    assert body["run"] == _ok(server, f"/v1/traces/{run.trace_id}/run")
    spans = body["spans"]
    assert len(spans) == len(run.built.spans)
    root = next(s for s in spans if s["span_id"] == run.root_span_id)
    assert root["start_ms"] == 0.0 and root["depth"] == 0
    marked = {s["request_id"] for s in spans if s["request_id"]}
    assert marked == {t.request_id for t in run.requests}
    # Each call's marked span starts where the run says the call starts.
    starts = {c["request_id"]: c["start_ms"] for c in body["run"]["calls"]}
    for s in spans:
        if s["request_id"]:
            assert s["start_ms"] == pytest.approx(starts[s["request_id"]], abs=1e-6)
    assert_depth_first(spans, run.built.spans)


def assert_depth_first(rows: list[dict], stored: list) -> None:
    """Jaeger's order: every span right after its parent's subtree began (its subtree whole,
    before the next sibling), siblings by start, depth one below the parent's."""
    parent = {s.span_id.hex(): s.parent_span_id.hex() for s in stored}  # OTLP: bytes
    position = {r["span_id"]: i for i, r in enumerate(rows)}
    for i, row in enumerate(rows):
        p = parent[row["span_id"]]
        if p not in position:
            assert row["depth"] == 0
            continue
        assert position[p] < i and row["depth"] == rows[position[p]]["depth"] + 1
        # Everything between the parent and this span is the parent's, deeper than this span's
        # siblings, or an earlier sibling's subtree.
        for between in rows[position[p] + 1 : i]:
            assert between["depth"] > rows[position[p]]["depth"]
    siblings: dict[str, list[float]] = {}
    for row in rows:
        siblings.setdefault(parent[row["span_id"]], []).append(row["start_ms"])
    assert all(starts == sorted(starts) for starts in siblings.values())


@pytest.mark.parametrize(
    ("path", "status", "error"),
    [
        ("/v1/traces/" + "ab" * 16 + "/run", 404, "trace_not_found"),
        ("/v1/traces/" + "ab" * 16 + "/requests", 404, "trace_not_found"),
        ("/v1/traces/" + "ab" * 16, 404, "trace_not_found"),
        ("/v1/traces/xyz/run", 400, "invalid_trace_id"),
        ("/v1/requests/" + "ab" * 16 + "-0123", 400, "invalid_request_id"),
    ],
)
def test_trace_errors(served, path: str, status: int, error: str) -> None:
    server, _ = served
    r = _get(server, path)
    assert r.status_code == status, r.text
    assert r.json()["error"] == error


def test_an_unknown_call_of_a_known_trace_names_the_calls(served) -> None:
    server, runs = served
    run = runs[0]
    r = _get(server, f"/v1/requests/{run.trace_id}-{'0' * 16}")
    assert r.status_code == 404
    body = r.json()
    assert body["error"] == "request_not_found"
    for truth in run.requests:
        assert truth.request_id in body["detail"]


def test_live_feed_gives_every_call_once_from_the_cursor(served) -> None:
    server, _ = served
    start = _ok(server, "/v1/live")
    assert start["requests"] == [] and start["missed"] == 0
    run = recent_run(1, ago_s=5)
    export(server.grpc, run)
    want = {t.request_id for t in run.requests}
    got: list[dict] = []
    cursor, epoch = start["cursor"], start["epoch"]
    deadline = time.monotonic() + 60
    # The module's own runs may still be reaching the feed (its poller reads the table a
    # moment after the attributor writes): only this run's calls are counted.
    while not want <= {r["request_id"] for r in got} and time.monotonic() < deadline:
        body = _ok(server, "/v1/live", after=cursor, epoch=epoch, limit=2)
        assert body["epoch"] == epoch and body["missed"] == 0
        assert len(body["requests"]) <= 2
        got += body["requests"]
        cursor = body["cursor"]
        time.sleep(0.2)
    mine = [r for r in got if r["request_id"].startswith(run.trace_id)]
    assert sorted(r["request_id"] for r in mine) == sorted(want)  # every call, each once
    assert len({r["request_id"] for r in got}) == len(got)  # no request twice
    truths = {t.request_id: t for t in run.requests}
    for r in mine:
        assert r["e2e_ms"] == pytest.approx(truths[r["request_id"]].e2e_ns / MS, abs=1e-6)
        assert r["start_unix_nano"] > 0
    # Filters apply; a cursor of another epoch starts over from the oldest kept.
    slow = _ok(server, "/v1/live", after=start["cursor"], epoch=epoch, min_e2e_ms=1e8)
    assert slow["requests"] == []
    again = _ok(server, "/v1/live", after=cursor, epoch="restarted", limit=1000)
    assert want <= {r["request_id"] for r in again["requests"]}


# -- the same answers over gRPC -------------------------------------------------------------------


@pytest.fixture(scope="module")
def stub(served) -> Iterator[query_pb2_grpc.QueryServiceStub]:
    server, _ = served
    with grpc.insecure_channel(server.grpc) as channel:
        yield query_pb2_grpc.QueryServiceStub(channel)


def test_grpc_lists_the_calls_and_explains_the_run_as_rest_does(served, stub) -> None:
    server, runs = served
    for run in runs[:2]:
        listed = stub.ListRequests(query_pb2.ListRequestsRequest(trace_id=run.trace_id), timeout=30)
        rest = _ok(server, f"/v1/traces/{run.trace_id}/requests")
        assert listed.trace_id == rest["trace_id"]
        got = [attribution_dict(m) for m in listed.requests]
        for g in got:
            del g["start_unix_nano"]  # Watch's field
        assert got == rest["requests"]
        message = stub.GetRun(query_pb2.GetRunRequest(trace_id=run.trace_id), timeout=30)
        assert run_dict(message) == _ok(server, f"/v1/traces/{run.trace_id}/run")
        assert message.critical_path_ms.llm + message.critical_path_ms.tool + (
            message.critical_path_ms.app
        ) == pytest.approx(message.e2e_ms, abs=1e-6)
        for truth in run.requests:
            one = stub.GetAttribution(
                query_pb2.GetAttributionRequest(request_id=truth.request_id), timeout=30
            )
            assert one.request_id == truth.request_id
            assert one.e2e_ms == pytest.approx(truth.e2e_ns / MS, abs=1e-6)


def test_grpc_errors_for_traces(served, stub) -> None:
    _, runs = served
    run = runs[0]
    with pytest.raises(grpc.RpcError) as info:
        stub.GetAttribution(query_pb2.GetAttributionRequest(trace_id=run.trace_id), timeout=30)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert run.requests[0].request_id in info.value.details()
    for call, request in (
        (stub.GetRun, query_pb2.GetRunRequest(trace_id="ab" * 16)),
        (stub.ListRequests, query_pb2.ListRequestsRequest(trace_id="ab" * 16)),
    ):
        with pytest.raises(grpc.RpcError) as info:
            call(request, timeout=30)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as info:
        stub.GetRun(query_pb2.GetRunRequest(trace_id="nope"), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_watch_streams_every_call_of_a_trace(served, stub) -> None:
    server, _ = served
    stream = stub.Watch(query_pb2.WatchRequest(), timeout=60)
    got: list[str] = []
    run = recent_run(39, ago_s=5)
    want = {t.request_id for t in run.requests}
    done = threading.Event()

    def read() -> None:
        try:
            for message in stream:
                assert message.request_id.startswith(message.trace_id + "-")
                got.append(message.request_id)
                if want <= set(got):
                    break
        except grpc.RpcError:
            pass
        done.set()

    threading.Thread(target=read, daemon=True).start()
    stream.initial_metadata()  # the server sends its headers once the stream is subscribed
    export(server.grpc, run)
    assert done.wait(45), got
    stream.cancel()
    assert sorted(r for r in got if r in want) == sorted(want)


def test_parallel_calls_list_each_calls_spans_under_it() -> None:
    from latscope.api.trace import _tree_order

    def row(span: str, parent: str, start: float) -> dict:
        return {"span_id": span, "parent_span_id": parent, "start_ms": start, "depth": -1}

    # Two calls started together: each one's phases under it, not interleaved by start.
    rows = [
        row("root", "", 0), row("a", "root", 1), row("b", "root", 1.5),
        row("a-queue", "a", 2), row("b-queue", "b", 2.5), row("a-decode", "a", 3),
        row("b-decode", "b", 3.5), row("gone", "not-stored", 4),
        row("x", "y", 5), row("y", "x", 6), row("self", "self", 7),  # cycles
    ]  # fmt: skip
    got = [(r["span_id"], r["depth"]) for r in _tree_order(rows)]
    assert got == [
        ("root", 0), ("a", 1), ("a-queue", 2), ("a-decode", 2), ("b", 1), ("b-queue", 2),
        ("b-decode", 2), ("gone", 0), ("x", 0), ("y", 1), ("self", 0),
    ]  # fmt: skip
