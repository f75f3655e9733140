"""The rows ClickHouse refused alone, kept in the spool, and inserted again
(``latscope quarantine``, ``latscope/cmd/quarantine.py``).

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

import json
import sys
from pathlib import Path
from typing import Any

import pyarrow.ipc as ipc

from latscope.collector.spool import QUARANTINE
from latscope.storage import Store


def entries(spool_dir: Path) -> list[tuple[Path, dict]]:
    """Every quarantined batch under ``spool_dir``: (its Arrow file, its note), oldest first."""
    found = []
    for note in sorted(spool_dir.glob(f"*/{QUARANTINE}/*.json")):
        try:
            found.append((note.with_suffix(".arrow"), json.loads(note.read_text())))
        except (OSError, ValueError) as exc:
            print(f"latscope: skipping unreadable {note}: {exc}", file=sys.stderr)
    return sorted(found, key=lambda e: e[1].get("at", ""))


def replay(store: Store, path: Path, note: dict[str, Any]) -> None:
    """Insert the quarantined batch ``path`` (described by ``note``) with the token of the insert
    that was refused, then delete it; raises ``StoreError`` (and keeps it) when refused again."""
    with ipc.open_stream(path.read_bytes()) as reader:
        rows = reader.read_all()
    store.insert_arrow(note["table"], rows, dedup_token=note["token"])
    path.unlink()
    path.with_suffix(".json").unlink()
