"""Named ClickHouse queries of the attribution engine. Parameters are bound, never formatted."""

from __future__ import annotations

from latscope.storage import SPANS_TABLE


def _trace_spans(attributes: str) -> str:
    return f"""
SELECT
    SpanId, ParentSpanId, SpanName, SpanKind, ServiceName,
    toUnixTimestamp64Nano(Timestamp) AS StartNs, Duration, {attributes}, StatusCode,
    ResourceAttributes,
    Events.Name AS EventNames,
    arrayMap(t -> toUnixTimestamp64Nano(t), Events.Timestamp) AS EventTimes
FROM {SPANS_TABLE}
WHERE TraceId = {{trace_id:String}}
ORDER BY StartNs
"""


#: All spans of one trace, times as integer ns (DateTime64 -> Python datetime would drop them).
TRACE_SPANS = _trace_spans("SpanAttributes")
#: The same, each span's attributes only those of ``keys`` (``sql.rule_keys``: what the
#: attribution rows are worked out from): a trace's prompts and completions stay in ClickHouse.
TRACE_SPANS_READ_BY_RULES = _trace_spans(
    "mapFilter((k, v) -> has({keys:Array(String)}, k), SpanAttributes) AS RuleAttributes"
)
