"""A long agent run in one trace, against a real ``latscope serve``: every trace route answers it
right (each call as the same call alone in its trace, the run's critical path as the generator
laid it out), and a trace past ``--max-trace-spans`` gets a 422 naming the cap on every route,
REST and gRPC. How long the answers take is ``bench/api/traces.py``'s to say."""

from __future__ import annotations

import gzip
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from bench.api.wide import (
    CALL_MS,
    GAP_MS,
    STEP_MS,
    T0,
    TOOL_MS,
    span_count,
    wide_run,
    with_prompts,
)
from latscope.api.grpc_service import run_dict
from latscope.api.routes.params import BODY_CHUNK, GZIP_MIN_BYTES
from latscope.api.trace_state import SHOWN_BYTES_PER_SPAN
from latscope.attribution.queries import ATTRIBUTE_CHARS
from latscope.cli import main
from latscope.cmd.explain import MAX_SPAN_ROWS
from latscope.v1 import query_pb2, query_pb2_grpc
from tests.serve_support import Server, start_serve

pytestmark = pytest.mark.subprocess

CAP = 1_500
WIDE = 200  # calls: 1,201 spans, under the cap
PAST = 300  # calls: 1,801 spans, past it
TRACES = {"one": (bytes.fromhex("0a" * 16), 1), "wide": (bytes.fromhex("0b" * 16), WIDE),
          "past": (bytes.fromhex("0c" * 16), PAST)}  # fmt: skip
#: A run whose every span carries a prompt and a completion of ``PROMPT_KB`` kB (19 MB in all).
PROMPTS, PROMPT_KB = (bytes.fromhex("0d" * 16), 100), 16


def _first_call(trace_id: bytes, calls: int) -> str:
    """The request id of the run's first call (its CLIENT span's), as the fixture sent it."""
    seed = [t for t, _ in TRACES.values()].index(trace_id)
    for export in wide_run(trace_id, calls, seed=seed):
        for rs in export.resource_spans:
            for span in rs.scope_spans[0].spans:
                if span.kind == 3:
                    return f"{trace_id.hex()}-{span.span_id.hex()}"
    raise AssertionError("no call")


def _get(server: Server, path: str) -> httpx.Response:
    return httpx.get(server.url(path), timeout=60)


def _ok(server: Server, path: str) -> dict:
    r = _get(server, path)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_serve(
        Path(tmp_path_factory.mktemp("wide")) / "store",
        "--max-trace-spans", str(CAP), "--max-span-age-s", "0", "--max-span-future-s", "0",
    )  # fmt: skip
    try:
        with grpc.insecure_channel(server.grpc) as channel:
            export = channel.unary_unary(
                "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                request_serializer=None,
                response_deserializer=None,
            )
            for i, (trace_id, calls) in enumerate(TRACES.values()):
                for message in wide_run(trace_id, calls, per_export=500, seed=i):
                    export(message.SerializeToString(), timeout=60)
            for payload in with_prompts(wide_run(*PROMPTS, per_export=100, seed=9), PROMPT_KB):
                export(payload, timeout=60)

        def stored() -> bool:
            for trace_id, calls in (TRACES["one"], TRACES["wide"], PROMPTS):
                r = _get(server, f"/v1/traces/{trace_id.hex()}/spans")
                if r.status_code != 200 or len(r.json()["spans"]) != span_count(calls):
                    return False
            past = _get(server, f"/v1/traces/{TRACES['past'][0].hex()}/spans")
            return past.status_code == 422

        deadline = time.monotonic() + 120
        while not stored():
            assert time.monotonic() < deadline, "the runs were not stored"
            time.sleep(0.2)
        yield server
    finally:
        server.stop()


def test_every_call_of_a_wide_run_is_attributed_as_alone(served) -> None:
    wide = TRACES["wide"][0].hex()
    (alone,) = _ok(served, f"/v1/traces/{TRACES['one'][0].hex()}/requests")["requests"]
    calls = _ok(served, f"/v1/traces/{wide}/requests")["requests"]
    assert len(calls) == WIDE
    assert alone["e2e_ms"] == CALL_MS
    for call in calls:
        assert call["trace_id"] == wide
        assert call["e2e_ms"] == alone["e2e_ms"]
        assert call["buckets_ms"] == alone["buckets_ms"]
        assert call["itl_ms"] == alone["itl_ms"] and call["output_tokens"] == 64
    first = _first_call(*TRACES["wide"])
    assert calls[0]["request_id"] == first
    # A call's own routes give what the trace's list gives.
    assert _ok(served, f"/v1/requests/{first}/attribution") == calls[0]
    page = _ok(served, f"/v1/requests/{first}")
    assert page["attribution"] == calls[0]
    assert len(page["spans"]) == span_count(WIDE)
    assert page["tokens"]["count"] == len(page["tokens"]["times_ms"]) == 64
    marked = [s for s in page["spans"] if s["request_id"] == first]
    assert len(marked) == 1 and marked[0]["start_ms"] == 0.0


