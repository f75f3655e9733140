"""Named ClickHouse queries of the attribution engine. Parameters are bound, never formatted."""

from __future__ import annotations

from latscope.storage import SPANS_TABLE


def _trace_spans(attributes: str, resource: str = "ResourceAttributes") -> str:
    """A trace's spans in no order (``spans.span_records`` sorts them): ClickHouse sorts a
    query's rows before computing what it selects, so an ``ORDER BY`` would hold every span's
    stored attributes, prompts and all, at once (a 633 MB trace went past the query memory
    limit), where a read without one streams them through the attributes' filter or cut."""
    return f"""
SELECT
    SpanId, ParentSpanId, SpanName, SpanKind, ServiceName,
    toUnixTimestamp64Nano(Timestamp) AS StartNs, Duration, {attributes}, StatusCode,
    {resource},
    Events.Name AS EventNames,
    arrayMap(t -> toUnixTimestamp64Nano(t), Events.Timestamp) AS EventTimes
FROM {SPANS_TABLE}
WHERE TraceId = {{trace_id:String}}
"""


#: All spans of one trace, times as integer ns (DateTime64 -> Python datetime would drop them).
TRACE_SPANS = _trace_spans("SpanAttributes")
#: The same, each span's attributes only those of ``keys`` (``sql.rule_keys``: what the
#: attribution rows are worked out from): a trace's prompts and completions stay in ClickHouse.
TRACE_SPANS_READ_BY_RULES = _trace_spans(
    "mapFilter((k, v) -> has({keys:Array(String)}, k), SpanAttributes) AS RuleAttributes"
)

#: The most characters of an attribute value that a trace's answers show (``TRACE_SPANS_SHOWN``):
#: past that, prompts, completions and retrieved documents stay in ClickHouse, so a trace of
#: spans carrying them is read in tens of MB, not the GB it may hold.
ATTRIBUTE_CHARS = 256


def _cut(attributes: str) -> str:
    """``attributes`` with each value of more than ``{cut}`` characters cut to its first ``{cut}``
    and ``...[N characters]`` (N its length), but the values of ``{keys}``, which stay whole.

    Counting a value's characters reads all of it: only a value of ``{cut}`` to 4 x ``{cut}``
    bytes (UTF-8 takes 1 to 4 a character) is counted to be tested, and ``leftUTF8`` reads only
    what it keeps (``substringUTF8`` read the whole value), so a long value is read once after it
    is decompressed, for its count.

    Read with ``SHOWN_SETTINGS``: ClickHouse's short-circuit evaluation of the ``if`` copies the
    values each branch takes out of the whole column first, which cost more than both branches
    over every value (19,801 spans carrying 633 MB of prompts: 207 ms against 145, the bare read
    of the values 126; docs/benchmarks.md, "Wide traces")."""
    return f"""mapApply((k, v) -> (k, if(
        length(v) <= {{cut:UInt32}} OR has({{keys:Array(String)}}, k)
            OR (length(v) <= 4 * {{cut:UInt32}} AND lengthUTF8(v) <= {{cut:UInt32}}),
        v,
        concat(leftUTF8(v, {{cut:UInt32}}), '...[', toString(lengthUTF8(v)), ' characters]')
    )), {attributes})"""


#: ``TRACE_SPANS`` as a trace's answers show it: every attribute value and resource attribute
#: value of more than ``{cut}`` characters cut (``_cut``) but those of ``{keys}`` (the rules'),
#: from which the attribution is worked out.
TRACE_SPANS_SHOWN = _trace_spans(
    f"{_cut('SpanAttributes')} AS Attributes", f"{_cut('ResourceAttributes')} AS Resource"
)
#: The settings ``TRACE_SPANS_SHOWN`` is read with (``_cut``).
SHOWN_SETTINGS = {"short_circuit_function_evaluation": "'disable'"}


#: One span of a trace as stored, every value whole (the first copy of a span stored twice).
#: ClickHouse reads the span's id first and its attributes only around the span, so a span of a
#: trace carrying GBs of prompts is read in milliseconds.
SPAN_STORED = f"""
SELECT
    ParentSpanId, SpanName, SpanKind, ServiceName, toUnixTimestamp64Nano(Timestamp) AS StartNs,
    Duration, StatusCode, StatusMessage, SpanAttributes, ResourceAttributes,
    Events.Name, arrayMap(t -> toUnixTimestamp64Nano(t), Events.Timestamp), Events.Attributes,
    Links.TraceId, Links.SpanId, Links.Attributes
FROM {SPANS_TABLE}
WHERE TraceId = {{trace_id:String}} AND SpanId = {{span_id:String}}
LIMIT 1
"""
