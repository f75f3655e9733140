"""Generate the cluster DDL in this folder from the single-node DDL one folder up.

Each single-node ``CREATE TABLE X`` becomes, on every node of the cluster (``ON CLUSTER``):

* ``X_local``: the same columns, codecs, indexes, key and settings on the ``Replicated`` twin of
  the engine (one replica path per shard, ``{shard}`` / ``{replica}`` macros), plus a TTL;
* ``X``: a ``Distributed`` table over ``X_local`` under the single-node name, so latscope reads and
  writes the cluster with the same SQL it uses on one server.

An ``ALTER TABLE X`` (a column or index added by a later file) applies to ``X_local``, and to ``X``
when it changes columns.

Sharding keeps all spans and all attribution versions of a trace on one shard (the attributor reads
a trace's spans together; ``ReplacingMergeTree`` collapses versions only within a shard). A table
in ``EVERY_NODE`` (small, read beside every shard's spans) has one Keeper path for all shards
instead: every node is a replica of it, so each holds all its rows and reads them locally (its
``Distributed`` table, written through at random, then reads them once per shard).

Regenerate after changing ``deploy/clickhouse/NNN_*.sql`` (a test fails until you do)::

    python deploy/clickhouse/cluster/generate.py
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from latscope.storage import DDLFile

HERE = Path(__file__).resolve().parent
SINGLE_NODE = HERE.parent
_DDL_FILE = re.compile(r"^(\d{3})_[a-z0-9_]+\.sql$")
_CREATE = re.compile(r"^CREATE TABLE IF NOT EXISTS (\w+)\s*\(", re.S)
_ENGINE = re.compile(r"\bENGINE\s*=\s*(\w*MergeTree)(?:\(([^)]*)\))?")
_ALTER = re.compile(r"^ALTER TABLE (\w+)\s+(.*)$", re.S)
#: ALTERs that change columns apply to the Distributed table too; the rest (indexes, TTLs,
#: settings) only to the local tables that store the rows.
_COLUMN_ALTER = re.compile(r"^(ADD|DROP|MODIFY|RENAME|COMMENT|CLEAR) COLUMN\b")
_CODEC = re.compile(r"\s+CODEC\((?:[^()]|\([^()]*\))*\)")
#: A sorting-key change riding on an ADD COLUMN (only the ALTER that adds a column may append it
#: to the key): the Distributed table has no key, so it takes the column alone.
_ORDER_BY = re.compile(r",\s*MODIFY ORDER BY \((?:[^()]|\([^()]*\))*\)")

#: Keeps what must be read together on one shard; tables not listed shard by TraceId if they
#: have one, else at random.
SHARDING_KEYS = {
    "otel_traces": "cityHash64(TraceId)",
    "latscope_attribution": "cityHash64(TraceId)",
    "latscope_metrics": "rand()",
}
#: Tables every node holds whole (one Keeper path for all shards, a replica per node): the resources
#: by id, which each shard's attributor looks up beside its own spans.
EVERY_NODE = {"latscope_resources"}
#: Days each table keeps its rows (whole days: tables are partitioned by day and set
#: ttl_only_drop_parts, so expiry drops parts instead of rewriting them).
RETENTION_DAYS = {
    "otel_traces": 30,
    "latscope_attribution": 90,
    # The rollup serves the same windows as the rows it summarises.
    "latscope_attribution_hourly": 90,
    "latscope_metrics": 30,
    # Ids of the spans' resources: as long as the spans that name them.
    "latscope_resources": 30,
}
DEFAULT_RETENTION_DAYS = 30


@dataclass(frozen=True)
class Options:
    cluster: str = "{cluster}"
    database: str = "latscope"


def _statements(path: Path) -> list[str]:
    # Split exactly as latscope applies these files.
    return DDLFile(0, path.name, path.read_text()).statements()


def single_node_files() -> list[Path]:
    return sorted(p for p in SINGLE_NODE.iterdir() if _DDL_FILE.match(p.name))


def ttl_clause(table: str, statement: str) -> str | None:
    if not re.search(r"^\s*Timestamp\s+DateTime64", statement, re.M):
        return None
    days = RETENTION_DAYS.get(table, DEFAULT_RETENTION_DAYS)
    return f"TTL toDateTime(Timestamp) + INTERVAL {days} DAY"


def cluster_statements(statement: str, opts: Options) -> list[str]:
    """One single-node statement -> its cluster statements.

    ``CREATE TABLE X`` -> the replicated local table and its Distributed table; ``ALTER TABLE X``
    -> the same ALTER on the local tables (and on the Distributed table when it changes columns).
    """
    alter = _ALTER.match(statement)
    if alter:
        return _alter_statements(alter.group(1), alter.group(2), opts)
    match = _CREATE.match(statement)
    engine = _ENGINE.search(statement)
    if not match or not engine:
        raise ValueError(
            "cluster DDL generation handles 'CREATE TABLE IF NOT EXISTS <name> (...) ENGINE = "
            "*MergeTree' and 'ALTER TABLE <name> ...' statements only; extend generate.py for: "
            f"{statement[:80]}..."
        )
    table, db, cluster = match.group(1), opts.database, opts.cluster
    local = f"{table}_local"
    args = [a.strip() for a in (engine.group(2) or "").split(",") if a.strip()]
    zk_path = f"/clickhouse/tables/{{shard}}/{db}/{local}"
    replica = "{replica}"
    if table in EVERY_NODE:
        # One replica set across the cluster: replica names must be unique in it.
        zk_path, replica = f"/clickhouse/tables/all/{db}/{local}", "{shard}-{replica}"
    replicated = (
        f"Replicated{engine.group(1)}(" + ", ".join([f"'{zk_path}'", f"'{replica}'", *args]) + ")"
    )
    body = statement[match.end() - 1 :]
    body = body.replace(engine.group(0), f"ENGINE = {replicated}", 1)
    # Replicated tables deduplicate retried inserts through Keeper, in their own window.
    body = body.replace("non_replicated_deduplication_window", "replicated_deduplication_window")
    ttl = ttl_clause(table, statement)
    if ttl:
        if "\nSETTINGS" in body:
            body = body.replace("\nSETTINGS", f"\n{ttl}\nSETTINGS", 1)
        else:
            body = f"{body}\n{ttl}"
    key = SHARDING_KEYS.get(table) or (
        "cityHash64(TraceId)" if re.search(r"^\s*TraceId\s", statement, re.M) else "rand()"
    )
    return [
        f"CREATE TABLE IF NOT EXISTS {db}.{local} ON CLUSTER '{cluster}'\n{body}",
        f"CREATE TABLE IF NOT EXISTS {db}.{table} ON CLUSTER '{cluster}'\n"
        f"AS {db}.{local}\n"
        f"ENGINE = Distributed('{cluster}', '{db}', '{local}', {key})",
    ]


def _alter_statements(table: str, body: str, opts: Options) -> list[str]:
    db, cluster = opts.database, opts.cluster
    out = [f"ALTER TABLE {db}.{table}_local ON CLUSTER '{cluster}'\n    {body}"]
    if _COLUMN_ALTER.match(body):
        # A Distributed table stores nothing: codecs and sorting keys do not apply to it.
        plain = _ORDER_BY.sub("", _CODEC.sub("", body))
        out.append(f"ALTER TABLE {db}.{table} ON CLUSTER '{cluster}'\n    {plain}")
    return out


def _header(source: str, what: str) -> str:
    return (
        f"-- GENERATED from {source} by deploy/clickhouse/cluster/generate.py; do not edit.\n"
        f"-- {what}\n"
    )


def render(opts: Options = Options()) -> dict[str, str]:
    """File name -> contents of every generated file."""
    out = {
        "000_database.sql": _header("nothing", "The database on every node of the cluster.")
        + f"CREATE DATABASE IF NOT EXISTS {opts.database} ON CLUSTER '{opts.cluster}';\n"
    }
    retention = [
        _header(
            "../NNN_*.sql",
            "Retention for a single ClickHouse server (the cluster tables carry it in their DDL).",
        )
    ]
    for path in single_node_files():
        parts = [
            _header(
                f"../{path.name}",
                "Replicated local table + Distributed table under the single-node name.",
            )
        ]
        for statement in _statements(path):
            parts.extend(s + ";\n" for s in cluster_statements(statement, opts))
            create = _CREATE.match(statement)
            ttl = ttl_clause(create.group(1), statement) if create else None
            if create and ttl:
                retention.append(f"ALTER TABLE {create.group(1)} MODIFY {ttl};\n")
        out[path.name] = "\n".join(parts)
    out["retention.sql"] = "".join(retention)
    return out


def stale(opts: Options = Options()) -> list[str]:
    """Generated files whose contents differ from what ``render`` produces now."""
    rendered = render(opts)
    on_disk = {p.name for p in HERE.glob("*.sql")}
    changed = [n for n, text in rendered.items() if not (HERE / n).is_file()
               or (HERE / n).read_text() != text]  # fmt: skip
    return sorted(changed + sorted(on_disk - set(rendered)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the files are stale")
    args = parser.parse_args(argv)
    if args.check:
        names = stale()
        if names:
            print("stale: " + ", ".join(names) + " (run deploy/clickhouse/cluster/generate.py)")
            return 1
        return 0
    rendered = render()
    for old in HERE.glob("*.sql"):
        if old.name not in rendered:
            old.unlink()
    for name, text in rendered.items():
        (HERE / name).write_text(text)
    print(f"wrote {len(rendered)} files to {HERE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
