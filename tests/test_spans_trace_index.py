"""The trace id indexes of the spans and the attribution rows
(deploy/clickhouse/009_trace_id_bloom.sql): a read of a pass's new trace ids skips most granules
of parts that hold none of them, where the index before 009 let most through; a store from before
009 gets the new indexes for the parts it holds, and attributes as before."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest

from bench.sqlids import hex_trace_id, hex_word
from latscope.storage import ATTRIBUTION_TABLE, SPANS_TABLE, Store
from tests.agent_traces import mixed_traces
from tests.attribution_support import check_stored, store_traces
from tests.serve_support import release_embedded_store

DDL = "009_trace_id_bloom.sql"
INDEX = "idx_trace_id"
#: 001_spans.sql's index, which 009 replaces.
OLD = "bloom_filter(0.001)"
#: Ids per pass (serve's pass at about 1,000 requests a second).
IDS = 1_000
_GRANULES = re.compile(r"Granules: (\d+)/(\d+)")


def _index(store: Store, table: str = SPANS_TABLE) -> str:
    rows = store.query_rows(
        "SELECT type_full FROM system.data_skipping_indices WHERE database = currentDatabase() "
        "AND table = {t:String} AND name = {n:String}",
        {"t": table, "n": INDEX},
    )
    return str(rows[0][0]) if rows else ""


def _kept(store: Store, ids_sql: str) -> tuple[int, int]:
    """Granules a read of these trace ids keeps after the bloom filter, of those the primary
    key kept."""
    plan = "\n".join(
        r[0]
        for r in store.query_rows(
            f"EXPLAIN indexes = 1 SELECT count() FROM {SPANS_TABLE} WHERE TraceId IN ({ids_sql})"
        )
    )
    assert f"Name: {INDEX}" in plan, plan
    match = _GRANULES.search(plan[plan.index(f"Name: {INDEX}") :])
    assert match, plan
    return int(match.group(1)), int(match.group(2))


def _mutations_done(store: Store, table: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while store.query_rows(
        "SELECT count() FROM system.mutations WHERE database = currentDatabase() "
        "AND table = {t:String} AND NOT is_done",
        {"t": table},
    )[0][0]:
        assert time.monotonic() < deadline, "the index was not built in time"
        time.sleep(0.1)


@pytest.fixture
def own_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    release_embedded_store()  # chDB opens one data directory per process
    store = Store.open(f"chdb://{tmp_path_factory.mktemp('trace-index') / 'store'}")
    yield store
    store.close()


@pytest.mark.slow
def test_a_pass_of_new_trace_ids_skips_the_parts_without_them(own_store: Store) -> None:
    """1.4 M spans of earlier traces in one hour, merged into one part (171 granules of 8,192),
    then the trace ids of a pass (none stored): the bloom filter keeps a tenth of the granules
    the primary key keeps; the index before 009 kept most of them."""
    store = own_store
    store.apply_schema()
    assert _index(store) == "bloom_filter(0.0001)"
    store.command(
        f"""INSERT INTO {SPANS_TABLE} (Timestamp, TraceId, SpanId, ServiceName, SpanName, SpanKind,
    SpanAttributes)
SELECT toDateTime64('2025-11-13 10:00:00', 9) + toIntervalMillisecond(number % 3600000),
       {hex_trace_id("intDiv(number, 7)")},
       {hex_word("number", 3)}, 'earlier', 'step', 'Internal', map('step', '1')
FROM numbers(1400000)"""
    )
    store.command(f"OPTIMIZE TABLE {SPANS_TABLE} FINAL")
    new_ids = f"SELECT {hex_trace_id('number', 11)} FROM numbers({IDS})"
    stored = f"SELECT {hex_trace_id(42)}"
    by_id = f"SELECT count() FROM {SPANS_TABLE} WHERE TraceId IN ({stored})"
    kept, considered = _kept(store, new_ids)
    assert considered > 50, considered  # the key cannot skip most: the ids fall in every range
    assert kept <= 0.25 * considered, (kept, considered)  # about 10 % at 1e-4 per id
    assert store.query_rows(by_id) == [(7,)]  # a stored trace is found: its 7 spans

    # The same read under the index 001 made: 1 - 0.999^1000 = 63 % of the granules.
    store.command(f"ALTER TABLE {SPANS_TABLE} DROP INDEX {INDEX}")
    store.command(f"ALTER TABLE {SPANS_TABLE} ADD INDEX {INDEX} TraceId TYPE {OLD} GRANULARITY 1")
    store.command(
        f"ALTER TABLE {SPANS_TABLE} MATERIALIZE INDEX {INDEX} SETTINGS mutations_sync = 2"
    )
    old_kept, old_considered = _kept(store, new_ids)
    assert old_considered == considered
    assert old_kept >= 0.45 * considered, (old_kept, considered)
    assert store.query_rows(by_id) == [(7,)]


@pytest.mark.slow
def test_a_store_from_before_the_file_gets_the_new_index_and_attributes_as_before(
    own_store: Store,
) -> None:
    store = own_store
    version = int(DDL[:3])
    store.apply_schema(upto=version - 1)  # the schema as it was before the file
    assert _index(store) == _index(store, ATTRIBUTION_TABLE) == OLD
    traces = mixed_traces([0], runs=2)
    before = store_traces(store, traces, figures=False)  # no column of 011 yet
    # Rows written before the file (the attribution table's parts get the new index too): one
    # per SERVER span, keyed as the attributor keys them. (The attributor itself reads columns of
    # later files, 010's span facts, and runs on the whole schema only.)
    store.command(
        f"INSERT INTO {ATTRIBUTION_TABLE} (Timestamp, TraceId, RequestSpanId, ServiceName) "
        f"SELECT Timestamp, TraceId, SpanId, ServiceName FROM {SPANS_TABLE} "
        "WHERE SpanKind = 'Server'"
    )
    rows_by_trace = dict(
        store.query_rows(f"SELECT TraceId, count() FROM {ATTRIBUTION_TABLE} FINAL GROUP BY TraceId")
    )
    assert rows_by_trace

    assert store.apply_schema() >= version
    for table in (SPANS_TABLE, ATTRIBUTION_TABLE):
        assert _index(store, table) == "bloom_filter(0.0001)"
        _mutations_done(store, table)  # MATERIALIZE INDEX runs in the background
        parts, without = store.query_rows(
            "SELECT count(), countIf(secondary_indices_compressed_bytes = 0) FROM system.parts "
            "WHERE database = currentDatabase() AND table = {t:String} AND active",
            {"t": table},
        )[0]
        assert parts > 0 and without == 0, (table, parts, without)  # each has the new filter
    # The spans and rows of each stored trace are found by id, and attributed as before the file.
    for stored_id, (_, spans) in before.items():
        found = store.query_rows(
            f"SELECT count() FROM {SPANS_TABLE} WHERE TraceId = {{id:String}}", {"id": stored_id}
        )[0][0]
        assert found == len(spans)
        rows = store.query_rows(
            f"SELECT count() FROM {ATTRIBUTION_TABLE} FINAL WHERE TraceId = {{id:String}}",
            {"id": stored_id},
        )[0][0]
        assert rows == rows_by_trace.get(stored_id, 0)
    check_stored(store, before)
    check_stored(store, store_traces(store, traces))
