"""Over time, the heatmap, what is different and cold starts through a real ``latscope serve``
(REST) and the CLI (``latscope why``, ``latscope timeline``), on a store with planted causes."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator

import httpx
import pytest

from latscope.cli import main
from latscope.semconv import BUCKETS
from tests import planted
from tests.serve_support import Server, start_serve

pytestmark = pytest.mark.subprocess

S = 10**9


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Server, int]]:
    until = time.time_ns() - 60 * S
    path = planted.store_dir(until)
    # The rows are attributed already: no attributor (it would attribute the tenant spans again).
    server = start_serve(
        path, "--attributor", "off", "--warmup-requests", "0", "--warmup-s", str(planted.COLD_S)
    )
    try:
        yield server, until
    finally:
        server.stop()
        shutil.rmtree(path.parent, ignore_errors=True)


def get(server: Server, path: str, **params: object) -> httpx.Response:
    return httpx.get(server.url(path), params=params, timeout=60)


def ok(server: Server, path: str, **params: object) -> dict:
    response = get(server, path, **params)
    assert response.status_code == 200, response.text
    return response.json()


def test_timeseries_and_heatmap(served) -> None:
    server, _ = served
    body = ok(server, "/v1/attribution/timeseries", since="4h", service="chat", step="10m",
              group_by="resource.k8s.pod.name", limit_groups=8)  # fmt: skip
    assert body["step_s"] == 600
    total, *pods = body["series"]
    assert total["count"] == 4000 and len(pods) == 8
    assert sum(p["count"] for p in pods) == total["count"]
    slow = next(s for s in pods if s["key"] == planted.SLOW_POD)
    # The slow pod's queue: tens of ms in its first steps, seconds in its last ones.
    queue = [p["buckets_ms"]["queue"]["mean"] for p in slow["points"] if p["count"]]
    assert max(queue[:3]) < 100 and min(queue[-3:]) > 1000
    for point in total["points"]:
        if point["count"]:
            assert sum(point["buckets_ms"][b]["share"] for b in BUCKETS) == pytest.approx(1)
    heat = ok(server, "/v1/attribution/heatmap", since="4h", service="chat", step="10m")
    assert heat["count"] == 4000 and len(heat["counts"]) == len(heat["times_ns"])
    assert all(len(row) == len(heat["bins"]) for row in heat["counts"])


def test_why_names_each_planted_cause(served) -> None:
    server, _ = served
    pod = ok(server, "/v1/attribution/why", since="4h", service="chat")
    assert pod["top"]["value"] == planted.SLOW_POD and pod["top"]["dominant"] == "queue"
    tenant = ok(server, "/v1/attribution/why", since="4h", service="rag", metric="ttft",
                percentile=95, attribute="tenant.id")  # fmt: skip
    assert (tenant["top"]["dimension"], tenant["top"]["value"]) == (
        "attribute.tenant.id", planted.TENANT,
    )  # fmt: skip
    slo = ok(server, "/v1/attribution/why", since="4h", service="chat", selection="slo",
             objective="e2e:5500")  # fmt: skip
    assert slo["selection"]["kind"] == "slo" and slo["top"]["value"] == planted.SLOW_POD
    value = slo["dimensions"][0]["values"][0]
    assert sum(value["buckets_ms"].values()) == pytest.approx(value["extra_ms"])


def test_cold_starts_and_diagnose_use_the_servers_rule(served) -> None:
    server, _ = served
    body = ok(server, "/v1/attribution/coldstart", since="4h", service="gen")
    assert body["rule"]["warmup_requests"] == 0 and body["rule"]["warmup_s"] == planted.COLD_S
    assert body["dominant"] == "prefill"
    assert {r for e in body["scale_ups"] for r in e["replicas"]} >= {
        f"gen/{r}" for r in planted.NEW_REPLICAS
    }
    diagnosis = ok(server, "/v1/attribution/diagnose", since="4h", service="gen")
    assert "cold_start" in [v["id"] for v in diagnosis["verdicts"]]
    chat = ok(server, "/v1/attribution/diagnose", since="4h", service="chat")
    queue = next(v for v in chat["verdicts"] if v["bucket"] == "queue")
    assert queue["where"]["value"] == planted.SLOW_POD


def test_slo_says_where_the_budget_went(served) -> None:
    server, _ = served
    body = ok(server, "/v1/slo", objective="e2e:5500:0.99:1", service="chat")
    split = body["objectives"][0]["budget_by_bucket"]
    assert split["1h"]["dominant"] == "queue"
    assert sum(split["1h"]["extra_buckets_ms"].values()) == pytest.approx(
        split["1h"]["extra_e2e_ms"]
    )


@pytest.mark.parametrize(
    ("path", "params", "status", "code"),
    [
        ("/v1/attribution/timeseries", {"step": "1s", "since": "7d"}, 400, "invalid_parameter"),
        ("/v1/attribution/timeseries", {"step": "soon"}, 422, "invalid_request"),
        ("/v1/attribution/heatmap", {"metric": "latency"}, 422, "invalid_request"),
        ("/v1/attribution/heatmap", {"bins_per_decade": 7}, 400, "invalid_parameter"),
        ("/v1/attribution/why", {"selection": "slo"}, 400, "invalid_objective"),
        ("/v1/attribution/why", {"selection": "region", "min_ms": 5, "max_ms": 2}, 400,
         "invalid_parameter"),
        ("/v1/attribution/why", {"attribute": "tenant id"}, 400, "invalid_parameter"),
        ("/v1/attribution/why", {"selection": "region", "sel_since": "yesterday"}, 400,
         "invalid_time"),
        ("/v1/attribution/coldstart", {"warmup_requests": 0, "warmup_s": 0}, 400,
         "invalid_parameter"),
    ],
)  # fmt: skip
def test_bad_parameters_get_a_clear_4xx(served, path, params, status, code) -> None:
    server, _ = served
    response = get(server, path, **params)
    assert response.status_code == status, response.text
    assert response.json()["error"] == code


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_why_prints_the_api_answer_and_names_the_pod(served, capsys) -> None:
    server, _ = served
    code, out, err = run(capsys, "why", "--url", server.http, "--since", "4h", "--service",
                         "chat", "--json")  # fmt: skip
    assert code == 0, err
    body = json.loads(out)
    assert body["top"]["value"] == planted.SLOW_POD
    code, out, err = run(capsys, "why", "--url", server.http, "--since", "4h", "--service",
                         "rag", "--metric", "ttft", "--percentile", "95", "--attribute",
                         "tenant.id")  # fmt: skip
    assert code == 0, err
    assert f"attribute.tenant.id = {planted.TENANT}" in out
    assert "mostly prefill" in out
    code, out, err = run(capsys, "why", "--url", server.http, "--since", "4h", "--service",
                         "chat", "--slo", "e2e:5500")  # fmt: skip
    assert code == 0, err and planted.SLOW_POD in out
    code, _, err = run(capsys, "why", "--url", server.http, "--slo", "fast")
    assert code == 2 and "objective" in err


def test_cli_timeline_draws_sparklines(served, capsys) -> None:
    server, _ = served
    code, out, err = run(capsys, "timeline", "--url", server.http, "--since", "4h", "--service",
                         "chat", "--group-by", "resource.k8s.pod.name")  # fmt: skip
    assert code == 0, err
    assert "queue share" in out and f"{planted.SLOW_POD} p99" in out
    assert any(ch in out for ch in "▁▂▃▄▅▆▇█")
    code, out, err = run(capsys, "timeline", "--url", server.http, "--since", "4h", "--table",
                         "--step", "30m")  # fmt: skip
    assert code == 0, err
    assert "times in ms" in out and "ttft p99" in out


def test_cli_diagnose_says_where_and_since_when(served, capsys) -> None:
    server, _ = served
    code, out, err = run(capsys, "diagnose", "--url", server.http, "--since", "4h", "--service",
                         "chat")  # fmt: skip
    assert code == 0, err
    assert f"where: resource.k8s.pod.name = {planted.SLOW_POD} since " in out


def test_cli_slo_says_where_the_budget_went(served, capsys) -> None:
    server, _ = served
    code, out, err = run(capsys, "slo", "--url", server.http, "--objective", "e2e:5500:0.99:1",
                         "--service", "chat")  # fmt: skip
    assert code == 0, err
    text = " ".join(out.split())
    assert "the budget went to queue" in text and "queue (1h, +" in text
