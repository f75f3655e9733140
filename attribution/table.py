"""Attribution rows <-> the ``latscope_attribution`` table (002_attribution.sql): the one place
that knows the column layout."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

from latscope.attribution.model import RequestAttribution
from latscope.semconv import BUCKETS

_MAP_F = pa.map_(pa.string(), pa.float64())
_MAP_S = pa.map_(pa.string(), pa.string())

#: bucket -> its column (``"prefill"`` -> ``"PrefillNs"``), in ``BUCKETS`` order: the one map from
#: the REST/CLI bucket names to the table's columns; every reader and writer of the table uses it.
BUCKET_COLUMNS: dict[str, str] = {bucket: f"{bucket.capitalize()}Ns" for bucket in BUCKETS}
#: The bucket columns as a SELECT list, in ``BUCKETS`` order.
BUCKET_COLUMN_LIST = ", ".join(BUCKET_COLUMNS.values())

ATTRIBUTION_SCHEMA = pa.schema(
    [
        ("Timestamp", pa.timestamp("ns")),
        ("TraceId", pa.string()),
        ("RequestSpanId", pa.string()),
        ("ServiceName", pa.string()),
        ("Model", pa.string()),
        ("Provider", pa.string()),
        ("Operation", pa.string()),
        ("Route", pa.string()),
        ("ResourceAttributes", _MAP_S),
        ("StatusCode", pa.string()),
        ("HasClient", pa.bool_()),
        ("Attempts", pa.uint16()),
        ("E2eNs", pa.uint64()),
        *((column, pa.uint64()) for column in BUCKET_COLUMNS.values()),
        ("TtftClientNs", pa.int64()),
        ("TtftServerNs", pa.int64()),
        ("TpotNs", pa.float64()),
        ("ItlP50Ns", pa.float64()),
        ("ItlP99Ns", pa.float64()),
        ("ItlMaxNs", pa.float64()),
        ("Stalls", pa.uint32()),
        ("InputTokens", pa.uint32()),
        ("OutputTokens", pa.uint32()),
        ("ClockSkewNs", pa.int64()),
        ("KvTransferNs", pa.int64()),
        ("Gpu", _MAP_F),
        ("SpanCount", pa.uint32()),
        ("SpansIngestedAt", pa.timestamp("us")),
        ("Version", pa.uint64()),
        ("IsDeleted", pa.uint8()),
    ]
)


def gpu_map(gpu: dict[str, dict[str, float]]) -> list[tuple[str, float]]:
    """``{"decode": {"energy_mj": 5.0}}`` -> ``[("decode.energy_mj", 5.0)]`` (the Gpu column)."""
    return [
        (f"{phase}.{k}", float(v)) for phase, figs in sorted(gpu.items()) for k, v in figs.items()
    ]


def attribution_row(
    a: RequestAttribution, *, span_count: int, ingested_us: int, deleted: bool = False
) -> dict[str, Any]:
    """One per-request result -> one row (a dict keyed by column)."""
    return {
        "Timestamp": a.start_ns,
        "TraceId": a.trace_id,
        "RequestSpanId": a.request_span_id,
        "ServiceName": a.service,
        "Model": a.model,
        "Provider": a.provider,
        "Operation": a.operation,
        "Route": a.route,
        "ResourceAttributes": list(a.resource_attributes.items()),
        "StatusCode": a.status,
        "HasClient": a.has_client,
        "Attempts": a.attempts,
        "E2eNs": a.e2e_ns,
        **{col: a.buckets_ns.get(b) for b, col in BUCKET_COLUMNS.items()},
        "TtftClientNs": a.ttft_client_ns,
        "TtftServerNs": a.ttft_server_ns,
        "TpotNs": a.tpot_ns,
        "ItlP50Ns": a.itl_ns.get("p50"),
        "ItlP99Ns": a.itl_ns.get("p99"),
        "ItlMaxNs": a.itl_ns.get("max"),
        "Stalls": a.stalls,
        "InputTokens": a.input_tokens,
        "OutputTokens": a.output_tokens,
        "ClockSkewNs": a.clock_skew_ns,
        "KvTransferNs": a.kv_transfer_ns,
        "Gpu": gpu_map(a.gpu),
        "SpanCount": span_count,
        "SpansIngestedAt": ingested_us,
        "Version": span_count,
        "IsDeleted": 1 if deleted else 0,
    }


def rows_to_table(rows: Iterable[dict[str, Any]]) -> pa.Table:
    """Row dicts (keys = columns) -> an Arrow table in ATTRIBUTION_SCHEMA."""
    rows = list(rows)
    return pa.Table.from_pydict(
        {name: [r.get(name) for r in rows] for name in ATTRIBUTION_SCHEMA.names},
        schema=ATTRIBUTION_SCHEMA,
    )


def columns_present(names: Sequence[str]) -> list[str]:
    """Schema columns missing from ``names`` (for a clear error when a frame lacks some)."""
    return [n for n in ATTRIBUTION_SCHEMA.names if n not in names]
