"""A decode span's token offsets and the streaming figures computed from them.

One arithmetic for everything that reads the offsets: the collector stores the figures with each
span at the default stall threshold (``collector/mapping.py``, its C decoder by the same
operations, a test holds the two equal), the rules read them here (``attribution/engine.py``),
and the SQL attributor reads the stored figures or computes them from the offsets by the same
formulas (``latscope.attribution.sql.token_figures``). It sits below both the collector and
the attribution, so ingest needs nothing of the analysis.

>>> offsets = parse_int_list("[1200, 1250, 1300, 1900]")
>>> figures = token_figures(offsets, DEFAULT_STALL_NS)
>>> figures[FIRST_OFFSET_US], figures[TPOT_NS], figures[ITL_MAX_NS], figures[TOKENS]
(1200.0, 233333.33333333334, 600000.0, 4.0)
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import re
from collections.abc import Sequence

__all__ = [
    "DEFAULT_STALL_NS",
    "FIRST_OFFSET_US",
    "INT_ARRAY",
    "ITL_MAX_NS",
    "ITL_P50_NS",
    "ITL_P99_NS",
    "STALLS",
    "TOKENS",
    "TPOT_NS",
    "linear_quantile",
    "parse_int_list",
    "token_figures",
]

#: Default gap between two tokens that counts as a stall.
DEFAULT_STALL_NS = 250_000_000

# Token offsets are a JSON array of integers of at most 15 digits, exactly what JSON allows (its
# four whitespace characters, no leading zeros), so a list the pattern accepts always parses as
# JSON, here and in SQL (attribution/sql/, which matches the same text; see
# ``latscope.attribution.model`` for the other forms read as numbers). The pattern is matched
# whole: RE2's ``$`` is the end of the value, Python's also matches before a final newline.
_WS = "[ \t\n\r]*"
_INT15 = "-?(0|[1-9][0-9]{0,14})"
INT_ARRAY = re.compile(rf"^\[{_WS}({_INT15}{_WS}(,{_WS}{_INT15}{_WS})*)?\]$")
#: ``INT_ARRAY``'s integers are below this in magnitude (at most 15 digits).
_INT15_BOUND = 10**15


def parse_int_list(raw: str | None) -> list[int]:
    """A JSON array of integers, else [] (the whole value is ignored): what ``INT_ARRAY`` matches.

    JSON's own parser checks the grammar the pattern states (its four whitespace characters, no
    leading zeros, no ``+``) several times faster than the pattern (a long agent run's answer
    reads thousands of decode spans' offsets); what JSON takes beyond it (fractions, exponents,
    nesting, other values, longer integers, text around the brackets) is refused after.
    ``tests/test_attribution_model.py`` holds the two equal.
    """
    if not raw or raw[0] != "[" or raw[-1] != "]":
        return []
    try:
        values: list[int] = json.loads(raw)
    except (ValueError, RecursionError):
        return []
    if not values:
        return []
    # Integers only (not bool, which is an int too), within bounds: checked in C, not per value.
    if (
        set(map(type, values)) != {int}
        or min(values) <= -_INT15_BOUND
        or max(values) >= _INT15_BOUND
    ):
        return []
    return values


def linear_quantile(values: Sequence[float], q: float) -> float:
    """Quantile with linear interpolation between order statistics (numpy's and polars' default)."""
    return _sorted_quantile(sorted(values), q)


def _sorted_quantile(ordered: Sequence[float], q: float) -> float:
    """``linear_quantile`` of values already in order."""
    pos = q * (len(ordered) - 1)
    i = math.floor(pos)
    if i + 1 >= len(ordered):
        return float(ordered[-1])
    return float(ordered[i] + (ordered[i + 1] - ordered[i]) * (pos - i))


#: What ``token_figures`` gives, by position.
FIRST_OFFSET_US, TPOT_NS, ITL_P50_NS, ITL_P99_NS, ITL_MAX_NS, STALLS, TOKENS = range(7)


def token_figures(offsets_us: Sequence[int], stall_threshold_ns: int) -> list[float]:
    """The streaming figures of a decode span's token offsets (us from its start; not empty):
    the first offset (us), TPOT, ITL p50 / p99 / max (ns), the gaps longer than
    ``stall_threshold_ns`` and the number of tokens, indexed by ``FIRST_OFFSET_US`` .. ``TOKENS``.
    With one token there are no gaps, and the four gap figures are 0. Every figure is a double
    computed as ClickHouse and C compute it (TPOT: the span's length, rounded to a double, over
    the gaps), so the three give the same bits."""
    gaps = sorted((b - a) * 1000 for a, b in itertools.pairwise(offsets_us))
    if not gaps:
        return [float(offsets_us[0]), 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    # Sorted once for both quantiles, the largest gap and the stalls (those past the threshold).
    return [
        float(offsets_us[0]),
        float((offsets_us[-1] - offsets_us[0]) * 1000) / len(gaps),
        _sorted_quantile(gaps, 0.5),
        _sorted_quantile(gaps, 0.99),
        float(gaps[-1]),
        float(len(gaps) - bisect.bisect_right(gaps, stall_threshold_ns)),
        float(len(offsets_us)),
    ]
