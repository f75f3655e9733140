"""Attributed requests with planted causes, for the answers over time and across dimensions.

* ``slow_pod``: service ``chat`` on pods ``chat-0``..``chat-7``; from ``slow_from`` on, pod
  ``chat-5`` waits 2-4 s longer in the queue.
* ``long_prompts``: service ``rag``, ten tenants (span attribute ``tenant.id`` on the server
  span); tenant ``acme`` sends prompts of 3,000-12,000 tokens (the others 16-2,000), and prefill
  grows with the prompt.
* ``scale_up``: service ``gen`` on replicas ``gen-a``..``gen-c``; at ``scale_at`` replicas
  ``gen-d`` and ``gen-e`` appear, and serve their first ``COLD_S`` seconds with 1.5-2.5 s more
  prefill.
* ``queue_burn``: service ``burn``, three days of requests whose TTFT stays under 500 ms, then
  an hour in which 40 % of the requests queue 1-2 s longer: ``ttft:500:0.99`` burns its budget
  fast, and the budget goes to ``queue``.

Rows are built in polars (the tests recompute every answer from them) and written straight into
the attribution table; ``long_prompts`` also writes one server span per request, carrying the
tenant. ``python -m tests.planted DIR`` writes the first three, ending now, into a fresh store;
``python -m tests.planted DIR UNTIL_NS burn`` writes ``queue_burn``.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import uuid
import zlib
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from latscope.attribution.frames import to_table
from latscope.attribution.table import BUCKET_COLUMNS
from latscope.collector.mapping import SPANS_SCHEMA
from latscope.semconv import BUCKETS
from latscope.storage import ATTRIBUTION_TABLE, SPANS_TABLE, Store

S = 10**9
MS = 10**6
H = 3600 * S
COLD_S = 60
SLOW_POD = "chat-5"
TENANT = "acme"
NEW_REPLICAS = ("gen-d", "gen-e")


def _rows(
    rng: np.random.Generator,
    n: int,
    *,
    service: str,
    t0: int,
    span_ns: int,
    input_tokens: np.ndarray | None = None,
) -> dict[str, object]:
    """Columns of ``n`` ordinary requests over ``[t0, t0 + span_ns)`` (ns)."""
    tokens = rng.integers(16, 2000, n) if input_tokens is None else input_tokens
    output = rng.integers(8, 200, n)
    has_client = rng.random(n) < 0.85
    parts = {
        "network": np.where(has_client, rng.integers(2, 40, n) * MS, 0),
        "queue": rng.integers(1, 60, n) * MS,
        "preprocess": rng.integers(1, 8, n) * MS,
        "prefill": tokens * rng.integers(80_000, 120_000, n),
        "decode": output * rng.integers(15, 25, n) * MS,
        "postprocess": rng.integers(1, 6, n) * MS,
        "other": rng.integers(0, 3, n) * MS,
    }
    return {
        "Timestamp": np.sort(t0 + rng.integers(0, span_ns, n)),
        "has_client": has_client,
        "InputTokens": tokens,
        "OutputTokens": output,
        **parts,
    }


def _node(pod: str) -> str:
    """Three nodes; pod ``x-5`` shares node-2 with ``x-2`` (no node holds one pod alone)."""
    suffix = pod.rsplit("-", 1)[-1]
    index = int(suffix) if suffix.isdigit() else zlib.crc32(suffix.encode())
    return f"node-{index % 3}"


def _frame(cols: dict[str, object], service: str, pods: list[str], model: str) -> pl.DataFrame:
    n = len(pods)
    parts = {b: np.asarray(cols[b]) for b in BUCKETS}
    has_client = np.asarray(cols["has_client"])
    e2e = sum(parts.values())
    df = pl.DataFrame(
        {
            "Timestamp": cols["Timestamp"],
            "TraceId": [uuid.uuid4().hex for _ in range(n)],
            "RequestSpanId": "00000000000000c1",
            "ServiceName": service,
            "Model": model,
            "Provider": "",
            "Operation": "chat",
            "Route": "/v1/chat/completions",
            "ResourceAttributes": [
                [
                    {"key": "service.instance.id", "value": p},
                    {"key": "k8s.pod.name", "value": p},
                    {"key": "host.name", "value": _node(p)},
                ]
                for p in pods
            ],
            "StatusCode": "Ok",
            "HasClient": has_client,
            "Attempts": 1,
            "E2eNs": e2e,
            **{BUCKET_COLUMNS[b]: parts[b] for b in BUCKETS},
            "TtftClientNs": parts["network"]
            + parts["queue"]
            + parts["preprocess"]
            + parts["prefill"],
            "TtftServerNs": parts["queue"] + parts["preprocess"] + parts["prefill"],
            "TpotNs": parts["decode"] / np.maximum(np.asarray(cols["OutputTokens"]) - 1, 1),
            "ItlP50Ns": 20e6,
            "ItlP99Ns": 30e6,
            "ItlMaxNs": 40e6,
            "Stalls": 0,
            "InputTokens": cols["InputTokens"],
            "OutputTokens": cols["OutputTokens"],
            "ClockSkewNs": 0,
            "KvTransferNs": None,
            "Gpu": [[{"key": "decode.energy_mj", "value": 1.0}] for _ in range(n)],
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


def slow_pod(t0: int, *, n: int = 4000, span_ns: int = 3 * H, slow_from: int | None = None,
             seed: int = 1, service: str = "chat") -> pl.DataFrame:  # fmt: skip
    """Requests on 8 pods; one of them queues 2-4 s longer from ``slow_from`` on."""
    rng = np.random.default_rng(seed)
    cols = _rows(rng, n, service=service, t0=t0, span_ns=span_ns)
    pods = [f"{service}-{i}" for i in rng.integers(0, 8, n)]
    start = t0 + span_ns // 2 if slow_from is None else slow_from
    slow = np.array([p == f"{service}-5" for p in pods]) & (np.asarray(cols["Timestamp"]) >= start)
    cols["queue"] = np.where(slow, np.asarray(cols["queue"]) + rng.integers(2000, 4000, n) * MS,
                             cols["queue"])  # fmt: skip
    return _frame(cols, service, pods, "llama-3-8b")


def long_prompts(t0: int, *, n: int = 3000, span_ns: int = 3 * H, seed: int = 2,
                 service: str = "rag") -> tuple[pl.DataFrame, list[str]]:  # fmt: skip
    """Requests from ten tenants; ``acme`` (a tenth of them) sends long prompts. Returns the
    rows and each request's tenant."""
    rng = np.random.default_rng(seed)
    tenants = [TENANT if i == 0 else f"tenant-{i}" for i in rng.integers(0, 10, n)]
    tokens = np.where(
        np.array([t == TENANT for t in tenants]),
        rng.integers(3000, 12000, n),
        rng.integers(16, 2000, n),
    )
    cols = _rows(rng, n, service=service, t0=t0, span_ns=span_ns, input_tokens=tokens)
    pods = [f"{service}-{i}" for i in rng.integers(0, 4, n)]
    return _frame(cols, service, pods, "llama-3-70b"), tenants


