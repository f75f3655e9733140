"""Time-range parameters: RFC 3339 instants or relative spans such as ``15m``, ``2h``, ``7d``.

A relative span means "that long before now": ``since=2h`` is two hours ago. ``until`` defaults
to now and ``since`` to one hour before ``until``.

>>> from datetime import UTC, datetime
>>> now = datetime(2026, 1, 2, 12, 0, tzinfo=UTC)
>>> parse_instant("90m", now=now).isoformat()
'2026-01-02T10:30:00+00:00'
>>> parse_instant("2026-01-02T11:00:00Z", now=now).isoformat()
'2026-01-02T11:00:00+00:00'
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

_RELATIVE = re.compile(r"^\s*(\d{1,6})\s*(ms|s|m|h|d|w)\s*$")
_UNITS = {
    "ms": timedelta(milliseconds=1),
    "s": timedelta(seconds=1),
    "m": timedelta(minutes=1),
    "h": timedelta(hours=1),
    "d": timedelta(days=1),
    "w": timedelta(weeks=1),
}
# RFC 3339: a date, "T" or a space, a time, an offset (Z or +hh:mm). fromisoformat accepts more
# (no offset, week dates), so the shape is checked first.
_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$"
)

#: Both accepted forms as one JSON-schema pattern, published in the OpenAPI document so clients
#: and generators know the shape before they send (values that fit may still be refused: a 13th
#: month, a window too wide). Digits are [0-9]: a schema's \\d may also match other scripts.
TIME_PATTERN = (
    r"^\s*([0-9]{1,6}\s*(ms|s|m|h|d|w)"
    r"|[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2}))\s*$"
)

#: The widest window a query may cover; wider ones are refused rather than scanned.
MAX_RANGE = timedelta(days=400)
DEFAULT_RANGE = timedelta(hours=1)
#: The earliest instant accepted (ClickHouse DateTime64 starts at 1900; nothing real is older).
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_LATEST = datetime(2262, 1, 1, tzinfo=UTC)  # DateTime64(9) ends in 2262


class TimeRangeError(ValueError):
    """A time parameter cannot be used; the message says what to write instead."""


@dataclass(frozen=True)
class TimeRange:
    """A half-open window ``[since, until)`` in UTC."""

    since: datetime
    until: datetime

    @property
    def since_ns(self) -> int:
        return _to_ns(self.since)

    @property
    def until_ns(self) -> int:
        return _to_ns(self.until)

    def to_json(self) -> dict[str, str]:
        return {"since": _iso(self.since), "until": _iso(self.until)}

    @classmethod
    def from_ns(cls, since_ns: int, until_ns: int) -> TimeRange:
        """The window of two instants in ns since the epoch (to the microsecond)."""
        return cls(_from_ns(since_ns), _from_ns(until_ns))


def _from_ns(ns: int) -> datetime:
    return _EPOCH + timedelta(microseconds=int(ns) // 1000)


def _to_ns(t: datetime) -> int:
    delta = t - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def parse_instant(value: str, *, now: datetime, name: str = "time") -> datetime:
    """RFC 3339 or a relative span (``15m``: fifteen minutes before ``now``), in UTC."""
    text = value.strip()
    if m := _RELATIVE.match(text):
        try:
            t = now - int(m.group(1)) * _UNITS[m.group(2)]
        except OverflowError:
            raise TimeRangeError(f"{name}: {value!r} reaches too far back") from None
    elif _RFC3339.match(text):
        # Python keeps microseconds; nanosecond digits beyond them are dropped, not rounded.
        body = re.sub(r"(\.\d{6})\d+", r"\1", text.replace("z", "Z").replace("t", "T"))
        try:
            t = datetime.fromisoformat(body).astimezone(UTC)
        except (ValueError, OverflowError):
            raise TimeRangeError(f"{name}: {value!r} is not a valid date and time") from None
    else:
        raise TimeRangeError(
            f"{name}: expected RFC 3339 (2026-01-02T15:04:05Z) or a relative span like "
            f"15m, 2h, 7d; got {value!r}"
        )
    if not _EPOCH <= t < _LATEST:
        raise TimeRangeError(f"{name}: {value!r} is outside 1970..2261")
    return t


def parse_range(
    since: str | None,
    until: str | None,
    *,
    now: datetime | None = None,
    default: timedelta = DEFAULT_RANGE,
    prefix: str = "",
) -> TimeRange:
    """The window named by ``since``/``until`` (either may be None); validated and capped."""
    now = now or datetime.now(UTC)
    end = parse_instant(until, now=now, name=f"{prefix}until") if until else now
    start = (
        parse_instant(since, now=now, name=f"{prefix}since")
        if since
        else max(end - default, _EPOCH)
    )
    if start >= end:
        raise TimeRangeError(f"{prefix}since must be before {prefix}until")
    if end - start > MAX_RANGE:
        raise TimeRangeError(f"the window may span at most {MAX_RANGE.days} days")
    return TimeRange(start, end)