def test_the_run_of_a_wide_trace_is_its_critical_path(served) -> None:
    wide = TRACES["wide"][0].hex()
    run = _ok(served, f"/v1/traces/{wide}/run")
    e2e = WIDE * STEP_MS + GAP_MS
    assert run["e2e_ms"] == e2e
    budget = run["critical_path_ms"]
    assert budget["llm"] == WIDE * CALL_MS
    assert budget["tool"] == WIDE * TOOL_MS
    assert budget["app"] == e2e - WIDE * (CALL_MS + TOOL_MS)
    assert len(run["calls"]) == len(run["tools"]) == WIDE
    for step, call in enumerate(run["calls"]):
        assert call["start_ms"] == step * STEP_MS + GAP_MS
        assert call["on_critical_path_ms"] == CALL_MS
    assert all(t["on_critical_path_ms"] == TOOL_MS for t in run["tools"])
    steps = run["path"]
    assert [s["start_ms"] for s in steps] == sorted(s["start_ms"] for s in steps)
    assert sum(s["end_ms"] - s["start_ms"] for s in steps) == pytest.approx(e2e, abs=1e-6)
    # gRPC answers as REST does.
    with grpc.insecure_channel(served.grpc) as channel:
        stub = query_pb2_grpc.QueryServiceStub(channel)
        assert run_dict(stub.GetRun(query_pb2.GetRunRequest(trace_id=wide), timeout=60)) == run


def test_the_trace_view_of_a_wide_run_is_its_run_and_every_span(served) -> None:
    wide = TRACES["wide"][0].hex()
    body = _ok(served, f"/v1/traces/{wide}")
    assert body["run"] == _ok(served, f"/v1/traces/{wide}/run")
    spans = body["spans"]
    assert spans == _ok(served, f"/v1/traces/{wide}/spans")["spans"]
    # The root, a CLIENT span and a tool per step under it, the server under each client and
    # its three phases under that.
    assert Counter(s["depth"] for s in spans) == {0: 1, 1: 2 * WIDE, 2: WIDE, 3: 3 * WIDE}
    assert spans[0]["depth"] == 0 and spans[0]["start_ms"] == 0.0
    assert sum(1 for s in spans if s["request_id"]) == WIDE


def test_a_run_carrying_prompts_is_answered_with_them_cut_and_attributed_whole(served) -> None:
    """Each prompt and completion shown as its first ``ATTRIBUTE_CHARS`` characters and its
    length: the answers are a small part of the 19 MB the spans hold, and each call is attributed
    as the same call without them."""
    trace_id, calls = PROMPTS
    spans = _ok(served, f"/v1/traces/{trace_id.hex()}/spans")["spans"]
    assert len(spans) == span_count(calls)
    for span in spans:
        for key in ("gen_ai.prompt", "gen_ai.completion"):
            value = span["attributes"][key]
            assert value.endswith(f"...[{PROMPT_KB * 1024} characters]")
            assert len(value) == ATTRIBUTE_CHARS + len(f"...[{PROMPT_KB * 1024} characters]")
    (alone,) = _ok(served, f"/v1/traces/{TRACES['one'][0].hex()}/requests")["requests"]
    got = _ok(served, f"/v1/traces/{trace_id.hex()}/requests")["requests"]
    assert len(got) == calls
    assert all(c["buckets_ms"] == alone["buckets_ms"] for c in got)
    assert all(c["itl_ms"] == alone["itl_ms"] and c["output_tokens"] == 64 for c in got)
    for path in ("", "/spans", "/run", "/requests"):
        body = _get(served, f"/v1/traces/{trace_id.hex()}{path}").content
        assert len(body) < 2_000_000, (path, len(body))


