"""What the answers over the attribution table share: the table read with ``FINAL``, the window
and filters as SQL, their parameters, rows read as dicts, and ns turned into ms.

Time windows are ``[since_ns, until_ns)`` in ns since the epoch, on the request's start
(``Timestamp``: the client's clock when a client span was seen). ``service`` and ``model`` filter
when given; an empty parameter matches every request.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from latscope.attribution.answers.errors import AggregateError
from latscope.storage import ATTRIBUTION_TABLE, Store

__all__ = [
    "FILTERS",
    "FROM",
    "RAW_WHERE",
    "SETTINGS",
    "WHERE",
    "filters",
    "finite",
    "ms",
    "query_dicts",
    "window_params",
]

#: Reads use ``FINAL`` so a re-attributed request counts once (see 002_attribution.sql).
FROM = f"{ATTRIBUTION_TABLE} FINAL"

#: A request's rows share one sorting key, and the key's hour fixes the partition (day), so FINAL
#: never needs to merge across partitions: each partition is deduplicated on its own (and one
#: with a single part not at all).
SETTINGS = "\nSETTINGS do_not_merge_across_partitions_select_final = 1"

#: The service and model filters; an empty parameter matches every request.
FILTERS = """({service:String} = '' OR ServiceName = {service:String})
    AND ({model:String} = '' OR Model = {model:String})"""

#: The window and the filters (parameters of ``window_params``).
WHERE = f"""
    Timestamp >= fromUnixTimestamp64Nano({{since_ns:Int64}})
    AND Timestamp < fromUnixTimestamp64Nano({{until_ns:Int64}})
    AND {FILTERS}
"""

#: The filters of a raw read over a plan's raw ranges (``$RANGES``, from ``rollups.raw_where``).
RAW_WHERE = f"""$RANGES
    AND {FILTERS}"""


def window_params(
    since_ns: int, until_ns: int, service: str | None, model: str | None
) -> dict[str, Any]:
    """The parameters of ``WHERE``; an empty window is an ``AggregateError``."""
    if until_ns <= since_ns:
        raise AggregateError(f"empty window: until ({until_ns}) must be after since ({since_ns})")
    return {
        "since_ns": int(since_ns),
        "until_ns": int(until_ns),
        "service": service or "",
        "model": model or "",
    }


def bounded(value: float, low: int, high: int) -> int:
    """``value`` as an int within ``[low, high]``: the one place an answer's count limit is
    held to its bounds (the REST routes declare the same bounds and refuse what is outside)."""
    return max(low, min(int(value), high))


def filters(service: str | None, model: str | None) -> list[str]:
    """The dimensions a query filters on, for ``rollups.level_for``."""
    return [name for name, value in (("service", service), ("model", model)) if value]


def query_dicts(store: Store, sql: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The rows of ``sql`` as dicts (column -> value)."""
    table = store.query_arrow(sql, dict(params))
    return table.to_pylist()


def ms(ns: float | None) -> float | None:
    """ns -> ms; None (no data) and NaN (an average over no rows) are None."""
    if ns is None:
        return None
    value = float(ns)
    return None if math.isnan(value) else value / 1e6


def finite(value: Any) -> float | None:
    """A float, or None for None, NaN and infinities (a correlation over constant values)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None
