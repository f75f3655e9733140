"""Prepare a ClickHouse store for latscope: apply the schema, then the retention TTLs.

The compose stack runs this once before the collector and the API start::

    LATSCOPE_STORE=http://user:pass@clickhouse:8123/latscope python deploy/init_store.py

It waits for the store to answer, applies ``deploy/clickhouse/NNN_*.sql`` (``Store.apply_schema``)
and then each ``ALTER TABLE ... MODIFY TTL`` of the retention file (``retention.sql`` next to this
script, else ``deploy/clickhouse/cluster/retention.sql``) to tables that have no TTL yet: a restart
neither rewrites parts nor undoes a TTL an operator has changed since.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from pathlib import Path

from latscope.storage import DEFAULT_STORE, DDLFile, Store, StoreError, StoreUnavailable

_ALTER_TTL = re.compile(r"^ALTER TABLE (\w+) MODIFY TTL ", re.I)
_HAS_TTL = """
SELECT count() FROM system.tables
WHERE database = currentDatabase() AND name = {table:String}
  AND match(create_table_query, '\\\\sTTL\\\\s')
"""


def retention_file() -> Path:
    here = Path(__file__).resolve().parent
    beside = here / "retention.sql"
    return beside if beside.is_file() else here / "clickhouse" / "cluster" / "retention.sql"


def open_store(dsn: str, wait_s: float) -> Store:
    """The store, once it answers; retried every second for ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            store = Store.open(dsn)
            if store.ping():
                return store
            store.close()
            reason = "it did not answer SELECT 1"
        except StoreUnavailable as exc:
            reason = str(exc)  # Store.open redacts the password
        if time.monotonic() >= deadline:
            raise StoreUnavailable(f"the store did not answer within {wait_s:.0f} s: {reason}")
        time.sleep(1)


def apply_retention(store: Store, sql: str) -> list[str]:
    """Apply each TTL statement whose table has no TTL yet; returns the tables changed."""
    changed = []
    for statement in DDLFile(0, "retention.sql", sql).statements():
        match = _ALTER_TTL.match(statement)
        if not match:
            raise StoreError(
                f"retention file: expected ALTER TABLE ... MODIFY TTL, got {statement}"
            )
        table = match.group(1)
        if store.query_rows(_HAS_TTL, {"table": table})[0][0]:
            continue
        store.command(statement)
        changed.append(table)
    return changed


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    dsn = os.environ.get("LATSCOPE_STORE") or DEFAULT_STORE
    # Failures are reported once, below, with the reason; the driver's own log lines would
    # repeat them on every retry.
    logging.getLogger("clickhouse_connect").setLevel(logging.CRITICAL)
    try:
        store = open_store(dsn, wait_s=float(os.environ.get("INIT_STORE_WAIT_S", "60")))
        try:
            version = store.apply_schema()
            path = Path(argv[0]) if argv else retention_file()
            changed = apply_retention(store, path.read_text())
        finally:
            store.close()
    except (StoreError, OSError) as exc:
        print(f"latscope init: {exc}", file=sys.stderr)
        return 1
    print(f"latscope init: schema v{version}; TTL set on {', '.join(changed) or 'no new tables'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