PAST_ROUTES = (
    "/v1/traces/{t}",
    "/v1/traces/{t}/run",
    "/v1/traces/{t}/requests",
    "/v1/traces/{t}/spans",
    "/v1/requests/{r}",
    "/v1/requests/{r}/attribution",
    "/v1/requests/{r}/tokens",
)


@pytest.mark.parametrize("route", PAST_ROUTES)
def test_a_trace_past_the_cap_is_refused_naming_the_cap(served, route: str) -> None:
    trace_id, calls = TRACES["past"]
    r = _get(served, route.format(t=trace_id.hex(), r=_first_call(trace_id, calls)))
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["error"] == "trace_too_large"
    assert f"more than {CAP:,} spans" in body["detail"]
    assert "--max-trace-spans" in body["detail"]


def test_grpc_refuses_a_trace_past_the_cap(served) -> None:
    trace_id, calls = TRACES["past"]
    with grpc.insecure_channel(served.grpc) as channel:
        stub = query_pb2_grpc.QueryServiceStub(channel)
        for call, request in (
            (stub.GetRun, query_pb2.GetRunRequest(trace_id=trace_id.hex())),
            (stub.ListRequests, query_pb2.ListRequestsRequest(trace_id=trace_id.hex())),
            (stub.GetAttribution,
             query_pb2.GetAttributionRequest(request_id=_first_call(trace_id, calls))),
        ):  # fmt: skip
            with pytest.raises(grpc.RpcError) as info:
                call(request, timeout=60)
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "--max-trace-spans" in info.value.details()


def test_explain_draws_a_wide_run_s_first_spans_and_counts_the_rest(served, capsys) -> None:
    wide = TRACES["wide"][0].hex()
    assert main(["explain", wide, "--url", served.http]) == 0
    out = capsys.readouterr().out
    assert f"{WIDE} inference call(s), {WIDE} tool call(s)" in out
    more = span_count(WIDE) - MAX_SPAN_ROWS
    assert f"… and {more} more spans (--json or the web page shows all)" in out


def _raw(server: Server, path: str, accept: str) -> tuple[httpx.Headers, bytes]:
    """The answer's headers and its body as sent (not decoded)."""
    with httpx.stream(
        "GET", server.url(path), headers={"Accept-Encoding": accept}, timeout=60
    ) as r:
        assert r.status_code == 200
        return r.headers, b"".join(r.iter_raw())


def test_an_answer_larger_than_a_piece_arrives_whole(served) -> None:
    """Sent to the HTTP server in pieces of ``BODY_CHUNK`` bytes, the trace view arrives as one
    body of its ``Content-Length``, the same JSON."""
    wide = TRACES["wide"][0].hex()
    headers, plain = _raw(served, f"/v1/traces/{wide}", "identity")
    assert int(headers["content-length"]) == len(plain) > 2 * BODY_CHUNK
    assert json.loads(plain) == _ok(served, f"/v1/traces/{wide}")


@pytest.mark.parametrize("route", ["", "/spans", "/run", "/requests"])
def test_a_wide_trace_s_answers_go_gzip_compressed_to_clients_that_take_it(
    served, route: str
) -> None:
    """Compressed, the answer is the same JSON; a client without gzip (or refusing it) gets it
    plain, and a small answer goes plain whatever the client takes."""
    wide = TRACES["wide"][0].hex()
    plain_headers, plain = _raw(served, f"/v1/traces/{wide}{route}", "identity")
    assert "content-encoding" not in plain_headers
    assert int(plain_headers["content-length"]) == len(plain) >= GZIP_MIN_BYTES
    # The first compressed answer may go as it is compressed (chunked, no length): what it sent
    # is kept, and the next askers get it whole, with its length.
    for accept in ("gzip", "br, gzip;q=0.5", "*"):
        headers, packed = _raw(served, f"/v1/traces/{wide}{route}", accept)
        assert headers["content-encoding"] == "gzip" and headers["vary"] == "Accept-Encoding"
        if "content-length" not in headers:
            assert accept == "gzip" and headers["transfer-encoding"] == "chunked"
        else:
            assert int(headers["content-length"]) == len(packed)
        assert len(packed) < len(plain) / 5 and gzip.decompress(packed) == plain
    for refused in ("gzip;q=0, deflate", "gzip; q=0.000", "gzip;q=x"):
        headers, body = _raw(served, f"/v1/traces/{wide}{route}", refused)
        assert "content-encoding" not in headers and body == plain
    one = TRACES["one"][0].hex()
    headers, body = _raw(served, f"/v1/traces/{one}{route}", "gzip")
    assert "content-encoding" not in headers and len(body) < GZIP_MIN_BYTES
    assert _ok(served, f"/v1/traces/{one}{route}") == json.loads(body)


