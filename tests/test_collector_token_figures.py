"""The token figures the collector stores with a span (LatscopeTokenFigures, 011): the C decoder,
the Python mapping and the SQL attributor's own computation give tokens.token_figures, to the bit,
and the same nothing for offsets that are not a JSON array of integers."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from latscope.attribution.sql import STORED_STALL_NS, gaps
from latscope.attribution.sql import token_figures as token_figures_sql
from latscope.collector import mapping
from latscope.collector.mapping import decode_spans, stored_token_figures
from latscope.semconv import LatscopeAttributes
from latscope.storage import Store
from latscope.tokens import DEFAULT_STALL_NS, STALLS, token_figures
from tests.hypothesis_support import examples

native = pytest.mark.skipif(not mapping.NATIVE, reason="the C decoder is not built here")

#: Offsets of up to 15 digits (tokens.INT_ARRAY), negative ones too.
OFFSET = st.integers(-(10**15) + 1, 10**15 - 1)
#: Token offsets as real streams give them: increasing, gaps from 0 to a few seconds.
STREAM = st.lists(st.integers(0, 3_000_000), min_size=1, max_size=80).map(
    lambda gaps: [sum(gaps[: i + 1]) for i in range(len(gaps))]
)
OFFSETS = st.one_of(STREAM, st.lists(OFFSET, min_size=1, max_size=40))


def _export(value: AnyValue) -> bytes:
    span = Span(
        trace_id=b"\x01" * 16,
        span_id=b"\x02" * 8,
        name="decode",
        start_time_unix_nano=1_763_000_000_000_000_000,
        end_time_unix_nano=1_763_000_001_000_000_000,
        attributes=[
            KeyValue(key="latscope.phase", value=AnyValue(string_value="decode")),
            KeyValue(key=LatscopeAttributes.TOKEN_OFFSETS_US, value=value),
        ],
    )
    rs = ResourceSpans(scope_spans=[ScopeSpans(spans=[span])])
    return ExportTraceServiceRequest(resource_spans=[rs]).SerializeToString()


def _stored(value: AnyValue, *, native: bool) -> list[float]:
    (figures,) = decode_spans(_export(value), native=native).table["LatscopeTokenFigures"]
    return figures.as_py()


def _bits(figures: list[float]) -> list[bytes]:
    return [struct.pack("<d", f) for f in figures]


def _text(offsets: list[int], sep: str) -> str:
    return "[" + sep.join(str(o) for o in offsets) + "]"


@settings(max_examples=examples(300))
@given(OFFSETS, st.sampled_from([",", ", ", " ,\n", "\t,\r "]))
def test_both_decoders_store_the_rules_figures(offsets: list[int], sep: str) -> None:
    want = _bits(token_figures(offsets, DEFAULT_STALL_NS))
    value = AnyValue(string_value=_text(offsets, sep))
    assert _bits(_stored(value, native=False)) == want
    if mapping.NATIVE:
        assert _bits(_stored(value, native=True)) == want


@pytest.mark.parametrize(
    "text",
    [
        "", "1", "[]", "[ ]", "[1,]", "[,1]", "[01]", "[-]", "[--1]", "[1 2]", "[1.0]", "[1e3]",
        "[1]\n", "[1] ", " [1]", "[1]]", "[[1]]", "[1234567890123456]", "[-1234567890123456]",
        '["1"]', "[+1]", "[1,\u00a02]",
    ],
)  # fmt: skip
def test_offsets_that_are_not_a_list_of_integers_store_nothing(text: str) -> None:
    """What tokens.parse_int_list refuses (the rules then see no token offsets)."""
    assert stored_token_figures(text) == []
    value = AnyValue(string_value=text)
    assert _stored(value, native=False) == []
    if mapping.NATIVE:
        assert _stored(value, native=True) == []


@native
def test_an_array_attribute_is_read_as_its_json_text() -> None:
    """An OTLP array of ints is stored as its JSON text, which the rules read as offsets."""
    value = AnyValue(
        array_value=ArrayValue(values=[AnyValue(int_value=v) for v in (0, 1500, 4000)])
    )
    want = token_figures([0, 1500, 4000], DEFAULT_STALL_NS)
    assert _stored(value, native=True) == _stored(value, native=False) == want


def test_stalls_are_gaps_longer_than_the_default_threshold() -> None:
    """A gap of exactly 250 ms is not a stall, one a microsecond longer is (the C decoder's
    threshold is the engine's default, which the SQL attributor trusts the stored figures at)."""
    assert STORED_STALL_NS == DEFAULT_STALL_NS
    offsets = [0, 250_000, 500_001]
    value = AnyValue(string_value=_text(offsets, ","))
    assert _stored(value, native=False)[STALLS] == 1
    if mapping.NATIVE:
        assert _stored(value, native=True)[STALLS] == 1


@settings(max_examples=examples(20), deadline=None)
@given(st.lists(OFFSETS, min_size=1, max_size=30), st.sampled_from([DEFAULT_STALL_NS, 10**7]))
def test_the_sql_computes_the_same_figures(
    store: Store, batch: list[list[int]], stall_ns: int
) -> None:
    """Where a writer stored no figures the attributor computes them (sql.token_figures): the
    same bits as the rules, at any stall threshold."""
    sql = (
        f"SELECT {token_figures_sql('offsets')} FROM (SELECT offsets, {gaps('offsets')} "
        "FROM (SELECT arrayJoin({batch:Array(Array(Int64))}) AS offsets))"
    )
    rows = store.query_rows(sql, {"batch": batch, "stall_ns": stall_ns})
    for offsets, (got,) in zip(batch, rows, strict=True):
        assert _bits(list(got)) == _bits(token_figures(offsets, stall_ns)), offsets
