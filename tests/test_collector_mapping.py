"""OTLP -> columns: value rendering as the OTel ClickHouse exporter does it, and validation."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span, Status

from latscope.collector.mapping import (
    DECODED_SPANS_SCHEMA,
    Limits,
    SpanColumns,
    format_double,
    value_to_string,
)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (AnyValue(string_value="héllo"), "héllo"),
        (AnyValue(bool_value=True), "true"),
        (AnyValue(bool_value=False), "false"),
        (AnyValue(int_value=-42), "-42"),
        (AnyValue(int_value=0), "0"),
        (AnyValue(double_value=0.25), "0.25"),
        (AnyValue(double_value=3.0), "3"),
        (AnyValue(double_value=1e21), "1000000000000000000000"),
        (AnyValue(double_value=1.5e-7), "0.00000015"),
        (AnyValue(double_value=math.inf), "+Inf"),
        (AnyValue(bytes_value=b"\x00\xff"), "AP8="),
        (
            AnyValue(array_value=ArrayValue(values=[AnyValue(int_value=1),
                                                    AnyValue(string_value="a")])),
            '[1,"a"]',
        ),
        (
            AnyValue(kvlist_value=KeyValueList(values=[
                KeyValue(key="k", value=AnyValue(bool_value=True)),
                KeyValue(key="n", value=AnyValue(double_value=math.nan)),
            ])),
            '{"k":true,"n":"NaN"}',
        ),
        (AnyValue(), ""),
    ],
)  # fmt: skip
def test_values_render_like_the_otel_clickhouse_exporter(value: AnyValue, text: str) -> None:
    assert value_to_string(value) == text


@settings(max_examples=200, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_doubles_never_use_an_exponent_and_round_trip(value: float) -> None:
    text = format_double(value)
    assert "e" not in text.lower()
    assert float(text) == value


def _span(**fields: object) -> Span:
    base: dict[str, object] = {
        "trace_id": b"\x01" * 16,
        "span_id": b"\x02" * 8,
        "name": "s",
        "start_time_unix_nano": 10,
        "end_time_unix_nano": 30,
    }
    base.update(fields)
    return Span(**base)  # type: ignore[arg-type]


def _columns(*spans: Span, limits: Limits | None = None) -> SpanColumns:
    rs = ResourceSpans()
    rs.resource.attributes.add(key="service.name", value=AnyValue(string_value="first"))
    rs.resource.attributes.add(key="service.name", value=AnyValue(string_value="svc"))
    ss = rs.scope_spans.add()
    ss.scope.name, ss.scope.version = "lib", "2.0"
    ss.spans.extend(spans)
    cols = SpanColumns(limits or Limits())
    cols.add([rs])
    return cols


def test_every_field_lands_in_its_column() -> None:
    span = _span(
        parent_span_id=b"\x03" * 8,
        trace_state="k=v",
        kind=Span.SPAN_KIND_CONSUMER,
        status=Status(code=Status.STATUS_CODE_ERROR, message="bad"),
        attributes=[
            KeyValue(key="a", value=AnyValue(int_value=1)),
            KeyValue(key="a", value=AnyValue(int_value=2)),  # a repeated key keeps the last
        ],
        events=[Span.Event(time_unix_nano=20, name="e",
                           attributes=[KeyValue(key="x", value=AnyValue(string_value="y"))])],
        links=[Span.Link(trace_id=b"\x04" * 16, span_id=b"\x05" * 8, trace_state="s")],
    )  # fmt: skip
    table = _columns(span).table()
    assert table.schema == DECODED_SPANS_SCHEMA
    row = table.to_pylist()[0]
    assert row["TraceId"] == "01" * 16 and row["SpanId"] == "02" * 8
    assert row["ParentSpanId"] == "03" * 8 and row["TraceState"] == "k=v"
    assert (row["SpanKind"], row["StatusCode"], row["StatusMessage"]) == (
        "Consumer",
        "Error",
        "bad",
    )
    assert row["ServiceName"] == "svc"
    assert row["ResourceAttributes"] == [("service.name", "svc")]
    assert (row["ScopeName"], row["ScopeVersion"]) == ("lib", "2.0")
    assert row["SpanAttributes"] == [("a", "2")]
    assert row["Duration"] == 20
    assert row["Events.Name"] == ["e"] and row["Events.Attributes"] == [[("x", "y")]]
    assert row["Links.TraceId"] == ["04" * 16] and row["Links.SpanId"] == ["05" * 8]
    assert row["Links.TraceState"] == ["s"] and row["Links.Attributes"] == [[]]


@pytest.mark.parametrize(
    ("span", "reason"),
    [
        (_span(trace_id=b"\x01" * 8), "trace_id must be 16 bytes"),
        (_span(trace_id=bytes(16)), "trace_id must be 16 bytes, not all zero"),
        (_span(span_id=b""), "span_id must be 8 bytes"),
        (_span(parent_span_id=b"\x01" * 4), "parent_span_id must be empty or 8 bytes"),
        (_span(end_time_unix_nano=5), "end_time_unix_nano is before start_time_unix_nano"),
        (_span(attributes=[KeyValue(key=str(i), value=AnyValue(int_value=i)) for i in range(5)]),
         "5 attributes, more than the limit of 4"),
        (_span(attributes=[KeyValue(key="big", value=AnyValue(string_value="x" * 11))]),
         "attribute 'big' is 11 long, more than 10"),
        (_span(events=[Span.Event(name="e", attributes=[
            KeyValue(key="big", value=AnyValue(bytes_value=b"x" * 20))])]),
         "event 'e': attribute 'big'"),
    ],
)  # fmt: skip
def test_a_bad_span_is_rejected_alone_with_its_reason(span: Span, reason: str) -> None:
    good = _span(span_id=b"\x09" * 8)
    cols = _columns(span, good, limits=Limits(max_attributes=4, max_attribute_value=10))
    assert (cols.rows, cols.rejected) == (1, 1)
    assert reason in cols.first_problem
    table = cols.table()
    assert table.column("SpanId").to_pylist() == ["09" * 8]
    assert table.column("Events.Name").to_pylist() == [[]]
