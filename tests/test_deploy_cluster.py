"""The cluster DDL (deploy/clickhouse/cluster/) against the single-node schema, on chDB.

The cluster files are generated from the single-node files; a stale copy fails here. Their
statements are then applied to chDB without what needs a real cluster (``ON CLUSTER``, Keeper
paths of the ``Replicated*`` engines, the ``Distributed`` engine's cluster): every table must come
out with the single-node table's columns, types, codecs, keys and indexes.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from latscope.storage import DDLFile, Store, StoreError, ddl_files
from tests.serve_support import release_embedded_store

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_DIR = ROOT / "deploy/clickhouse/cluster"


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


generate = _load("latscope_cluster_generate", CLUSTER_DIR / "generate.py")
init_store = _load("latscope_init_store", ROOT / "deploy/init_store.py")
DB = generate.Options().database


def local_twin(statement: str) -> tuple[str, tuple[str, str] | None]:
    """A cluster statement as one server can run it, and (table, sharding key) if Distributed."""
    assert re.search(r"\bON CLUSTER '[^']+'", statement), statement[:80]
    sql = re.sub(r"\s+ON CLUSTER '[^']+'", "", statement)
    sql = re.sub(r"\bReplicated(\w*MergeTree)\('[^']*',\s*'[^']*'(?:,\s*)?", r"\1(", sql)
    sql = sql.replace("replicated_deduplication_window", "non_replicated_deduplication_window")
    dist = re.search(r"ENGINE = Distributed\('[^']+', '(\w+)', '(\w+)', (.+)\)$", sql, re.S)
    if dist is None:
        return sql, None
    db, table, key = dist.groups()
    # chDB has no cluster to distribute over; a Merge table reads the same local table.
    sql = sql[: dist.start()] + f"ENGINE = Merge('{db}', '^{table}$')"
    return sql, (f"{db}.{table}", key)


def cluster_statements() -> list[str]:
    statements = []
    for path in sorted(CLUSTER_DIR.glob("[0-9][0-9][0-9]_*.sql")):
        statements.extend(DDLFile(0, path.name, path.read_text()).statements())
    return statements


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    release_embedded_store()
    store = Store.open(f"chdb://{tmp_path_factory.mktemp('cluster') / 'store'}")
    try:
        store.apply_schema()
        for statement in cluster_statements():
            sql, dist = local_twin(statement)
            store.command(sql)
            if dist:  # the sharding key must be an expression over the local table's columns
                store.query_rows(f"SELECT {dist[1]} FROM {dist[0]} LIMIT 0")
        yield store
    finally:
        store.close()


def single_node_tables() -> list[str]:
    names = []
    for ddl in ddl_files():
        for statement in ddl.statements():
            if match := re.match(r"CREATE TABLE IF NOT EXISTS (\w+)", statement):
                names.append(match.group(1))
    return names


def test_cluster_ddl_is_generated_from_the_current_single_node_ddl() -> None:
    assert generate.stale() == [], "run: python deploy/clickhouse/cluster/generate.py"


def test_every_cluster_statement_is_on_cluster_and_replicated() -> None:
    text = "\n".join(cluster_statements())
    for table in single_node_tables():
        assert f"{DB}.{table}_local ON CLUSTER" in text
        assert f"{DB}.{table} ON CLUSTER" in text
    engines = re.findall(r"ENGINE = (\w+)", text)
    assert engines and all(e.startswith("Replicated") or e == "Distributed" for e in engines)
    assert "{shard}" in text and "{replica}" in text


def test_tables_on_every_node_share_one_keeper_path_and_the_rest_one_per_shard() -> None:
    engines = {}
    for statement in cluster_statements():
        if match := re.search(
            rf"CREATE TABLE IF NOT EXISTS {DB}\.(\w+)_local .*ENGINE = Replicated\w*MergeTree"
            r"\('([^']*)', '([^']*)'",
            statement,
            re.S,
        ):
            engines[match.group(1)] = match.group(2, 3)
    assert set(engines) == set(single_node_tables())
    for table, (path, replica) in engines.items():
        if table in generate.EVERY_NODE:
            assert (path, replica) == (
                f"/clickhouse/tables/all/{DB}/{table}_local",
                "{shard}-{replica}",
            )
        else:
            assert (path, replica) == (
                f"/clickhouse/tables/{{shard}}/{DB}/{table}_local",
                "{replica}",
            )
    assert set(engines) >= generate.EVERY_NODE


def _columns(store: Store, db: str, table: str) -> list[tuple]:
    return store.query_rows(
        "SELECT name, type, default_kind, default_expression, compression_codec "
        "FROM system.columns WHERE database = {db:String} AND table = {t:String} "
        "ORDER BY position",
        {"db": db, "t": table},
    )


def _table(store: Store, db: str, table: str) -> tuple:
    [row] = store.query_rows(
        "SELECT engine, partition_key, sorting_key, primary_key FROM system.tables "
        "WHERE database = {db:String} AND name = {t:String}",
        {"db": db, "t": table},
    )
    return row


def _indexes(store: Store, db: str, table: str) -> list[tuple]:
    return store.query_rows(
        "SELECT name, type_full, expr, granularity FROM system.data_skipping_indices "
        "WHERE database = {db:String} AND table = {t:String} ORDER BY name",
        {"db": db, "t": table},
    )


@pytest.mark.parametrize("table", single_node_tables())
def test_local_table_matches_the_single_node_table(store: Store, table: str) -> None:
    single = ("default", table)
    local = (DB, f"{table}_local")
    assert _columns(store, *local) == _columns(store, *single)
    assert _table(store, *local) == _table(store, *single)
    assert _indexes(store, *local) == _indexes(store, *single)


@pytest.mark.parametrize("table", single_node_tables())
def test_distributed_table_has_the_single_node_columns(store: Store, table: str) -> None:
    def names_types(db: str, name: str) -> list[tuple]:
        return [c[:2] for c in _columns(store, db, name) if c[2] != "MATERIALIZED"]

    assert names_types(DB, table) == names_types("default", table)


@pytest.mark.parametrize("table", single_node_tables())
def test_local_tables_carry_a_ttl(store: Store, table: str) -> None:
    [(query,)] = store.query_rows(
        "SELECT create_table_query FROM system.tables WHERE database = {db:String} "
        "AND name = {t:String}",
        {"db": DB, "t": f"{table}_local"},
    )
    assert re.search(r"\bTTL toDateTime\(Timestamp\) \+ toIntervalDay\(\d+\)", query), query


def test_rows_written_through_the_cluster_tables_read_back(store: Store) -> None:
    store.command(
        f"INSERT INTO {DB}.latscope_metrics_local (Timestamp, ServiceName, MetricName, Value, "
        "Attributes) VALUES (now64(9), 'svc', 'latscope.gpu.utilization', 71.5, "
        "map('gpu.uuid', 'GPU-1', 'gpu.index', '0'))"
    )
    rows = store.query_rows(f"SELECT GpuUuid, Value FROM {DB}.latscope_metrics")
    assert rows == [("GPU-1", 71.5)]


def test_init_store_applies_retention_once(store: Store) -> None:
    sql = (CLUSTER_DIR / "retention.sql").read_text()
    tables = single_node_tables()
    first = init_store.apply_retention(store, sql)
    assert sorted(first) == sorted(tables)
    assert init_store.apply_retention(store, sql) == []  # a restart changes nothing
    for table in tables:
        [(query,)] = store.query_rows(
            "SELECT create_table_query FROM system.tables WHERE database = currentDatabase() "
            "AND name = {t:String}",
            {"t": table},
        )
        assert " TTL " in query, table


def test_init_store_rejects_a_retention_file_with_other_statements(store: Store) -> None:
    with pytest.raises(StoreError, match="MODIFY TTL"):
        init_store.apply_retention(store, "DROP TABLE otel_traces;\n")
    assert store.query_rows("EXISTS TABLE otel_traces") == [(1,)]


def test_generator_refuses_statements_it_cannot_distribute() -> None:
    with pytest.raises(ValueError, match=r"extend generate\.py"):
        generate.cluster_statements(
            "CREATE MATERIALIZED VIEW v TO t AS SELECT 1", generate.Options()
        )


@pytest.mark.subprocess
def test_init_store_script_prepares_a_store_and_is_idempotent(tmp_path: Path) -> None:
    env = {"LATSCOPE_STORE": f"chdb://{tmp_path / 'store'}", "PATH": ""}
    script = str(ROOT / "deploy/init_store.py")
    runs = [
        subprocess.run([sys.executable, script], env=env, capture_output=True, text=True)
        for _ in range(2)
    ]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr + runs[1].stderr
    assert "TTL set on otel_traces" in runs[0].stdout
    assert "TTL set on no new tables" in runs[1].stdout


@pytest.mark.subprocess
def test_init_store_script_reports_an_unreachable_store(tmp_path: Path) -> None:
    env = {"LATSCOPE_STORE": "http://latscope:x@127.0.0.1:9/latscope", "INIT_STORE_WAIT_S": "0"}
    run = subprocess.run(
        [sys.executable, str(ROOT / "deploy/init_store.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1
    assert run.stderr.startswith("latscope init: ") and "Traceback" not in run.stderr
    assert ":x@" not in run.stderr  # the password stays out of the message


def test_alter_statements_follow_the_local_and_distributed_tables(store: Store) -> None:
    # A later single-node file may ALTER a table an earlier one created.
    create = (
        "CREATE TABLE IF NOT EXISTS alter_demo\n(\n"
        "    Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)),\n    TraceId String\n)\n"
        "ENGINE = MergeTree\nORDER BY (TraceId, Timestamp)\nSETTINGS index_granularity = 8192"
    )
    alters = [
        "ALTER TABLE alter_demo ADD COLUMN IF NOT EXISTS IngestedAt DateTime64(6) "
        "DEFAULT now64(6) CODEC(Delta, ZSTD(1))",
        "ALTER TABLE alter_demo ADD INDEX IF NOT EXISTS idx_ingested IngestedAt TYPE minmax "
        "GRANULARITY 1",
    ]
    opts = generate.Options(database="alter_check")
    store.command("CREATE DATABASE IF NOT EXISTS alter_check")
    for statement in [create, *alters]:
        store.command(statement)
        for cluster_statement in generate.cluster_statements(statement, opts):
            store.command(local_twin(cluster_statement)[0])
    single, local = ("default", "alter_demo"), ("alter_check", "alter_demo_local")
    assert _columns(store, *local) == _columns(store, *single)
    assert _indexes(store, *local) == _indexes(store, *single) != []
    assert [c[:2] for c in _columns(store, "alter_check", "alter_demo")] == [
        c[:2] for c in _columns(store, *single)
    ]
