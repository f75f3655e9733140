"""The REST API over many requests (summary, tail, compare, diagnose, slo, gpu, services,
slowest) against a real ``latscope serve``; expected figures are recomputed from the dataset's
known layouts."""

from __future__ import annotations

import math

import httpx
import pytest

from latscope.semconv import BUCKETS
from tests.serve_support import Server
from tests.surfaces import GPU_ENERGY_MJ, GPU_UTIL, MS, RequestSpec

pytestmark = pytest.mark.subprocess

HOUR_NS = 3600 * 10**9


def _get(server: Server, path: str, **params: object) -> dict:
    response = httpx.get(server.url(path), params=params, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def linear(values: list[float], q: float) -> float:
    """Quantile with linear interpolation between order statistics (numpy's default)."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _recent(specs: list[RequestSpec], now_ns: int, hours: float = 1) -> list[RequestSpec]:
    return [s for s in specs if s.start_ns >= now_ns - hours * HOUR_NS]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _bucket(specs: list[RequestSpec], bucket: str) -> list[float]:
    return [v for s in specs if (v := s.expected_buckets()[bucket]) is not None]


def _ttft(spec: RequestSpec) -> float:
    # No client first-token time in the dataset: TTFT is the server's, from its span's start.
    return spec.phases["decode"][0] + spec.token_offsets_us[0] / 1000 - spec.server[0]


def _now_ns(server: Server) -> int:
    return _get(server, "/v1/services")["window"]["until_ns"]


def test_summary_matches_the_dataset(served) -> None:
    server, specs = served
    body = _get(server, "/v1/attribution/summary", group_by="model", exact=True)
    recent = _recent(specs, body["window"]["until_ns"])
    assert body["count"] == len(recent) == 41
    e2e = [s.e2e_ms for s in recent]
    for key, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        assert body["e2e_ms"][key] == pytest.approx(linear(e2e, q), abs=0.01), key
    assert body["e2e_ms"]["mean"] == pytest.approx(_mean(e2e), abs=0.01)
    total = sum(e2e)
    for bucket in BUCKETS:
        values = _bucket(recent, bucket)
        figures = body["buckets_ms"][bucket]
        assert figures["mean"] == pytest.approx(_mean(values), abs=0.01), bucket
        assert figures["p50"] == pytest.approx(linear(values, 0.5), abs=0.01), bucket
        assert figures["share"] == pytest.approx(sum(values) / total, abs=1e-6), bucket
    assert sum(f["share"] for f in body["buckets_ms"].values()) == pytest.approx(1, abs=1e-6)
    groups = {g["key"]: g["count"] for g in body["groups"]}
    assert groups == {"llama-3-8b": 30, "mistral-7b": 10, "llama-3-70b": 1}


def test_summary_filters_by_model_and_window(served) -> None:
    server, _ = served
    body = _get(server, "/v1/attribution/summary", model="mistral-7b", since="30m")
    assert body["count"] == 10
    assert body["buckets_ms"]["network"]["p50"] is None  # server-only: network unknown
    older = _get(server, "/v1/attribution/summary", since="2h", until="70m")
    assert older["count"] == 20


def test_tail_names_the_queue(served) -> None:
    server, specs = served
    body = _get(server, "/v1/attribution/tail", percentile=99, exact=True)
    recent = _recent(specs, body["window"]["until_ns"])
    e2e = [s.e2e_ms for s in recent]
    assert body["threshold_ms"] == pytest.approx(linear(e2e, 0.99), abs=0.01)
    assert body["tail_count"] == 1
    assert body["dominant"] == "queue"
    # The one tail request waited 3 s; the median band's requests waited their usual time.
    lo, hi = linear(e2e, 0.45), linear(e2e, 0.55)
    mid = [s for s in recent if lo <= s.e2e_ms <= hi]
    queue_mid = _mean([s.expected_buckets()["queue"] for s in mid])
    assert body["buckets_ms"]["queue"]["extra"] == pytest.approx(3000 - queue_mid, abs=0.01)


def test_compare_finds_the_mover(served) -> None:
    server, specs = served
    body = _get(server, "/v1/attribution/compare", after_since="1h", exact=True)
    now = body["after"]["until_ns"]
    after = _recent(specs, now)
    before = [s for s in specs if now - 2 * HOUR_NS <= s.start_ns < now - HOUR_NS]
    assert (body["before"]["count"], body["after"]["count"]) == (len(before), len(after))
    deltas = {
        b: _mean(_bucket(after, b)) - _mean(_bucket(before, b))
        for b in BUCKETS
        if _bucket(before, b) and _bucket(after, b)
    }
    for bucket, delta in deltas.items():
        assert body["buckets_ms"][bucket]["mean"]["delta"] == pytest.approx(delta, abs=0.01)
    assert body["mover"] == max(deltas, key=lambda b: abs(deltas[b]))


def test_diagnose_names_cause_and_fix_with_numbers(served) -> None:
    server, _ = served
    body = _get(server, "/v1/attribution/diagnose")
    tail = _get(server, "/v1/attribution/tail")
    summary = _get(server, "/v1/attribution/summary")
    shares = {b: f["share"] for b, f in summary["buckets_ms"].items()}
    assert body["dominant"] == max(shares, key=lambda b: shares[b])
    assert body["tail_dominant"] == "queue"
    verdict = next(v for v in body["verdicts"] if v["id"] == "queue_tail")
    assert verdict["bucket"] == "queue" and verdict["fixes"]
    assert verdict["evidence"]["queue_extra_ms"] == pytest.approx(
        tail["buckets_ms"]["queue"]["extra"], abs=0.01
    )


def test_slo_burn_rates(served) -> None:
    server, specs = served
    body = _get(server, "/v1/slo", objective=["ttft:500:0.99:30", "e2e:100000:0.9"])
    ttft, e2e = body["objectives"]
    now = body["now_ns"]
    last_hour = _recent(specs, now)
    bad_1h = sum(_ttft(s) > 500 for s in last_hour)
    bad_all = sum(_ttft(s) > 500 for s in specs)
    assert (ttft["total"], ttft["bad"]) == (len(specs), bad_all)
    assert ttft["burn_rates"]["1h"] == pytest.approx(bad_1h / len(last_hour) / 0.01, rel=1e-6)
    assert ttft["budget_left"] == pytest.approx(1 - bad_all / len(specs) / 0.01, rel=1e-6)
    assert ttft["met"] is False
    assert ttft["alerts"]["fast_burn"] is False  # nothing in the last 5 minutes burns
    assert (e2e["bad"], e2e["met"], e2e["window_days"]) == (0, True, 30)


def test_gpu_per_phase(served) -> None:
    server, _ = served
    body = _get(server, "/v1/gpu")
    prefill = body["phases"]["prefill"]
    assert prefill["utilization_mean"]["mean"] == pytest.approx(GPU_UTIL)
    assert prefill["utilization_mean"]["n"] == 30
    assert prefill["energy_mj"]["total"] == pytest.approx(30 * GPU_ENERGY_MJ)


def test_services_and_slowest_requests(served) -> None:
    server, specs = served
    services = {s["service"]: s for s in _get(server, "/v1/services", since="3h")["services"]}
    assert services["llm-server"]["count"] == 60
    assert {m["model"] for m in services["llm-server"]["models"]} == {"llama-3-8b", "mistral-7b"}
    assert services["rag-server"]["count"] == 1
    body = _get(server, "/v1/requests", limit=3)
    recent = _recent(specs, body["window"]["until_ns"])
    slowest = sorted(recent, key=lambda s: -s.e2e_ms)[:3]
    assert [r["trace_id"] for r in body["requests"]] == [s.trace_id for s in slowest]
    first = body["requests"][0]
    assert first["e2e_ms"] == pytest.approx(slowest[0].e2e_ms, abs=0.01)
    assert first["buckets_ms"]["queue"] == pytest.approx(3000, abs=0.01)
    assert first["start_ns"] == slowest[0].start_ns


def test_percentiles_are_close_without_exact(served) -> None:
    server, _ = served
    exact = _get(server, "/v1/attribution/summary", since="2h", until="1m", exact=True)
    fast = _get(server, "/v1/attribution/summary", since="2h", until="1m")
    assert fast["count"] == exact["count"]
    # With 61 requests the high percentiles are single requests either way; the median is not.
    assert fast["e2e_ms"]["p50"] == pytest.approx(exact["e2e_ms"]["p50"], rel=0.01)


def test_relative_and_absolute_times_agree(served) -> None:
    server, specs = served
    now = _now_ns(server)
    since = now - HOUR_NS
    iso = _get(server, "/v1/attribution/summary", since="1h")["window"]["since"]
    body = _get(server, "/v1/attribution/summary", since=iso, until="0s")
    assert body["count"] == sum(1 for s in specs if s.start_ns >= since - 60_000 * MS)
