"""Span builders and comparisons shared by the attribution tests."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from latscope.attribution.engine import attribute_requests
from latscope.attribution.model import RequestAttribution, SpanRecord
from latscope.attribution.sql import STORED_STALL_NS, attribution_select, simple_select
from latscope.attribution.table import attribution_row
from latscope.collector.mapping import (
    RESOURCE_ID,
    SPANS_SCHEMA,
    resource_ids,
    resource_rows,
    stored_token_figures,
)
from latscope.semconv import ClientAttributes, LatscopeAttributes, Phase, SpanKind
from latscope.storage import RESOURCES_TABLE, SPANS_TABLE, Store

MS = 1_000_000
T0 = 1_763_000_000_000_000_000


@dataclass
class TraceBuilder:
    """Builds one trace's SpanRecords; times in ms from T0 unless ``ns=True``."""

    spans: list[SpanRecord] = field(default_factory=list)
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))

    def add(
        self,
        kind: str,
        start: float,
        end: float,
        *,
        parent: str = "",
        service: str = "llm-server",
        attrs: dict[str, Any] | None = None,
        events: tuple[tuple[str, int], ...] = (),
        status: str = "Unset",
        ns: bool = False,
        resource: dict[str, str] | None = None,
        name: str | None = None,
    ) -> str:
        span_id = f"{next(self._ids):016x}"
        scale = 1 if ns else MS
        s, e = T0 + int(start * scale), T0 + int(end * scale)
        self.spans.append(
            SpanRecord(
                span_id=span_id,
                parent_span_id=parent,
                name=name or kind.lower(),
                kind=kind,
                service=service,
                start_ns=s,
                duration_ns=e - s,
                attributes={k: str(v) for k, v in (attrs or {}).items()},
                events=events,
                status=status,
                resource=resource or {},
            )
        )
        return span_id

    def client(self, start: float, end: float, **kw: Any) -> str:
        return self.add(SpanKind.CLIENT, start, end, service="chat-frontend", **kw)

    def server(self, start: float, end: float, **kw: Any) -> str:
        return self.add(SpanKind.SERVER, start, end, **kw)

    def phase(self, name: str, start: float, end: float, *, parent: str, **kw: Any) -> str:
        attrs = {LatscopeAttributes.PHASE: name, **kw.pop("attrs", {})}
        return self.add(SpanKind.INTERNAL, start, end, parent=parent, attrs=attrs, **kw)


def spans_table(traces: dict[str, list[SpanRecord]], *, figures: bool = True) -> pa.Table:
    """SpanRecords -> rows of the spans table, as the collector writes them (with the token
    figures and the resource ids: ``write_resources`` writes the ids' rows); ``figures=False``:
    as other writers do (the OpenTelemetry Collector's exporter), without latscope's columns of
    token figures (LatscopeTokenFigures) and resource ids, which ClickHouse then stores empty."""
    offsets_key = LatscopeAttributes.TOKEN_OFFSETS_US
    cols: dict[str, list] = {name: [] for name in SPANS_SCHEMA.names}
    for trace_id, spans in traces.items():
        for s in spans:
            row = {
                "Timestamp": s.start_ns,
                "TraceId": trace_id,
                "SpanId": s.span_id,
                "ParentSpanId": s.parent_span_id,
                "TraceState": "",
                "SpanName": s.name,
                "SpanKind": s.kind,
                "ServiceName": s.service,
                "ResourceAttributes": list(s.resource.items()),
                "ScopeName": "",
                "ScopeVersion": "",
                "SpanAttributes": list(s.attributes.items()),
                "Duration": s.duration_ns,
                "StatusCode": s.status,
                "StatusMessage": "",
                "Events.Timestamp": [t for _, t in s.events],
                "Events.Name": [n for n, _ in s.events],
                "Events.Attributes": [[] for _ in s.events],
            }
            if offsets_key in s.attributes:
                row["LatscopeTokenFigures"] = stored_token_figures(s.attributes[offsets_key])
            for name in SPANS_SCHEMA.names:
                cols[name].append(row.get(name, []))
    table = pa.Table.from_pydict(cols, schema=SPANS_SCHEMA)
    if not figures:
        return table.drop_columns(["LatscopeTokenFigures"])
    return table.append_column(RESOURCE_ID, resource_ids(table.column("ResourceAttributes"))[0])


