"""``latscope quarantine``: the rows ClickHouse refused alone (``latscope.collector.quarantine``),
listed, or inserted again once the cause is mended."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "rows ClickHouse refused alone: list them, or insert them again once the cause is mended"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("list", "replay"))
    parser.add_argument(
        "--spool-dir", required=True, help="the collector's spool directory (--spool-dir)"
    )
    parser.add_argument("--store", help="replay: the store to insert into (a DSN)")


def main(args: argparse.Namespace) -> int:
    from latscope.collector.quarantine import entries, replay

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
            try:
                replay(store, path, note)
            except StoreError as exc:
                failed += 1
                print(f"{path}: refused again, kept: {exc}", file=sys.stderr)
                continue
            print(f"{path}: {note['rows']} row(s) inserted into {note['table']}")
    finally:
        store.close()
    return 1 if failed else 0
