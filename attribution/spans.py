"""Reading a request's spans out of the store."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from operator import attrgetter
from typing import Any

from latscope.attribution.model import SpanRecord
from latscope.attribution.queries import ATTRIBUTE_CHARS, SHOWN_SETTINGS, TRACE_SPANS_SHOWN
from latscope.attribution.sql import rule_keys
from latscope.semconv import SpanKind, StatusCode
from latscope.storage import Store


def normalized(spans: Iterable[SpanRecord]) -> list[SpanRecord]:
    """Spans with kinds and status codes in older exporters' spellings (``SPAN_KIND_SERVER``,
    ``STATUS_CODE_ERROR``) read as the current ones."""
    return [
        replace(s, kind=SpanKind.normalize(s.kind), status=StatusCode.normalize(s.status))
        for s in spans
    ]


def load_trace(store: Store, trace_id: str, *, max_bytes: int = 0) -> list[SpanRecord]:
    """Every stored span of ``trace_id`` (lowercase hex), oldest first; [] when none. Span kinds
    and status codes in older exporters' spellings (``SPAN_KIND_SERVER``) read as current ones.
    An attribute value longer than ``ATTRIBUTE_CHARS`` characters is cut, but those the rules
    read (``sql.rule_keys``), from which the attribution is worked out. ``max_bytes`` (0: no
    bound): ClickHouse refuses the read once its rows pass that many bytes
    (``StoreResultTooLarge``), before they reach Python."""
    parameters = {"trace_id": trace_id, "keys": rule_keys(), "cut": ATTRIBUTE_CHARS}
    settings = dict(SHOWN_SETTINGS)
    if max_bytes:
        settings |= {"max_result_bytes": str(int(max_bytes)), "result_overflow_mode": "'throw'"}
    sql = TRACE_SPANS_SHOWN + "SETTINGS " + ", ".join(f"{k} = {v}" for k, v in settings.items())
    return span_records(store.query_rows(sql, parameters))


def span_records(rows: Iterable[Sequence[Any]]) -> list[SpanRecord]:
    """``TRACE_SPANS``'s (or ``TRACE_SPANS_SHOWN``'s) rows as records, oldest first, each span once
    (a retrying exporter may have sent one twice). A Map may come as a dict (clickhouse-connect's
    rows) or as (key, value) pairs (Arrow's ``to_pylist``)."""
    seen: set[str] = set()
    spans: list[SpanRecord] = []
    for row in rows:
        (span_id, parent, name, kind, service, start, dur, attrs, status, resource) = row[:10]
        ev_names, ev_times = row[10], row[11]
        if span_id in seen:
            continue
        seen.add(span_id)
        spans.append(
            SpanRecord(
                span_id=span_id,
                parent_span_id=parent,
                name=name,
                kind=SpanKind.normalize(kind),
                service=service,
                start_ns=int(start),
                duration_ns=int(dur),
                # The driver reads each Map into a dict of its own: kept, not copied.
                attributes=attrs if type(attrs) is dict else dict(attrs),
                events=tuple(zip(ev_names, map(int, ev_times), strict=False)) if ev_names else (),
                status=StatusCode.normalize(status),
                resource=resource if type(resource) is dict else dict(resource),
            )
        )
    spans.sort(key=attrgetter("start_ns"))
    return spans
