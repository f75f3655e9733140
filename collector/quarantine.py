"""``latscope quarantine``: the rows ClickHouse refused alone, listed, and inserted again.

The collector inserts a batch ClickHouse refuses for a reason in its rows in parts, and keeps a
row it refuses alone in ``quarantine/`` of the spool directory (``<spool-dir>/<signal>/
quarantine/``: the rows as Arrow, the table and the reason as JSON), counted in
``latscope_collector_quarantined_total``. Once the cause is mended (a constraint dropped, a
column widened), ``replay`` inserts them with the token of the insert that was refused, so a
row replayed twice is stored once; a row refused again stays.

    latscope quarantine list --spool-dir ./latscope-data-spool
    latscope quarantine replay --spool-dir ./latscope-data-spool --store chdb:///./latscope-data

An embedded store must not be open in a running ``latscope serve`` while ``replay`` writes to it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pyarrow.ipc as ipc

from latscope.collector.spool import QUARANTINE

HELP = "rows ClickHouse refused alone: list them, or insert them again once the cause is mended"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("list", "replay"))
    parser.add_argument(
        "--spool-dir", required=True, help="the collector's spool directory (--spool-dir)"
    )
    parser.add_argument("--store", help="replay: the store to insert into (a DSN)")


def entries(spool_dir: Path) -> list[tuple[Path, dict]]:
    """Every quarantined batch under ``spool_dir``: (its Arrow file, its note), oldest first."""
    found = []
    for note in sorted(spool_dir.glob(f"*/{QUARANTINE}/*.json")):
        try:
            found.append((note.with_suffix(".arrow"), json.loads(note.read_text())))
        except (OSError, ValueError) as exc:
            print(f"latscope: skipping unreadable {note}: {exc}", file=sys.stderr)
    return sorted(found, key=lambda e: e[1].get("at", ""))


def main(args: argparse.Namespace) -> int:
    found = entries(Path(args.spool_dir))
    if args.action == "list":
        for path, note in found:
            print(f"{note['at']}  {note['table']}  {note['rows']} row(s)  {path}")
            print(f"    {note['reason']}")
        print(f"{sum(n['rows'] for _, n in found)} row(s) in {len(found)} file(s)")
        return 0
    if not args.store:
        print("latscope: replay needs --store DSN", file=sys.stderr)
        return 2
    from latscope.storage import Store, StoreError

    store = Store.open(args.store)
    failed = 0
    try:
        for path, note in found:
            with ipc.open_stream(path.read_bytes()) as reader:
                rows = reader.read_all()
            try:
                store.insert_arrow(note["table"], rows, dedup_token=note["token"])
            except StoreError as exc:
                failed += 1
                print(f"{path}: refused again, kept: {exc}", file=sys.stderr)
                continue
            path.unlink()
            path.with_suffix(".json").unlink()
            print(f"{path}: {note['rows']} row(s) inserted into {note['table']}")
    finally:
        store.close()
    return 1 if failed else 0
