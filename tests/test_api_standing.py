"""Where a request stands: its percentile rank among the requests of its service and model that
started in the hour before it, for e2e, each bucket, TTFT and TPOT (``Explain.standing``)."""

from __future__ import annotations

import polars as pl
import pytest

from latscope.api import trace
from latscope.semconv import GenAIAttributes
from latscope.storage import Store
from tests.attribution_support import MS, T0, TraceBuilder, store_traces
from tests.rows_support import H, insert, make_rows

MODEL = "standing-model"


def _request(store: Store, service: str) -> str:
    """One call: a client span around a server with queue, prefill and decode; its request id."""
    b = TraceBuilder()
    client = b.client(0, 100, attrs={GenAIAttributes.REQUEST_MODEL: MODEL})
    server = b.server(10, 90, parent=client, service=service)
    b.phase("queue", 10, 30, parent=server, service=service)
    b.phase("prefill", 30, 50, parent=server, service=service)
    b.phase("decode", 50, 90, parent=server, service=service)
    (stored,) = store_traces(store, {"t": b.spans})
    return f"{stored}-{b.spans[0].span_id}"


def _peers(
    service: str, *, e2e_ms: list[float], queue_ms: float, at: list[int], **over: str
) -> pl.DataFrame:
    rows = make_rows(len(at), service=service, t0=T0 - H, seed=len(at))
    return rows.with_columns(
        pl.Series("Timestamp", at),
        pl.Series("E2eNs", [int(v * MS) for v in e2e_ms], dtype=pl.UInt64),
        pl.lit(int(queue_ms * MS)).cast(pl.UInt64).alias("QueueNs"),
        pl.lit(over.get("Model", MODEL)).alias("Model"),
    )


def test_a_request_is_ranked_among_its_peers_of_the_hour_before_it(store: Store) -> None:
    request_id = _request(store, "standing-a")
    alone = trace.explain(store, request_id).standing
    assert alone.peers == 0
    assert alone.percentiles.e2e is None and alone.percentiles.queue is None

    e2e = trace.explain(store, request_id).attribution.e2e_ms
    assert e2e == pytest.approx(100.0)
    # 100 peers in the hour before it: 40 faster, 20 as fast, 40 slower; every queue 20 ms
    # against its 20 (all equal: the 50th percentile).
    values = [50.0] * 40 + [e2e] * 20 + [200.0] * 40
    times = [T0 - H + i * (H // 100) for i in range(100)]
    insert(store, _peers("standing-a", e2e_ms=values, queue_ms=20, at=times))
    # Not peers: before the hour, at or after its start, another model, another service.
    outside = [T0 - H - 1, T0, T0 + H // 2]
    insert(store, _peers("standing-a", e2e_ms=[1.0] * 3, queue_ms=0, at=outside))
    insert(store, _peers("standing-a", e2e_ms=[1.0] * 2, queue_ms=0, at=[T0 - 10] * 2, Model="x"))
    insert(store, _peers("standing-x", e2e_ms=[1.0] * 2, queue_ms=0, at=[T0 - 10] * 2))

    standing = trace.explain(store, request_id).standing
    assert standing.peers == 100
    assert standing.percentiles.e2e == pytest.approx(50.0)  # (40 + 20 / 2) / 100
    assert standing.percentiles.queue == pytest.approx(50.0)
    assert standing.since == "2025-11-13T01:13:20Z" and standing.until == "2025-11-13T02:13:20Z"
    # Every peer's network is below 80 ms (rows_support) or absent; the request's is 20 ms.
    assert standing.percentiles.network is not None


def test_the_rank_counts_only_peers_that_have_the_figure(store: Store) -> None:
    request_id = _request(store, "standing-b")
    e2e = trace.explain(store, request_id).attribution.e2e_ms
    times = [T0 - 100 + i for i in range(10)]
    peers = _peers("standing-b", e2e_ms=[e2e + 1] * 10, queue_ms=0, at=times)
    # Half the peers have no client span: no network figure.
    peers = peers.with_columns(
        pl.Series("NetworkNs", [None] * 5 + [int(1 * MS)] * 5, dtype=pl.UInt64)
    )
    insert(store, peers)
    standing = trace.explain(store, request_id).standing
    assert standing.peers == 10
    assert standing.percentiles.e2e == 0.0  # faster than every peer
    assert standing.percentiles.queue == 100.0  # every peer queued 0 ms, it queued 20
    assert standing.percentiles.network == 100.0  # above the 5 peers that have one