def scale_up(t0: int, *, n: int = 3000, span_ns: int = 3 * H, scale_at: int | None = None,
             seed: int = 3, service: str = "gen") -> tuple[pl.DataFrame, np.ndarray]:  # fmt: skip
    """Requests on three replicas, two more from ``scale_at``; the new ones run cold for their
    first COLD_S seconds. Returns the rows and which requests were served cold."""
    rng = np.random.default_rng(seed)
    cols = _rows(rng, n, service=service, t0=t0, span_ns=span_ns)
    at = t0 + span_ns // 2 if scale_at is None else scale_at
    ts = np.asarray(cols["Timestamp"])
    names = ["gen-a", "gen-b", "gen-c", *NEW_REPLICAS]
    picks = np.where(ts >= at, rng.integers(0, 5, n), rng.integers(0, 3, n))
    pods = [names[i] for i in picks]
    first: dict[str, int] = {}
    for t, p in zip(ts, pods, strict=True):
        first.setdefault(p, int(t))
    cold = np.array(
        [p in NEW_REPLICAS and t < first[p] + COLD_S * S for t, p in zip(ts, pods, strict=True)]
    )
    cols["prefill"] = np.where(cold, np.asarray(cols["prefill"]) + rng.integers(1500, 2500, n) * MS,
                               cols["prefill"])  # fmt: skip
    return _frame(cols, service, pods, "llama-3-8b"), cold


