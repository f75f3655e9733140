"""The Prometheus latency histograms fed by ``observe``: labels, unknown network, the cap."""

from __future__ import annotations

import pyarrow as pa
from prometheus_client import generate_latest

from latscope.api import live
from latscope.metrics import REGISTRY


def _sample(name: str, **labels: str) -> float:
    value = REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


def _row(service: str, model: str, network_ns: int | None) -> dict:
    return {
        "TraceId": "f" * 32,
        "ServiceName": service,
        "Model": model,
        "E2eNs": 900_000_000,
        "NetworkNs": network_ns,
        "QueueNs": 300_000_000,
        "PreprocessNs": 0,
        "PrefillNs": 200_000_000,
        "DecodeNs": 400_000_000 - (network_ns or 0),
        "PostprocessNs": 0,
        "OtherNs": 0,
        "TtftServerNs": 450_000_000,
    }


def test_observe_fills_histograms_by_service_model_and_bucket() -> None:
    labels = {"service": "metrics-svc", "model": "m-a"}
    table = pa.Table.from_pylist(
        [_row("metrics-svc", "m-a", 50_000_000), _row("metrics-svc", "m-a", None)]
    )
    assert live.observe(table, hub=live.LiveHub()) == 2
    assert _sample("latscope_request_e2e_seconds_count", **labels) == 2
    assert _sample("latscope_request_ttft_seconds_sum", **labels) == 0.9
    assert _sample("latscope_request_bucket_seconds_count", bucket="queue", **labels) == 2
    # Network is unknown without a client span: observed once, not as a zero.
    assert _sample("latscope_request_bucket_seconds_count", bucket="network", **labels) == 1
    assert _sample(
        "latscope_request_bucket_seconds_bucket", bucket="queue", le="0.25", **labels
    ) == 0  # fmt: skip
    assert _sample(
        "latscope_request_bucket_seconds_bucket", bucket="queue", le="0.5", **labels
    ) == 2  # fmt: skip
    assert b'latscope_request_bucket_seconds_bucket{bucket="prefill"' in generate_latest(REGISTRY)


def test_label_sets_are_capped(monkeypatch) -> None:
    monkeypatch.setattr(live, "MAX_LABEL_SETS", len(live._label_sets) + 1)
    before = _sample("latscope_metrics_label_overflow_total")
    rows = [_row("cap-svc", f"model-{i}", None) for i in range(3)]
    assert live.observe(rows, hub=live.LiveHub()) == 3
    assert _sample("latscope_request_e2e_seconds_count", service="cap-svc", model="model-0") == 1
    assert _sample("latscope_request_e2e_seconds_count", service="_other", model="_other") >= 2
    assert _sample("latscope_metrics_label_overflow_total") - before == 2


def test_observe_never_raises_into_the_attributor() -> None:
    assert live.observe([{"no": "columns"}], hub=live.LiveHub()) == 0
