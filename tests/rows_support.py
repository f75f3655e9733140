"""Attribution rows made up in bulk for the aggregates' and rollups' tests, and how their answers
are checked: against polars' exact recomputation, and against each other."""

from __future__ import annotations

import math
import uuid
from typing import Any

import numpy as np
import polars as pl
import pytest

from latscope.attribution import aggregates as ag
from latscope.attribution import rollups
from latscope.attribution.frames import to_table
from latscope.attribution.table import BUCKET_COLUMNS
from latscope.semconv import BUCKETS
from latscope.storage import ATTRIBUTION_TABLE, Store

H = 3600 * 10**9
MS = 1e6


def make_rows(n: int, *, service: str, t0: int, seed: int, span_ns: int = 2 * H) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    has_client = rng.random(n) < 0.8
    parts = {
        "queue": rng.integers(0, 400, n) * 1_000_000 * np.where(rng.random(n) < 0.05, 20, 1),
        "preprocess": rng.integers(0, 30, n) * 1_000_000,
        "prefill": rng.integers(10, 300, n) * 1_000_000,
        "decode": rng.integers(0, 3000, n) * 1_000_000,
        "postprocess": rng.integers(0, 20, n) * 1_000_000,
        "other": rng.integers(0, 10, n) * 1_000_000,
        "network": np.where(has_client, rng.integers(1, 80, n) * 1_000_000, 0),
    }
    e2e = sum(parts.values())
    input_tokens = rng.integers(1, 4000, n)
    stalls = (rng.random(n) < 0.1).astype(np.uint32)
    df = pl.DataFrame(
        {
            "Timestamp": t0 + np.sort(rng.integers(0, span_ns, n)),
            "TraceId": [uuid.UUID(int=int(x)).hex for x in rng.integers(0, 2**62, n)],
            "RequestSpanId": "00000000000000c1",
            "ServiceName": service,
            "Model": rng.choice(["m-small", "m-large"], n),
            "Provider": "",
            "Operation": "chat",
            "Route": rng.choice(["/a", "/b", "/c"], n),
            "ResourceAttributes": [
                [{"key": "k8s.pod.name", "value": f"pod-{i % 3}"}] for i in range(n)
            ],
            "StatusCode": "Ok",
            "HasClient": has_client,
            "Attempts": 1,
            "E2eNs": e2e,
            **{BUCKET_COLUMNS[b]: parts[b] for b in BUCKETS},
            "TtftClientNs": np.where(has_client, parts["network"] + parts["prefill"], 0),
            "TtftServerNs": parts["queue"] + parts["prefill"],
            "TpotNs": rng.random(n) * 50e6,
            "ItlP50Ns": rng.random(n) * 40e6,
            "ItlP99Ns": rng.random(n) * 400e6,
            "ItlMaxNs": rng.random(n) * 900e6,
            "Stalls": stalls,
            "InputTokens": input_tokens,
            "OutputTokens": rng.integers(1, 500, n),
            "ClockSkewNs": 0,
            "KvTransferNs": None,
            "Gpu": [[{"key": "decode.energy_mj", "value": float(i)}] for i in range(n)],
            "SpanCount": 7,
            "SpansIngestedAt": 0,
            "Version": 7,
            "IsDeleted": 0,
        }
    )
    return df.with_columns(
        NetworkNs=pl.when(pl.col("HasClient")).then(pl.col("NetworkNs")),
        TtftClientNs=pl.when(pl.col("HasClient")).then(pl.col("TtftClientNs")),
    )


def insert(store: Store, df: pl.DataFrame) -> None:
    store.insert_arrow(ATTRIBUTION_TABLE, to_table(df))


def q(s: pl.Series, p: float) -> float:
    return s.drop_nulls().cast(pl.Float64).quantile(p, "linear") / MS


def close(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two answers differ (floats compared to 1e-9: sums are summed in another order)."""
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        return [d for k in a for d in close(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in close(x, y, path)]
    if isinstance(a, float) and isinstance(b, float):
        return [] if math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) else [f"{path}: {a} != {b}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def check_against(got: dict, df: pl.DataFrame) -> None:
    """Counts, means and shares exact; every percentile within ALPHA of polars' exact one."""
    assert got["count"] == df.height
    total = df["E2eNs"].sum()
    figures = {"e2e": (got["e2e_ms"], df["E2eNs"], ag.E2E_LEVELS)}
    for bucket in BUCKETS:
        col = df[BUCKET_COLUMNS[bucket]]
        found = got["buckets_ms"][bucket]
        assert found["mean"] == pytest.approx(col.drop_nulls().mean() / MS, rel=1e-9)
        assert found["share"] == pytest.approx(col.sum() / total, rel=1e-9)
        figures[bucket] = (found, col, ag.BUCKET_LEVELS)
    ttft = df.select(pl.coalesce("TtftClientNs", "TtftServerNs")).to_series()
    stream = got["streaming"]
    figures["ttft"] = (stream["ttft_ms"], ttft, ag.STREAM_LEVELS)
    figures["ttft_server"] = (stream["ttft_server_ms"], df["TtftServerNs"], ag.STREAM_LEVELS)
    figures["tpot"] = (stream["tpot_ms"], df["TpotNs"], ag.STREAM_LEVELS)
    figures["itl_p99"] = (stream["itl_p99_ms"], df["ItlP99Ns"], ag.STREAM_LEVELS)
    assert got["e2e_ms"]["mean"] == pytest.approx(df["E2eNs"].mean() / MS, rel=1e-9)
    assert stream["ttft_ms"]["mean"] == pytest.approx(ttft.mean() / MS, rel=1e-9)
    assert stream["stalled_requests"] == int((df["Stalls"] > 0).sum())
    for name, (found, col, levels) in figures.items():
        for level, p in levels:
            exact = q(col, p)
            assert found[level] == pytest.approx(exact, rel=rollups.ALPHA + 1e-9), (name, level)