BURN_SERVICE = "burn"
BURN_SLOW_SHARE = 0.4


def queue_burn(until_ns: int, *, seed: int = 4, service: str = BURN_SERVICE) -> pl.DataFrame:
    """2,000 requests over the 3 days before ``until_ns`` (TTFT under 350 ms), then 300 in its
    last hour, of which ``BURN_SLOW_SHARE`` queue 1-2 s longer (TTFT over 1 s)."""
    rng = np.random.default_rng(seed)
    old = _rows(rng, 2000, service=service, t0=until_ns - 72 * H, span_ns=71 * H)
    new = _rows(rng, 300, service=service, t0=until_ns - H, span_ns=H - 10 * S)
    slow = rng.random(300) < BURN_SLOW_SHARE
    new["queue"] = np.asarray(new["queue"]) + np.where(slow, rng.integers(1000, 2000, 300), 0) * MS
    pods = [f"{service}-0"] * 2300
    cols = {k: np.concatenate([np.asarray(old[k]), np.asarray(new[k])]) for k in old}
    return _frame(cols, service, pods, "llama-3-8b")


def insert(store: Store, df: pl.DataFrame) -> None:
    store.insert_arrow(ATTRIBUTION_TABLE, to_table(df))


def insert_tenant_spans(store: Store, df: pl.DataFrame, tenants: list[str]) -> None:
    """One SERVER span per request, carrying its tenant (the rest of the trace is not needed)."""
    n = df.height
    row = {
        "Timestamp": df["Timestamp"].to_list(),
        "TraceId": df["TraceId"].to_list(),
        "SpanId": [uuid.uuid4().hex[:16] for _ in range(n)],
        "SpanKind": ["Server"] * n,
        "SpanName": ["chat"] * n,
        "ServiceName": df["ServiceName"].to_list(),
        "SpanAttributes": [[("tenant.id", t), ("http.route", "/v1/chat")] for t in tenants],
        "Duration": df["E2eNs"].to_list(),
        "StatusCode": ["Ok"] * n,
    }
    cols = {
        f.name: row.get(f.name, [[] if pa.types.is_list(f.type) or pa.types.is_map(f.type)
                                 else "" for _ in range(n)])
        for f in SPANS_SCHEMA
    }  # fmt: skip
    store.insert_arrow(SPANS_TABLE, pa.Table.from_pydict(cols, schema=SPANS_SCHEMA))


def write_all(store: Store, until_ns: int) -> dict[str, object]:
    """The three planted datasets over the 3 hours before ``until_ns``."""
    t0 = until_ns - 3 * H
    pods = slow_pod(t0)
    rag, tenants = long_prompts(t0)
    gen, cold = scale_up(t0)
    for df in (pods, rag, gen):
        insert(store, df)
    insert_tenant_spans(store, rag, tenants)
    return {"t0": t0, "cold": int(cold.sum())}


def store_dir(until_ns: int, dataset: str = "all") -> Path:
    """A fresh store holding the three datasets (``dataset="burn"``: ``queue_burn``), written by
    a process of its own (an embedded store belongs to one process at a time); the caller deletes
    its parent directory."""
    path = Path(tempfile.mkdtemp(prefix="latscope-planted-")) / "store"
    subprocess.run(
        [sys.executable, "-m", "tests.planted", str(path), str(until_ns), dataset],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return path


if __name__ == "__main__":  # python -m tests.planted STORE_DIR [UNTIL_NS [all|burn]]
    import time

    target = Store.open(f"chdb://{sys.argv[1]}")
    target.apply_schema()
    until = int(sys.argv[2]) if len(sys.argv) > 2 else time.time_ns()
    if sys.argv[3:] == ["burn"]:
        insert(target, queue_burn(until))
    else:
        print(write_all(target, until))
    target.close()
