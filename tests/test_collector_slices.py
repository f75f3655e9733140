"""How the collector sizes and cuts a journal segment for its inserts (``insert_slices``)."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from latscope.collector import mapping
from latscope.collector.mapping import combine, decode_spans, expanded_bytes, insert_slices
from tests.collector_exports import exports


def _segment(requests: list[ExportTraceServiceRequest]) -> pa.Table:
    """Exports decoded one by one and concatenated, as a journal segment holds them."""
    return pa.concat_tables(decode_spans(r.SerializeToString()).table for r in requests)


def _by_hand(table: pa.Table) -> int:
    """``expanded_bytes`` from the rows: each row's map written out (its keys' and values' bytes,
    8 bytes of offsets a pair, 4 a map) and its index for a dictionary column; Arrow's size for
    the rest."""
    total = 0
    for column in table.columns:
        if not pa.types.is_dictionary(column.type):
            total += column.nbytes
            continue
        for chunk in column.chunks:
            total += 4 * len(chunk)  # its int32 indices
            for row in chunk.to_pylist():
                pairs = row or []
                total += 4 + sum(8 + len(k.encode()) + len(v.encode()) for k, v in pairs)
    return total


@settings(max_examples=40, deadline=None)
@given(st.lists(exports(), min_size=1, max_size=4))
def test_a_segment_s_expanded_size_counts_each_row_s_resource(
    requests: list[ExportTraceServiceRequest],
) -> None:
    table = _segment(requests)
    assert expanded_bytes(table) == _by_hand(table)
    # The C decoder counts the same while decoding (the Python mapping leaves it to the table).
    if mapping.NATIVE:
        counted = [decode_spans(r.SerializeToString()).expanded for r in requests]
        assert sum(c for c in counted if c is not None) == _by_hand(table)
    # Joined into one chunk per column, the rows and their size stay the same.
    joined = combine(table)
    assert joined.to_pylist() == table.to_pylist()
    assert all(column.num_chunks == 1 for column in joined.columns)
    assert expanded_bytes(joined) == _by_hand(joined)


@settings(max_examples=40, deadline=None)
@given(st.lists(exports(), min_size=2, max_size=4), st.integers(2, 8))
def test_a_segment_past_the_limit_is_cut_the_same_way_every_time(
    requests: list[ExportTraceServiceRequest], parts: int
) -> None:
    table = _segment(requests)
    size = expanded_bytes(table)
    limit = max(1, size // parts)
    slices = insert_slices(table, limit)
    if table.num_rows <= 1 or size <= limit:
        assert slices == [table]
        return
    # Consecutive, every row once, in order.
    assert pa.concat_tables(slices).to_pylist() == table.to_pylist()
    assert len(slices) > 1
    # Rebuilt from the same Exports (a replay of the spooled segment): the same cut.
    again = insert_slices(_segment(requests), limit)
    assert [s.num_rows for s in again] == [s.num_rows for s in slices]
    # Sized by the decoder's counts (a segment still in memory): the same cut again.
    if mapping.NATIVE:
        counted = sum(decode_spans(r.SerializeToString()).expanded or 0 for r in requests)
        sized = insert_slices(table, limit, counted)
        assert [s.num_rows for s in sized] == [s.num_rows for s in slices]