def _sent(payloads: list[bytes]) -> dict[str, tuple[Span, dict[str, str]]]:
    """Each span of the Exports by its id (hex), with its resource's attributes."""
    out = {}
    for payload in payloads:
        message = ExportTraceServiceRequest.FromString(payload)
        for rs in message.resource_spans:
            resource = {kv.key: _text(kv.value) for kv in rs.resource.attributes}
            for span in rs.scope_spans[0].spans:
                out[span.span_id.hex()] = (span, resource)
    return out


def _text(value: AnyValue) -> str:
    return value.string_value if value.HasField("string_value") else str(value.int_value)


def test_a_span_is_read_whole_as_it_was_sent(served) -> None:
    """``/v1/traces/{t}/spans/{s}``: a span of the run carrying prompts with every value whole,
    as sent, where the trace's answers show it cut; and a span of a trace past the cap."""
    trace_id, _ = PROMPTS
    sent = _sent(with_prompts(wide_run(*PROMPTS, per_export=100, seed=9), PROMPT_KB))
    shown = {s["span_id"]: s for s in _ok(served, f"/v1/traces/{trace_id.hex()}/spans")["spans"]}
    assert shown.keys() == sent.keys()
    for span_id in [*list(sent)[:3], *list(sent)[-3:]]:
        span, resource = sent[span_id]
        # Any case: ids are hex.
        got = _ok(served, f"/v1/traces/{trace_id.hex().upper()}/spans/{span_id.upper()}")
        want_attributes = {kv.key: _text(kv.value) for kv in span.attributes}
        assert got == {
            "trace_id": trace_id.hex(), "span_id": span_id,
            "parent_span_id": span.parent_span_id.hex(), "name": span.name,
            "kind": shown[span_id]["kind"], "service": resource["service.name"],
            "start_unix_ns": span.start_time_unix_nano,
            "duration_ms": (span.end_time_unix_nano - span.start_time_unix_nano) / 1e6,
            "status": "Unset", "status_message": "", "attributes": want_attributes,
            "resource": resource, "events": [], "links": [],
        }  # fmt: skip
        prompt = got["attributes"]["gen_ai.prompt"]
        assert len(prompt) == PROMPT_KB * 1024
        cut = shown[span_id]["attributes"]["gen_ai.prompt"]
        assert cut == f"{prompt[:ATTRIBUTE_CHARS]}...[{len(prompt)} characters]"
    past, calls = TRACES["past"]
    span_id = wide_run(past, calls, seed=2)[0].resource_spans[0].scope_spans[0].spans[0].span_id
    got = _ok(served, f"/v1/traces/{past.hex()}/spans/{span_id.hex()}")
    assert got["span_id"] == span_id.hex() and got["name"].startswith("invoke_agent")


def _sent_alone(served: Server, resource: Resource, spans: list[Span]) -> httpx.Response:
    """``spans`` under ``resource`` sent in one Export over OTLP/gRPC; the answer about the last
    of them (``/v1/traces/{t}/spans/{s}``) once it is stored."""
    message = ExportTraceServiceRequest(resource_spans=[
        ResourceSpans(resource=resource, scope_spans=[ScopeSpans(spans=spans)])])  # fmt: skip
    with grpc.insecure_channel(served.grpc) as channel:
        channel.unary_unary(
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            request_serializer=None, response_deserializer=None,
        )(message.SerializeToString(), timeout=60)  # fmt: skip
    last = spans[-1]
    path = f"/v1/traces/{last.trace_id.hex()}/spans/{last.span_id.hex()}"
    deadline = time.monotonic() + 60
    while (r := _get(served, path)).status_code == 404:
        assert r.json()["error"] == "span_not_found"
        assert time.monotonic() < deadline, "the spans were not stored"
        time.sleep(0.2)
    return r


