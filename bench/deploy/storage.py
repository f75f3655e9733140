"""Bytes on disk per span and per attributed request, for sizing a ClickHouse store.

Loads the deploy tests' demo traffic (LLM request traces sent through a real ``latscope serve``
over OTLP/gRPC, plus their attribution rows) into a fresh embedded store, merges the parts, and
prints bytes per row on disk next to the uncompressed size measured in the same run (the
compression ratio is the machine-independent figure).

    .venv/bin/python bench/deploy/storage.py [--requests 2000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from latscope.storage import ATTRIBUTION_TABLE, SPANS_TABLE, Store
from tests.deploy_demo import load_demo

SIZES = """
SELECT table, sum(rows), sum(bytes_on_disk), sum(data_uncompressed_bytes)
FROM system.parts
WHERE active AND database = currentDatabase() AND table IN ({tables:Array(String)})
GROUP BY table
ORDER BY table
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store_dir = Path(tmp) / "store"
        started = time.monotonic()
        demo = load_demo(store_dir, now_ns=time.time_ns(), requests=args.requests)
        store = Store.open(f"chdb://{store_dir}")
        try:
            for table in (SPANS_TABLE, ATTRIBUTION_TABLE):
                store.command(f"OPTIMIZE TABLE {table} FINAL")
            rows = store.query_rows(SIZES, {"tables": [SPANS_TABLE, ATTRIBUTION_TABLE]})
        finally:
            store.close()
    print(f"{demo.requests} requests loaded in {time.monotonic() - started:.1f} s")
    per_request = 0.0
    for table, count, disk, raw in rows:
        per_request += disk / demo.requests
        print(
            f"{table:22s} {count:8d} rows  {disk / count:7.1f} B/row on disk  "
            f"{raw / count:7.1f} B/row uncompressed  ratio {raw / disk:4.1f}x"
        )
    print(f"{'per request':22s} {per_request:8.0f} B on disk (spans + attribution)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
