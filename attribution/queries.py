"""Named ClickHouse queries of the attribution engine. Parameters are bound, never formatted."""

from __future__ import annotations

from latscope.storage import SPANS_TABLE

#: All spans of one trace, times as integer ns (DateTime64 -> Python datetime would drop them).
TRACE_SPANS = f"""
SELECT
    SpanId, ParentSpanId, SpanName, SpanKind, ServiceName,
    toUnixTimestamp64Nano(Timestamp) AS StartNs, Duration, SpanAttributes, StatusCode,
    ResourceAttributes,
    Events.Name AS EventNames,
    arrayMap(t -> toUnixTimestamp64Nano(t), Events.Timestamp) AS EventTimes
FROM {SPANS_TABLE}
WHERE TraceId = {{trace_id:String}}
ORDER BY StartNs
"""
