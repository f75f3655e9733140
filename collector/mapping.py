"""OTLP -> spans-table rows: the one place that knows both layouts.

Column layout and value stringification follow the OpenTelemetry Collector's ClickHouse
exporter (``otel_traces``): ids as lowercase hex, ``SpanKind`` / ``StatusCode`` as words,
attributes flattened into ``Map(String, String)`` with non-string values rendered the way
pdata's ``Value.AsString()`` does (bools ``true``/``false``, doubles without exponent, bytes in
base64, arrays and kvlists as JSON).
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span, Status

from latscope.semconv import ResourceAttributes

_MAP = pa.map_(pa.string(), pa.string())

SPANS_SCHEMA = pa.schema(
    [
        ("Timestamp", pa.timestamp("ns")),
        ("TraceId", pa.string()),
        ("SpanId", pa.string()),
        ("ParentSpanId", pa.string()),
        ("TraceState", pa.string()),
        ("SpanName", pa.string()),
        ("SpanKind", pa.string()),
        ("ServiceName", pa.string()),
        ("ResourceAttributes", _MAP),
        ("ScopeName", pa.string()),
        ("ScopeVersion", pa.string()),
        ("SpanAttributes", _MAP),
        ("Duration", pa.uint64()),
        ("StatusCode", pa.string()),
        ("StatusMessage", pa.string()),
        ("Events.Timestamp", pa.list_(pa.timestamp("ns"))),
        ("Events.Name", pa.list_(pa.string())),
        ("Events.Attributes", pa.list_(_MAP)),
        ("Links.TraceId", pa.list_(pa.string())),
        ("Links.SpanId", pa.list_(pa.string())),
        ("Links.TraceState", pa.list_(pa.string())),
        ("Links.Attributes", pa.list_(_MAP)),
    ]
)

SPAN_KINDS = {
    Span.SPAN_KIND_UNSPECIFIED: "Unspecified",
    Span.SPAN_KIND_INTERNAL: "Internal",
    Span.SPAN_KIND_SERVER: "Server",
    Span.SPAN_KIND_CLIENT: "Client",
    Span.SPAN_KIND_PRODUCER: "Producer",
    Span.SPAN_KIND_CONSUMER: "Consumer",
}

STATUS_CODES = {
    Status.STATUS_CODE_UNSET: "Unset",
    Status.STATUS_CODE_OK: "Ok",
    Status.STATUS_CODE_ERROR: "Error",
}


def format_double(value: float) -> str:
    """A double as Go's ``strconv.FormatFloat(v, 'f', -1, 64)``: shortest, never an exponent."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(value)
    if "e" in text or "E" in text:
        from decimal import Decimal

        text = format(Decimal(text), "f")
    elif text.endswith(".0"):
        text = text[:-2]
    return text


def _json_value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "int_value":
        return value.int_value
    if kind == "double_value":
        d = value.double_value
        return d if math.isfinite(d) else format_double(d)
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    if kind == "array_value":
        return [_json_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _json_value(kv.value) for kv in value.kvlist_value.values}
    return None


def value_to_string(value: AnyValue) -> str:
    """Render one attribute value as the spans table stores it."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "int_value":
        return str(value.int_value)
    if kind == "bool_value":
        return "true" if value.bool_value else "false"
    if kind == "double_value":
        return format_double(value.double_value)
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    if kind in ("array_value", "kvlist_value"):
        return json.dumps(_json_value(value), separators=(",", ":"), ensure_ascii=False)
    return ""


def attributes_to_pairs(attributes: Iterable[KeyValue]) -> list[tuple[str, str]]:
    # A repeated key keeps its last value, as a map would.
    out: dict[str, str] = {}
    for kv in attributes:
        out[kv.key] = value_to_string(kv.value)
    return list(out.items())


def resource_spans_to_columns(
    resource_spans: Iterable[ResourceSpans], spans_filter: Any = None
) -> dict[str, list]:
    """Flatten OTLP ``ResourceSpans`` into column lists in ``SPANS_SCHEMA`` order.

    ``spans_filter(span) -> bool`` may drop individual spans (validation happens before this).
    """
    cols: dict[str, list] = {name: [] for name in SPANS_SCHEMA.names}
    ts, trace_id, span_id, parent = (
        cols["Timestamp"],
        cols["TraceId"],
        cols["SpanId"],
        cols["ParentSpanId"],
    )
    for rs in resource_spans:
        res_pairs = attributes_to_pairs(rs.resource.attributes)
        service = dict(res_pairs).get(ResourceAttributes.SERVICE_NAME, "")
        for ss in rs.scope_spans:
            scope_name, scope_version = ss.scope.name, ss.scope.version
            for span in ss.spans:
                if spans_filter is not None and not spans_filter(span):
                    continue
                ts.append(span.start_time_unix_nano)
                trace_id.append(span.trace_id.hex())
                span_id.append(span.span_id.hex())
                parent.append(span.parent_span_id.hex())
                cols["TraceState"].append(span.trace_state)
                cols["SpanName"].append(span.name)
                cols["SpanKind"].append(SPAN_KINDS.get(span.kind, "Unspecified"))
                cols["ServiceName"].append(service)
                cols["ResourceAttributes"].append(res_pairs)
                cols["ScopeName"].append(scope_name)
                cols["ScopeVersion"].append(scope_version)
                cols["SpanAttributes"].append(attributes_to_pairs(span.attributes))
                cols["Duration"].append(max(0, span.end_time_unix_nano - span.start_time_unix_nano))
                cols["StatusCode"].append(STATUS_CODES.get(span.status.code, "Unset"))
                cols["StatusMessage"].append(span.status.message)
                cols["Events.Timestamp"].append([e.time_unix_nano for e in span.events])
                cols["Events.Name"].append([e.name for e in span.events])
                cols["Events.Attributes"].append(
                    [attributes_to_pairs(e.attributes) for e in span.events]
                )
                cols["Links.TraceId"].append([lk.trace_id.hex() for lk in span.links])
                cols["Links.SpanId"].append([lk.span_id.hex() for lk in span.links])
                cols["Links.TraceState"].append([lk.trace_state for lk in span.links])
                cols["Links.Attributes"].append(
                    [attributes_to_pairs(lk.attributes) for lk in span.links]
                )
    return cols


def columns_to_table(cols: dict[str, list]) -> pa.Table:
    return pa.Table.from_pydict(cols, schema=SPANS_SCHEMA)


def spans_table(resource_spans: Iterable[ResourceSpans]) -> pa.Table:
    """OTLP ``ResourceSpans`` -> an Arrow table ready for ``Store.insert_arrow``."""
    return columns_to_table(resource_spans_to_columns(resource_spans))
