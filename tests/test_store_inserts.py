"""Inserts into the embedded store: chDB reads the Arrow table in place, stores what
clickhouse-connect's Arrow insert stores, deduplicates by token, refuses with ClickHouse's code,
and writes no temporary file."""

from __future__ import annotations

import os
import random
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from bench.ingest.traces import make_batch
from latscope.collector.mapping import RESOURCE_ID, combine, decode_spans, resource_ids
from latscope.collector.writer import in_the_data
from latscope.storage import SPANS_TABLE, Store, StoreError
from tests.serve_support import embedded_store


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return embedded_store(tmp_path_factory)


@pytest.fixture
def scratch(store: Store) -> Iterator[list[str]]:
    """Names for tables shaped like the spans table, dropped afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        store.command(f"DROP TABLE IF EXISTS {name}")


def _spans_table(store: Store, names: list[str]) -> str:
    name = f"spans_{uuid.uuid4().hex[:12]}"
    store.command(f"CREATE TABLE {name} AS {SPANS_TABLE}")
    names.append(name)
    return name


def _decoded_spans(exports: int = 3) -> pa.Table:
    """Spans as the collector inserts them: decoded Exports, one chunk per column, with the
    resource attributes dictionary-encoded and each span's resource id."""
    rng = random.Random(7)
    start = 1_763_000_000_000_000_000
    tables = [
        decode_spans(make_batch(rng, start + i * 10**9, 8).SerializeToString()).table
        for i in range(exports)
    ]
    table = combine(pa.concat_tables(tables))
    ids, _ = resource_ids(table.column("ResourceAttributes"))
    return table.append_column(RESOURCE_ID, ids)


def test_rows_stored_are_those_clickhouse_connects_arrow_insert_stores(
    store: Store, scratch: list[str]
) -> None:
    spans = _decoded_spans()
    assert pa.types.is_dictionary(spans.schema.field("ResourceAttributes").type)
    ours, theirs = _spans_table(store, scratch), _spans_table(store, scratch)
    store.insert_arrow(ours, spans, dedup_token="a" * 32)
    store.client.insert_arrow(theirs, spans)  # the Arrow format, parsed by ClickHouse
    columns = ", ".join(f"`{c}`" for c in spans.column_names)
    for a, b in ((ours, theirs), (theirs, ours)):
        differing = (
            f"SELECT count() FROM ((SELECT {columns} FROM {a}) EXCEPT (SELECT {columns} FROM {b}))"
        )
        assert store.query_rows(differing) == [(0,)]
    assert store.query_rows(f"SELECT count() FROM {ours}") == [(spans.num_rows,)]
    # Nothing was left out: the maps and lists hold what was decoded.
    pairs = store.query_rows(
        f"SELECT sum(length(SpanAttributes)), sum(length(ResourceAttributes)), "
        f"sum(length(Events.Name)) FROM {ours}"
    )[0]
    resources = spans.column("ResourceAttributes").chunk(0)
    resource_pairs = sum(
        len(resources.dictionary[i].as_py()) for i in resources.indices.to_pylist()
    )
    events = sum(len(e) for e in spans.column("Events.Name").to_pylist())
    attributes = sum(len(a) for a in spans.column("SpanAttributes").to_pylist())
    assert pairs == (attributes, resource_pairs, events)
    assert min(pairs[:2]) > 0


def test_an_insert_repeated_with_its_token_stores_nothing_twice(
    store: Store, scratch: list[str]
) -> None:
    spans = _decoded_spans(1)
    table = _spans_table(store, scratch)
    for _ in range(2):
        store.insert_arrow(table, spans, dedup_token="b" * 32)
    store.insert_arrow(table, spans.slice(0, 5), dedup_token="c" * 32)
    assert store.query_rows(f"SELECT count() FROM {table}") == [(spans.num_rows + 5,)]


def test_a_refused_insert_raises_clickhouses_code_and_stores_nothing(
    store: Store, scratch: list[str]
) -> None:
    spans = _decoded_spans(1)
    table = _spans_table(store, scratch)
    store.command(
        f"ALTER TABLE {table} ADD CONSTRAINT no_chat CHECK NOT startsWith(SpanName, 'chat')"
    )
    with pytest.raises(StoreError) as refused:
        store.insert_arrow(table, spans, dedup_token="d" * 32)
    assert "VIOLATED_CONSTRAINT" in str(refused.value) and in_the_data(refused.value)
    assert store.query_rows(f"SELECT count() FROM {table}") == [(0,)]


def test_an_insert_writes_no_temporary_file(
    store: Store, scratch: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A temporary directory that does not exist: an insert that wrote a file there would fail
    # (clickhouse-connect's embedded insert writes each one to a file and reads it back; a
    # process killed meanwhile left the file behind).
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "absent"))
    table = _spans_table(store, scratch)
    store.insert_arrow(table, _decoded_spans(1), dedup_token="e" * 32)
    assert store.query_rows(f"SELECT count() > 0 FROM {table}") == [(1,)]
    assert not os.path.exists(tmp_path / "absent")
