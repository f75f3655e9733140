"""The REST API for one request, against a real ``latscope serve`` holding a known dataset."""

from __future__ import annotations

import httpx
import pytest

from tests.serve_support import Server
from tests.surfaces import MS

pytestmark = pytest.mark.subprocess


def _get(server: Server, path: str, **params: object) -> httpx.Response:
    return httpx.get(server.url(path), params=params, timeout=30)


def test_attribution_of_one_request_adds_up(served) -> None:
    server, specs = served
    spec = specs[7]  # a llama request with a client span, queue 80 ms
    body = _get(server, f"/v1/requests/{spec.trace_id}/attribution").json()
    assert body["trace_id"] == spec.trace_id
    assert (body["service"], body["model"]) == (spec.service, spec.model)
    for bucket, value in spec.expected_buckets().items():
        assert body["buckets_ms"][bucket] == pytest.approx(value, abs=0.01), bucket
    assert body["e2e_ms"] == pytest.approx(spec.e2e_ms, abs=0.01)
    assert sum(body["buckets_ms"].values()) == pytest.approx(body["e2e_ms"], abs=1e-6)


def test_explain_gives_waterfall_on_the_client_clock_and_tokens(served) -> None:
    server, specs = served
    spec = specs[3]
    body = _get(server, f"/v1/requests/{spec.trace_id.upper()}").json()
    spans = body["spans"]
    assert len(spans) == 2 + len(spec.phases)
    by_name = {s["name"]: s for s in spans}
    client = by_name["POST /v1/chat/completions"]
    assert (client["kind"], client["start_ms"], client["depth"]) == ("Client", 0.0, 0)
    for phase, (start, end) in spec.phases.items():
        assert by_name[phase]["phase"] == phase
        assert by_name[phase]["start_ms"] == pytest.approx(start, abs=0.01)
        assert by_name[phase]["duration_ms"] == pytest.approx(end - start, abs=0.01)
        assert by_name[phase]["depth"] == 2
    assert [s["start_ms"] for s in spans] == sorted(s["start_ms"] for s in spans)
    tokens = body["tokens"]
    decode_start = spec.phases["decode"][0]
    assert tokens["count"] == len(spec.token_offsets_us)
    expected = [decode_start + us / 1000 for us in spec.token_offsets_us]
    assert tokens["times_ms"] == pytest.approx(expected, abs=0.01)
    assert tokens["first_token_ms"] == pytest.approx(decode_start, abs=0.01)
    assert tokens["stalls"] == []
    assert body["attribution"]["output_tokens"] == len(spec.token_offsets_us)


def test_token_stall_is_listed_where_it_happened(served) -> None:
    server, specs = served
    spec = next(s for s in specs if s.model == "llama-3-70b")
    body = _get(server, f"/v1/requests/{spec.trace_id}/tokens").json()
    decode_start = spec.phases["decode"][0]
    (stall,) = body["stalls"]
    assert stall["index"] == 10
    assert stall["gap_ms"] == pytest.approx(420, abs=0.01)
    stalled_at = decode_start + spec.token_offsets_us[10] / 1000
    assert stall["at_ms"] == pytest.approx(stalled_at, abs=0.01)
    attribution = _get(server, f"/v1/requests/{spec.trace_id}/attribution").json()
    assert attribution["stalls"] == 1  # the attributor's count agrees with the timeline
    # A lower threshold: every gap of 20 ms is now a stall too.
    low = _get(server, f"/v1/requests/{spec.trace_id}/tokens", stall_ms=10).json()
    assert len(low["stalls"]) == len(spec.token_offsets_us) - 1


def test_spans_of_a_trace(served) -> None:
    server, specs = served
    spec = specs[31]  # server-only: no client span
    body = _get(server, f"/v1/traces/{spec.trace_id}/spans").json()
    assert body["trace_id"] == spec.trace_id
    assert {s["kind"] for s in body["spans"]} == {"Server", "Internal"}
    server_span = next(s for s in body["spans"] if s["kind"] == "Server")
    assert server_span["start_ms"] == 0.0
    assert server_span["attributes"]["gen_ai.request.model"] == "mistral-7b"
    assert body["start_unix_ms"] == pytest.approx((spec.start_ns + 40 * MS) / 1e6, abs=0.01)


@pytest.mark.parametrize(
    ("path", "params", "status", "error"),
    [
        ("/v1/requests/not-a-trace/attribution", {}, 400, "invalid_request_id"),
        ("/v1/requests/" + "ab" * 16 + "/attribution", {}, 404, "trace_not_found"),
        ("/v1/requests/" + "ab" * 16, {}, 404, "trace_not_found"),
        ("/v1/traces/" + "cd" * 16 + "/spans", {}, 404, "trace_not_found"),
        ("/v1/requests/" + "ab" * 16 + "/tokens", {"stall_ms": -1}, 422, "invalid_request"),
        ("/v1/attribution/summary", {"since": "yesterday"}, 400, "invalid_time"),
        ("/v1/attribution/summary", {"since": "1h", "until": "2h"}, 400, "invalid_time"),
        ("/v1/attribution/summary", {"since": "2020-01-01T00:00:00"}, 400, "invalid_time"),
        ("/v1/attribution/summary", {"since": "3000d"}, 400, "invalid_time"),
        ("/v1/attribution/summary", {"group_by": "1;DROP"}, 400, "invalid_group_by"),
        ("/v1/attribution/tail", {"percentile": 100}, 422, "invalid_request"),
        ("/v1/requests", {"limit": 5000}, 422, "invalid_request"),
        ("/v1/slo", {"objective": "ttft<500"}, 400, "invalid_objective"),
        ("/v1/attribution/compare", {"before_since": "3h"}, 400, "invalid_time"),
        ("/v1/nothing-here", {}, 404, "not_found"),
    ],
)
def test_errors_are_json_with_a_code(served, path, params, status, error) -> None:
    server, _ = served
    response = _get(server, path, **params)
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["error"] == error
    assert body["detail"]


def test_health_readiness_and_page(served) -> None:
    server, _ = served
    assert _get(server, "/healthz").json() == {"status": "ok"}
    assert _get(server, "/readyz").json() == {"status": "ready"}
    page = _get(server, "/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "latscope" in page.text
    assert _get(server, "/static/app.js").status_code == 200
    metrics = _get(server, "/metrics")
    assert metrics.status_code == 200
    assert "latscope_request_bucket_seconds" in metrics.text