def write_resources(store: Store, table: pa.Table) -> None:
    """The rows of latscope_resources for the resources of these spans, as the collector writes
    them."""
    _, found = resource_ids(table.column("ResourceAttributes"))
    if found:
        store.insert_arrow(RESOURCES_TABLE, resource_rows(found))


#: The SQL attributor over an explicit list of traces (the attributor proper selects them by
#: ingest time).
_BY_IDS = "SELECT arrayJoin({trace_ids:Array(String)}) AS trace_id"


def _rows(store: Store, sql: str, params: dict[str, Any]) -> list[dict]:
    table = store.query_arrow(sql, params)
    ts = table.schema.get_field_index("Timestamp")
    table = table.set_column(ts, "Timestamp", table.column(ts).cast(pa.int64()))
    return table.to_pylist()


#: Traces the single-call path answered in this process (tests read it to know it was taken).
SIMPLE_ANSWERED: set[str] = set()


def _assert_same_row(want: dict[str, Any], got: dict[str, Any]) -> None:
    """Two statements' rows of one request: every column equal (maps in any order)."""
    for column, value in want.items():
        assert _close(value, got[column]) or (
            column in ("Gpu", "ResourceAttributes") and dict(value or []) == dict(got[column] or [])
        ), (got["TraceId"], column, value, got[column])


def sql_rows(
    store: Store, trace_ids: list[str], *, stall_threshold_ns: int | None = None
) -> list[dict]:
    """What the SQL attributor computes for these stored traces: one dict per request. Both
    statements run over every trace: the traces the single-call path answers must get the same
    rows from the general one, and the result is composed as the attributor composes it (the
    single-call rows, then the general rows of the other traces)."""
    from latscope.tokens import DEFAULT_STALL_NS

    stall_ns = DEFAULT_STALL_NS if stall_threshold_ns is None else stall_threshold_ns
    params = {"trace_ids": trace_ids, "stall_ns": stall_ns, "through_us": 0, "after_us": 0}
    general = _rows(store, attribution_select(_BY_IDS, SPANS_TABLE, "1"), params)
    stored = stall_ns == STORED_STALL_NS  # as the Attributor decides
    simple = _rows(store, simple_select(_BY_IDS, SPANS_TABLE, "1", stored), params)
    answered = {r["TraceId"] for r in simple}
    # The same statement carrying resource ids: the same rows, for the traces whose server
    # span's resource has an id with a row in latscope_resources (the rest it leaves).
    by_id = _rows(store, simple_select(_BY_IDS, SPANS_TABLE, "1", stored, True), params)
    simple_rows = {(r["TraceId"], r["RequestSpanId"]): r for r in simple}
    for row in by_id:
        want = simple_rows.get((row["TraceId"], row["RequestSpanId"]))
        assert want is not None, ("answered by id alone", row["TraceId"])
        _assert_same_row(want, row)
    key = lambda r: (r["TraceId"], r["RequestSpanId"])  # noqa: E731
    by_general = {key(r): r for r in general if r["TraceId"] in answered}
    assert len(simple) == len(answered) == len(by_general), "one request per simple trace"
    for row in simple:
        assert key(row) in by_general, key(row)
        _assert_same_row(by_general[key(row)], row)
    SIMPLE_ANSWERED.update(answered)
    return simple + [r for r in general if r["TraceId"] not in answered]


_COUNTER = itertools.count()


