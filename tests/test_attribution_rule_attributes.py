"""``LatscopeRuleAttributes`` (deploy/clickhouse/007_rule_attributes.sql): the attributes the
rules read, by code, computed by ClickHouse as spans are stored. Its codes are the rules' codes,
and spans stored before the column existed (parts without it) are attributed exactly as spans
stored after it, before and after the column is materialized for them."""

from __future__ import annotations

import re

import pytest

from latscope.attribution.sql import CODES, KEYS
from latscope.storage import SPANS_TABLE, Store, ddl_files
from tests.agent_traces import mixed_traces
from tests.attribution_support import check_stored, store_traces
from tests.serve_support import release_embedded_store

DDL = "007_rule_attributes.sql"
COLUMN = "LatscopeRuleAttributes"


def _ddl() -> str:
    return next(f.sql for f in ddl_files() if f.name == DDL)


def test_the_stored_codes_are_the_rules_codes() -> None:
    """The codes stored in every part are the DDL's; the rules look values up by KEYS' codes. A
    change of KEYS' order would make every stored span read wrong, so it fails here."""
    keys_list, codes_list = re.search(
        r"transform\(key, \[(.*?)\], \[(.*?)\], 0\)", _ddl(), re.S
    ).groups()  # type: ignore[union-attr]
    keys = re.findall(r"'([^']*)'", keys_list)
    codes = [int(c) for c in re.findall(r"\d+", codes_list)]
    assert keys == list(KEYS.values())
    assert codes == [CODES[name] for name in KEYS]


def _columns_of_parts(store: Store) -> set[str]:
    """The columns the spans table's active parts hold on disk."""
    rows = store.query_rows(
        "SELECT DISTINCT column FROM system.parts_columns WHERE database = currentDatabase() "
        "AND table = {t:String} AND active",
        {"t": SPANS_TABLE},
    )
    return {r[0] for r in rows}


@pytest.mark.slow
def test_spans_stored_before_the_column_are_attributed_as_after(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    release_embedded_store()  # chDB opens one data directory per process
    store = Store.open(f"chdb://{tmp_path_factory.mktemp('rule-attributes') / 'store'}")
    version = int(DDL[:3])
    try:
        store.apply_schema(upto=version - 1)  # the schema as it was before the column
        traces = mixed_traces([0], runs=3)
        before = store_traces(store, traces)
        assert store.apply_schema() >= version
        assert COLUMN not in _columns_of_parts(store)  # read by computing it from SpanAttributes
        after = store_traces(store, traces)
        check_stored(store, before)
        check_stored(store, after)

        store.command(
            f"ALTER TABLE {SPANS_TABLE} MATERIALIZE COLUMN {COLUMN} SETTINGS mutations_sync = 2"
        )
        assert COLUMN in _columns_of_parts(store)
        check_stored(store, before)
    finally:
        store.close()
