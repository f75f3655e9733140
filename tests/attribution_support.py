"""Span builders and comparisons shared by the attribution tests."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from latscope.attribution.batch import attribute_records
from latscope.attribution.engine import attribute_trace
from latscope.attribution.model import RequestAttribution, SpanRecord
from latscope.attribution.table import attribution_row
from latscope.semconv import LatscopeAttributes, SpanKind

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
    ) -> str:
        span_id = f"{next(self._ids):016x}"
        scale = 1 if ns else MS
        s, e = T0 + int(start * scale), T0 + int(end * scale)
        self.spans.append(
            SpanRecord(
                span_id=span_id,
                parent_span_id=parent,
                name=kind.lower(),
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


def both(trace_id: str, spans: list[SpanRecord], **kw: Any) -> RequestAttribution | None:
    """The per-request result, after checking the batch engine gives the same row."""
    oracle = attribute_trace(trace_id, spans, **kw)
    frame = attribute_records({trace_id: spans}, **kw)
    if oracle is None:
        assert frame.height == 0
        return None
    assert frame.height == 1
    assert_rows_equal(oracle_row(oracle, len(spans)), frame.row(0, named=True))
    return oracle


def oracle_row(a: RequestAttribution, span_count: int) -> dict[str, Any]:
    return attribution_row(a, span_count=span_count, ingested_us=0)


_SKIP = {"SpansIngestedAt", "Version", "IsDeleted"}


def assert_rows_equal(want: dict[str, Any], got: dict[str, Any]) -> None:
    for key, w in want.items():
        if key in _SKIP:
            continue
        g = got[key]
        if key in ("Gpu", "ResourceAttributes"):
            w = dict(w)
            g = {d["key"]: d["value"] for d in (g or [])}
            assert g.keys() == w.keys(), (key, w, g)
            for k in w:
                assert _close(w[k], g[k]), (key, k, w[k], g[k])
            continue
        assert _close(w, g), (key, w, g)


def _close(w: Any, g: Any) -> bool:
    if w is None or g is None:
        return w is None and g is None
    if isinstance(w, float) or isinstance(g, float):
        return math.isclose(float(w), float(g), rel_tol=1e-9, abs_tol=1e-6)
    return w == g


def server_total(a: RequestAttribution) -> int:
    return sum(v for k, v in a.buckets_ns.items() if k != "network" and v is not None)