def sql_check(
    store: Store,
    traces: dict[str, list[SpanRecord]],
    *,
    reference: dict[str, list[SpanRecord]] | None = None,
    figures: bool = True,
    **kw: Any,
) -> dict[str, list[RequestAttribution]]:
    """The reference results of these traces, after checking the SQL attributor writes the same
    rows for them (stored under fresh trace ids so tests never see each other's spans).
    ``reference``: the spans the reference engine reads, when they differ from those stored
    (older exporters' spellings, which the loader normalizes). ``figures``: stored with the
    token figures, as latscope's collector writes spans, or without, as other writers do."""
    renamed = store_traces(store, traces, figures=figures)
    return check_stored(store, renamed, reference=reference, **kw)


def store_traces(
    store: Store, traces: dict[str, list[SpanRecord]], *, figures: bool = True
) -> dict[str, tuple[str, list[SpanRecord]]]:
    """Store these traces under fresh trace ids: {stored id: (trace id, spans)}."""
    run = next(_COUNTER)
    renamed = {f"{run:08x}{i:024x}": (t, spans) for i, (t, spans) in enumerate(traces.items())}
    table = spans_table({k: v[1] for k, v in renamed.items()}, figures=figures)
    if figures:
        write_resources(store, table)
    store.insert_arrow(SPANS_TABLE, table)
    return renamed


def check_stored(
    store: Store,
    renamed: dict[str, tuple[str, list[SpanRecord]]],
    *,
    reference: dict[str, list[SpanRecord]] | None = None,
    **kw: Any,
) -> dict[str, list[RequestAttribution]]:
    """``sql_check`` for traces ``store_traces`` stored."""
    got = sql_rows(store, list(renamed), **kw)
    out: dict[str, list[RequestAttribution]] = {}
    for stored_id, (trace_id, spans) in renamed.items():
        if reference is not None:
            spans = reference[trace_id]
        oracle = attribute_requests(stored_id, spans, **kw)
        mine = sorted(
            (r for r in got if r["TraceId"] == stored_id), key=lambda r: r["RequestSpanId"]
        )
        want = sorted(oracle, key=lambda a: a.request_span_id)
        assert len(mine) == len(want), (trace_id, len(mine), len(want))
        for a, row in zip(want, mine, strict=True):
            assert_rows_equal(oracle_row(a, len(spans)), row)
            a.trace_id = trace_id
        out[trace_id] = want
    return out


def oracle_row(a: RequestAttribution, span_count: int) -> dict[str, Any]:
    return attribution_row(a, span_count=span_count, ingested_us=0)


_SKIP = {"SpansIngestedAt", "Version", "IsDeleted", "TraceId"}


def assert_rows_equal(want: dict[str, Any], got: dict[str, Any]) -> None:
    for key, w in want.items():
        if key in _SKIP:
            continue
        g = got[key]
        if key in ("Gpu", "ResourceAttributes"):
            w = dict(w)
            g = dict(g or [])
            assert g.keys() == w.keys(), (key, w, g)
            for k in w:
                assert _close(w[k], g[k]), (key, k, w[k], g[k])
            continue
        assert _close(w, g), (key, w, g)


def stalls_call() -> list[SpanRecord]:
    """One call of the single-call path's shape whose token gaps (5, 15, 280 and 1 ms) straddle
    the default stall threshold (250 ms) and 10 ms: 1 stall at the first, 2 at the second."""
    tb = TraceBuilder()
    c = tb.client(0, 400, attrs={ClientAttributes.LAST_BYTE_NS: T0 + 400 * MS})
    s = tb.server(5, 395, parent=c)
    tb.phase(Phase.PREFILL, 10, 20, parent=s)
    offsets = "[0,5000,20000,300000,301000]"
    tb.phase(Phase.DECODE, 20, 330, parent=s, attrs={LatscopeAttributes.TOKEN_OFFSETS_US: offsets})
    return tb.spans


