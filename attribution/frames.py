"""Attributed requests as polars DataFrames, for offline analysis.

The attribution table is ClickHouse's to query; this module hands its rows to polars (one row per
request, after ``FINAL``, times as ns integers and ``buckets`` as columns), and back:

>>> from latscope.attribution import frames
>>> df = frames.requests(store, since_ns=t0, until_ns=t1, service="llm-server")  # doctest: +SKIP
>>> df.group_by("Model").agg(pl.col("DecodeNs").mean())  # doctest: +SKIP
>>> frames.write_parquet(df, "requests.parquet")  # doctest: +SKIP

``latscope export --parquet FILE`` writes the same frame from the command line.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa

from latscope.attribution.table import ATTRIBUTION_SCHEMA
from latscope.storage import ATTRIBUTION_TABLE, Store

#: Most rows one call returns unless told otherwise (a frame is held in memory).
DEFAULT_LIMIT = 5_000_000

#: Columns read as ns integers (ClickHouse DateTime64 -> Python datetime would drop the ns),
#: under another name: an alias named as its column would replace the column in ``WHERE``
#: (ClickHouse resolves aliases first) and compare ns integers with times.
_TIMES = {"Timestamp": "toUnixTimestamp64Nano(Timestamp)"}
_RENAMED = {name: f"{name}_ns" for name in _TIMES}
_SKIP = {"SpansIngestedAt", "Version", "IsDeleted"}

REQUESTS_SQL = (
    "SELECT "
    + ", ".join(
        f"{_TIMES[name]} AS {_RENAMED[name]}" if name in _TIMES else name
        for name in ATTRIBUTION_SCHEMA.names
        if name not in _SKIP
    )
    + f"""
FROM {ATTRIBUTION_TABLE} FINAL
WHERE Timestamp >= fromUnixTimestamp64Nano({{since_ns:Int64}})
  AND Timestamp < fromUnixTimestamp64Nano({{until_ns:Int64}})
  AND ({{service:String}} = '' OR ServiceName = {{service:String}})
  AND ({{model:String}} = '' OR Model = {{model:String}})
ORDER BY Timestamp, TraceId, RequestSpanId
LIMIT {{limit:UInt64}}
SETTINGS do_not_merge_across_partitions_select_final = 1"""
)


def requests(
    store: Store,
    *,
    since_ns: int,
    until_ns: int,
    service: str | None = None,
    model: str | None = None,
    limit: int = DEFAULT_LIMIT,
) -> pl.DataFrame:
    """Every attributed request in ``[since_ns, until_ns)`` (request start), oldest first: the
    attribution table's columns, ``Timestamp`` in ns since the epoch, maps as lists of
    ``{key, value}`` structs (polars has no map type)."""
    table = store.query_arrow(
        REQUESTS_SQL,
        {
            "since_ns": since_ns,
            "until_ns": until_ns,
            "service": service or "",
            "model": model or "",
            "limit": limit,
        },
    )
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame.rename({v: k for k, v in _RENAMED.items()})


def to_table(frame: pl.DataFrame) -> pa.Table:
    """A frame in the attribution table's columns -> an Arrow table in ATTRIBUTION_SCHEMA, ready
    for ``Store.insert_arrow`` (maps come back from lists of ``{key, value}`` structs)."""
    table = frame.select(ATTRIBUTION_SCHEMA.names).to_arrow()
    cols = []
    for field in ATTRIBUTION_SCHEMA:
        col = table.column(field.name).combine_chunks()
        if pa.types.is_map(field.type):
            col = col.cast(pa.list_(col.type.value_type))
            values = col.flatten()
            col = pa.MapArray.from_arrays(
                col.offsets,
                values.field(0).cast(field.type.key_type),
                values.field(1).cast(field.type.item_type),
                type=field.type,
                mask=col.is_null(),
            )
        else:
            if pa.types.is_timestamp(field.type) and pa.types.is_integer(col.type):
                col = col.cast(pa.int64())
            col = col.cast(field.type)
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=ATTRIBUTION_SCHEMA)


def write_parquet(frame: pl.DataFrame, path: str | Path) -> Path:
    """Write a requests frame as Parquet (zstd); returns the path."""
    path = Path(path)
    frame.write_parquet(path, compression="zstd")
    return path