def test_a_span_keeps_its_events_links_status_and_resource(served) -> None:
    trace_id, span_id, linked = bytes(range(16)), bytes(range(8)), bytes(range(16, 32))
    span = Span(
        trace_id=trace_id, span_id=span_id, parent_span_id=b"\x07" * 8, name="retrieve",
        kind=Span.SPAN_KIND_CLIENT, start_time_unix_nano=T0, end_time_unix_nano=T0 + 5_000_000,
        attributes=[KeyValue(key="db.query.text", value=AnyValue(string_value="é" * 3000))],
        events=[Span.Event(time_unix_nano=T0 + 1_000, name="hit", attributes=[
            KeyValue(key="doc", value=AnyValue(string_value="d" * 500))])],
        links=[Span.Link(trace_id=linked, span_id=b"\x09" * 8, attributes=[
            KeyValue(key="why", value=AnyValue(string_value="follows"))])],
        status=Status(code=Status.STATUS_CODE_ERROR, message="index offline"),
    )  # fmt: skip
    resource = Resource(attributes=[
        KeyValue(key="service.name", value=AnyValue(string_value="rag")),
        KeyValue(key="k8s.pod.name", value=AnyValue(string_value="rag-0"))])  # fmt: skip
    r = _sent_alone(served, resource, [span])
    assert r.status_code == 200, r.text
    got = r.json()
    assert (got["kind"], got["service"], got["status"], got["status_message"]) == (
        "Client", "rag", "Error", "index offline")  # fmt: skip
    assert got["attributes"] == {"db.query.text": "é" * 3000}
    assert got["resource"] == {"service.name": "rag", "k8s.pod.name": "rag-0"}
    assert got["events"] == [
        {"name": "hit", "at_unix_ns": T0 + 1_000, "attributes": {"doc": "d" * 500}}
    ]
    assert got["links"] == [
        {"trace_id": linked.hex(), "span_id": "09" * 8, "attributes": {"why": "follows"}}
    ]


@pytest.mark.parametrize(
    ("path", "status", "error"),
    [
        ("/v1/traces/" + "0b" * 16 + "/spans/xyz", 400, "invalid_span_id"),
        ("/v1/traces/" + "0b" * 16 + "/spans/" + "0" * 17, 400, "invalid_span_id"),
        ("/v1/traces/xyz/spans/" + "0" * 16, 400, "invalid_trace_id"),
        ("/v1/traces/" + "0b" * 16 + "/spans/" + "0" * 16, 404, "span_not_found"),
        ("/v1/traces/" + "ef" * 16 + "/spans/" + "0" * 16, 404, "span_not_found"),
    ],
)
def test_a_span_asked_wrong_is_a_clear_error(served, path: str, status: int, error: str) -> None:
    r = _get(served, path)
    assert r.status_code == status, r.text
    assert r.json()["error"] == error and r.json()["detail"]


def test_a_trace_whose_values_pass_the_byte_budget_is_refused_naming_it(served) -> None:
    """200 values of 300 characters a span: each cut to 256, a 100-span trace still reads as
    more than ``SHOWN_BYTES_PER_SPAN`` bytes a span at ``--max-trace-spans`` (``CAP``), so its
    answers are a 422 naming the budget, refused by ClickHouse before Python holds the rows; one
    of its spans still reads whole."""
    trace_id = bytes.fromhex("0e" * 16)
    spans = [
        Span(
            trace_id=trace_id, span_id=(i + 1).to_bytes(8, "big"), name=f"step {i}",
            kind=Span.SPAN_KIND_INTERNAL, start_time_unix_nano=T0 + i * 1_000_000,
            end_time_unix_nano=T0 + (i + 1) * 1_000_000,
            attributes=[KeyValue(key=f"doc.{k}", value=AnyValue(string_value=f"{k:03d}" * 100))
                        for k in range(200)],
        )
        for i in range(100)
    ]  # fmt: skip
    resource = Resource(
        attributes=[KeyValue(key="service.name", value=AnyValue(string_value="rag"))]
    )
    assert 100 * 200 * ATTRIBUTE_CHARS > CAP * SHOWN_BYTES_PER_SPAN
    _sent_alone(served, resource, spans)
    for path in ("", "/spans", "/run", "/requests"):
        r = _get(served, f"/v1/traces/{trace_id.hex()}{path}")
        assert r.status_code == 422, (path, r.text)
        body = r.json()
        assert body["error"] == "trace_too_large"
        assert f"more than {CAP * SHOWN_BYTES_PER_SPAN:,} bytes" in body["detail"]
        assert "/spans/{span_id}" in body["detail"]
    whole = _ok(served, f"/v1/traces/{trace_id.hex()}/spans/{spans[-1].span_id.hex()}")
    assert whole["attributes"]["doc.7"] == "007" * 100 and len(whole["attributes"]) == 200
