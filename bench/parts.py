"""What the benchmarks read of a store's parts (``system.parts``)."""

from __future__ import annotations

from typing import Any


def active_parts(store: Any, table: str) -> int:
    """The active parts of ``table`` in the store's database: what a read of it opens, and what
    the merges have still to fold together."""
    return int(
        store.query_rows(
            "SELECT count() FROM system.parts "
            "WHERE active AND database = currentDatabase() AND table = {t:String}",
            {"t": table},
        )[0][0]
    )