def _close(w: Any, g: Any) -> bool:
    if w is None or g is None:
        return w is None and g is None
    if isinstance(w, float) or isinstance(g, float):
        return math.isclose(float(w), float(g), rel_tol=1e-9, abs_tol=1e-6)
    return w == g


def server_total(a: RequestAttribution) -> int:
    return sum(v for k, v in a.buckets_ns.items() if k != "network" and v is not None)


_SQL_STORE: list[Store] = []


def check_sql_with(store: Store | None) -> None:
    """Make ``both`` and ``every_request`` also check the SQL attributor against ``store``."""
    _SQL_STORE.clear()
    if store is not None:
        _SQL_STORE.append(store)


def every_request(trace_id: str, spans: list[SpanRecord], **kw: Any) -> list[RequestAttribution]:
    """Every request of a trace, by the reference engine, checked against the SQL attributor
    when a store is set (``check_sql_with``)."""
    if _SQL_STORE:
        return sql_check(_SQL_STORE[0], {trace_id: spans}, **kw)[trace_id]
    return attribute_requests(trace_id, spans, **kw)


def both(trace_id: str, spans: list[SpanRecord], **kw: Any) -> RequestAttribution | None:
    """The one request of a single-call trace (None when it has none), checked against the SQL
    attributor when a store is set."""
    found = every_request(trace_id, spans, **kw)
    assert len(found) <= 1, [a.request_id for a in found]
    return found[0] if found else None


def span_rows(trace_id: str, spans: list[dict]) -> pa.Table:
    """Rows for the spans table (only the columns the attributor reads are filled)."""
    cols: dict[str, list] = {name: [] for name in SPANS_SCHEMA.names}
    for s in spans:
        row = {
            "Timestamp": s["start"],
            "TraceId": trace_id,
            "SpanId": s["id"],
            "ParentSpanId": s.get("parent", ""),
            "TraceState": "",
            "SpanName": s.get("name", "span"),
            "SpanKind": s["kind"],
            "ServiceName": s.get("service", "attr-test"),
            "ResourceAttributes": [],
            "ScopeName": "",
            "ScopeVersion": "",
            "SpanAttributes": list(s.get("attrs", {}).items()),
            "Duration": s["end"] - s["start"],
            "StatusCode": "Ok",
            "StatusMessage": "",
        }
        for name in SPANS_SCHEMA.names:
            cols[name].append(row.get(name, []))
    return pa.Table.from_pydict(cols, schema=SPANS_SCHEMA)


def server_spans(day_offset_ns: int = 0) -> list[dict]:
    s0 = T0 + day_offset_ns
    return [
        {"id": "a1" * 8, "parent": "c1" * 8, "kind": "Server", "start": s0 + 40 * MS,
         "end": s0 + 960 * MS, "attrs": {"latscope.phase": ""}},
        {"id": "b1" * 8, "parent": "a1" * 8, "kind": "Internal", "start": s0 + 45 * MS,
         "end": s0 + 145 * MS, "attrs": {"latscope.phase": "queue"}},
        {"id": "b2" * 8, "parent": "a1" * 8, "kind": "Internal", "start": s0 + 380 * MS,
         "end": s0 + 900 * MS, "attrs": {"latscope.phase": "decode"}},
    ]  # fmt: skip


def calls_run(n: int) -> list[dict]:
    """A run of ``n`` calls in one trace: a root and ``n`` servers of ``server_spans``' shape,
    a second apart (3 * n + 1 spans)."""
    root = {"id": "f0" * 8, "kind": "Internal", "start": T0, "end": T0 + (n + 1) * 1000 * MS}
    spans = [root]
    for i in range(n):
        ids = {old: f"{i:04x}{old[:2] * 6}" for old in ("a1" * 8, "b1" * 8, "b2" * 8)}
        for s in server_spans(day_offset_ns=i * 1000 * MS):
            spans.append({**s, "id": ids[s["id"]], "parent": ids.get(s["parent"], root["id"])})
    return spans
