"""REST and gRPC give the same answers: every query the QueryService answers, asked both ways of
one server over one store (planted requests over three hours, single calls with and without a
client span, agent runs with parallel calls), compared field by field along the proto.

The comparison walks the message's descriptor, not the server's conversion: every field of the
message must be in the REST answer with the same value (an unset optional field is null), and
every key of the REST answer must be a field of the message or named below as REST-only. A key
renamed on one side fails it, as does a value converted wrongly.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from latscope.v1 import query_pb2, query_pb2_grpc
from tests import planted
from tests.agent_surfaces import has_parallel_calls, send_runs
from tests.agent_traces import AgentRun
from tests.serve_support import Server, start_serve
from tests.surfaces import FAST_ATTRIBUTION, RequestSpec, dataset, send, wait_attributed

pytestmark = pytest.mark.subprocess

#: Requests ``planted.write_all`` writes (slow_pod, long_prompts, scale_up).
PLANTED = 10_000
#: Agent runs: parallel LLM calls, and one call alone.
RUN_SEEDS = (1, 2, 7)
#: From ``surfaces.dataset``: a call with a client span and GPU figures, one server-only
#: (network unknown), one with an inter-token stall.
SPEC_INDEXES = (4, 33, 60)
#: From ``surfaces.dataset``, sent again under a model of their own while Watch and /v1/live
#: follow it: a call with a client span and GPU figures, and one server-only.
LIVE_SPECS = (5, 34)
#: What the REST summary answers beyond ``SummaryResponse`` (the message has no field for it).
SUMMARY_REST_ONLY = frozenset(
    {"with_client", "streaming", "group_by", "window", "groups.with_client", "groups.streaming"}
)
#: Watch's field: when the request started; GetAttribution leaves it 0 (REST has start_ms
#: on a run's calls instead).
WATCH_ONLY = frozenset({"start_unix_nano"})


@dataclass
class Served:
    server: Server
    stub: query_pb2_grpc.QueryServiceStub
    runs: list[AgentRun]
    specs: list[RequestSpec]
    #: Once everything sent was attributed: the summaries' windows end there (absolute
    #: instants, so that both calls of a comparison cover the same window).
    now: datetime

    def rest(self, path: str, **params: Any) -> dict[str, Any]:
        r = httpx.get(self.server.url(path), params=params, timeout=60)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
        return r.json()


def _wait_spans(served: Served, spec: RequestSpec, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while (
        httpx.get(served.server.url(f"/v1/traces/{spec.trace_id}/spans"), timeout=10).status_code
        != 200
    ):
        assert time.monotonic() < deadline, f"trace {spec.trace_id} not stored"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    store = planted.store_dir(time.time_ns())
    server = start_serve(store, *FAST_ATTRIBUTION)
    try:
        with grpc.insecure_channel(server.grpc) as channel:
            runs = send_runs(server, RUN_SEEDS)
            everything = dataset(time.time_ns())
            specs = send(server.grpc, [everything[i] for i in SPEC_INDEXES])
            out = Served(
                server,
                query_pb2_grpc.QueryServiceStub(channel),
                runs,
                specs,
                datetime.now(UTC),  # set again once everything is attributed
            )
            for spec in specs:
                _wait_spans(out, spec)
            # Every call attributed before any answer is compared: a row landing between the
            # two calls of a comparison would change the second answer.
            calls = sum(
                len(out.rest(f"/v1/traces/{r.trace_id}/requests")["requests"]) for r in runs
            )
            wait_attributed(server, PLANTED + len(specs) + calls)
            out.now = datetime.now(UTC)
            yield out
    finally:
        server.stop()
        shutil.rmtree(store.parent, ignore_errors=True)


# -- the comparison ---------------------------------------------------------------------------


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _same(
    message: Message,
    rest: Mapping[str, Any],
    *,
    rest_only: frozenset[str] = frozenset(),
    grpc_only: frozenset[str] = frozenset(),
    path: str = "",
) -> list[str]:
    """Where ``message`` and the REST JSON ``rest`` of the same answer differ (empty: nowhere).
    ``rest_only`` / ``grpc_only``: dotted paths (no indexes) the other side has no field for."""
    problems: list[str] = []
    fields = message.DESCRIPTOR.fields_by_name
    for key in rest:
        if key not in fields and f"{path}{key}" not in rest_only:
            problems.append(f"{path}{key}: in REST, not in {message.DESCRIPTOR.name}")
    for name, field in fields.items():
        where = f"{path}{name}"
        if where in grpc_only:
            if message.ListFields() and name in {f.name for f, _ in message.ListFields()}:
                problems.append(f"{where}: set on gRPC, which REST does not have")
            continue
        if name not in rest:
            problems.append(f"{where}: in {message.DESCRIPTOR.name}, not in REST")
            continue
        want, got = rest[name], getattr(message, name)
        if _is_map(field):
            problems += _same_map(field, got, want, where, rest_only, grpc_only)
        elif field.is_repeated:
            if len(got) != len(want):
                problems.append(f"{where}: {len(got)} items on gRPC, {len(want)} on REST")
                continue
            for i, (g, w) in enumerate(zip(got, want, strict=True)):
                if field.message_type is not None:
                    problems += _same(
                        g, w, rest_only=rest_only, grpc_only=grpc_only, path=f"{where}."
                    )
                elif g != w:
                    problems.append(f"{where}[{i}]: {g!r} on gRPC, {w!r} on REST")
        elif field.message_type is not None:
            if not isinstance(want, Mapping):
                problems.append(f"{where}: {want!r} on REST, a message on gRPC")
            else:
                problems += _same(got, want, rest_only=rest_only, grpc_only=grpc_only,
                                  path=f"{where}.")  # fmt: skip
        elif want is None:
            if not field.has_presence or message.HasField(name):
                problems.append(f"{where}: {got!r} on gRPC, null on REST")
        elif field.has_presence and not message.HasField(name):
            problems.append(f"{where}: unset on gRPC, {want!r} on REST")
        elif got != want:
            problems.append(f"{where}: {got!r} on gRPC, {want!r} on REST")
    return problems


def _same_map(
    field: FieldDescriptor,
    got: Any,
    want: Any,
    where: str,
    rest_only: frozenset[str],
    grpc_only: frozenset[str],
) -> list[str]:
    if not isinstance(want, Mapping) or set(got) != set(want):
        return [f"{where}: keys {sorted(got)} on gRPC, {want!r} on REST"]
    value = field.message_type.fields_by_name["value"]
    problems: list[str] = []
    for key in want:
        if value.message_type is None:
            if got[key] != want[key]:
                problems.append(f"{where}[{key}]: {got[key]!r} on gRPC, {want[key]!r} on REST")
        elif value.message_type.name == "GpuFigures":  # REST: phase -> figures, no wrapper
            if dict(got[key].figures) != want[key]:
                problems.append(f"{where}[{key}]: {dict(got[key].figures)} != {want[key]}")
        else:
            problems += _same(got[key], want[key], rest_only=rest_only, grpc_only=grpc_only,
                              path=f"{where}.")  # fmt: skip
    return problems


def test_the_comparison_finds_a_renamed_key_and_a_wrong_value() -> None:
    """The comparison itself: it cannot pass what differs."""
    message = query_pb2.PathStep(span_id="a", name="chat", category="llm", start_ms=1, end_ms=2)
    rest = {"span_id": "a", "name": "chat", "category": "llm", "bucket": None,
            "request_id": None, "start_ms": 1.0, "end_ms": 2.0}  # fmt: skip
    assert _same(message, rest) == []
    renamed = {**{k: v for k, v in rest.items() if k != "end_ms"}, "stop_ms": 2.0}
    assert _same(message, renamed) == [
        "stop_ms: in REST, not in PathStep",
        "end_ms: in PathStep, not in REST",
    ]
    assert _same(message, {**rest, "bucket": "queue"}) == ["bucket: unset on gRPC, 'queue' on REST"]
    assert _same(message, {**rest, "start_ms": 1.5}) == ["start_ms: 1.0 on gRPC, 1.5 on REST"]


# -- the queries ------------------------------------------------------------------------------


def _request_ids(served: Served) -> list[str]:
    ids = [spec.trace_id for spec in served.specs]
    for run in served.runs:
        listed = served.rest(f"/v1/traces/{run.trace_id}/requests")
        ids += [r["request_id"] for r in listed["requests"]]
    return ids


def test_get_attribution_agrees(served: Served) -> None:
    assert any(has_parallel_calls(run) for run in served.runs)
    ids = _request_ids(served)
    assert len(ids) > len(served.specs) + len(served.runs)
    for request_id in ids:
        rest = served.rest(f"/v1/requests/{request_id}/attribution")
        message = served.stub.GetAttribution(
            query_pb2.GetAttributionRequest(request_id=request_id), timeout=30
        )
        assert _same(message, rest, grpc_only=WATCH_ONLY) == [], request_id
    # The planted shapes are in there: network unknown, GPU figures, a stall.
    answers = [served.rest(f"/v1/requests/{s.trace_id}/attribution") for s in served.specs]
    assert any(a["buckets_ms"]["network"] is None for a in answers)
    assert any(a["gpu"] for a in answers)
    assert any(a["stalls"] for a in answers)


def test_list_requests_and_get_run_agree(served: Served) -> None:
    tools = 0
    for run in served.runs:
        rest = served.rest(f"/v1/traces/{run.trace_id}/requests")
        message = served.stub.ListRequests(
            query_pb2.ListRequestsRequest(trace_id=run.trace_id), timeout=30
        )
        assert rest["requests"]
        assert _same(message, rest, grpc_only=frozenset({"requests.start_unix_nano"})) == []
        rest = served.rest(f"/v1/traces/{run.trace_id}/run")
        message = served.stub.GetRun(query_pb2.GetRunRequest(trace_id=run.trace_id), timeout=30)
        assert rest["path"]
        tools += len(rest["tools"])
        grpc_only = frozenset({"calls.attribution.start_unix_nano"})
        assert _same(message, rest, grpc_only=grpc_only) == [], run.trace_id
    assert tools


def _at(now: datetime, ago: timedelta) -> str:
    """An absolute instant, so both calls cover the same window."""
    return (now - ago).isoformat().replace("+00:00", "Z")


H = timedelta(hours=1)


@pytest.mark.parametrize(
    "window",
    [
        {"since": 4 * H, "until": 0 * H},
        {"since": 4 * H, "until": 0 * H, "group_by": "service"},
        {"since": 4 * H, "until": 0 * H, "group_by": "resource.k8s.pod.name", "exact": True},
        {"since": H / 2, "until": 0 * H, "service": "chat", "model": "llama-3-8b"},
        {"since": 30 * 24 * H, "until": 20 * 24 * H, "group_by": "model"},  # none
    ],
    ids=["window", "by-service", "by-pod-exact", "filtered", "empty"],
)
def test_summary_agrees(served: Served, window: dict[str, Any]) -> None:
    # Windows end when the fixture had everything attributed (not when tests were collected).
    params = {k: _at(served.now, v) if isinstance(v, timedelta) else v for k, v in window.items()}
    rest = served.rest("/v1/attribution/summary", **params)
    message = served.stub.Summary(query_pb2.SummaryRequest(**params), timeout=60)
    # The proto carries the window as since and until at the top.
    rest_mapped = {**rest, "since": rest["window"]["since"], "until": rest["window"]["until"]}
    assert _same(message, rest_mapped, rest_only=SUMMARY_REST_ONLY) == []
    if params.get("group_by") in ("service", "resource.k8s.pod.name"):
        assert len(rest["groups"]) >= 3
    if window["since"] == 4 * H:
        assert rest["count"] > PLANTED


def test_watch_agrees_with_the_live_feed(served: Served) -> None:
    """Requests attributed while both watch: the Watch stream and /v1/live carry the same."""
    model = "agreement-model"
    start = served.rest("/v1/live")
    stream = served.stub.Watch(query_pb2.WatchRequest(model=model), timeout=60)
    streamed: list[query_pb2.RequestAttribution] = []
    done = threading.Event()

    def read() -> None:
        try:
            for message in stream:
                streamed.append(message)
                if len(streamed) == len(LIVE_SPECS):
                    break
        except grpc.RpcError:
            pass
        done.set()

    threading.Thread(target=read, daemon=True).start()
    stream.initial_metadata()  # the server sends its headers once the stream is subscribed
    everything = dataset(time.time_ns())
    send(served.server.grpc, [replace(everything[i], model=model) for i in LIVE_SPECS])
    polled: list[dict[str, Any]] = []
    cursor, deadline = start["cursor"], time.monotonic() + 60
    while len(polled) < len(LIVE_SPECS) and time.monotonic() < deadline:
        body = served.rest("/v1/live", after=cursor, epoch=start["epoch"], model=model)
        polled += body["requests"]
        cursor = body["cursor"]
        time.sleep(0.2)
    assert done.wait(60)
    stream.cancel()
    assert len(polled) == len(streamed) == len(LIVE_SPECS)
    by_id = {r["request_id"]: r for r in polled}
    for message in streamed:
        assert _same(message, by_id[message.request_id]) == [], message.request_id
