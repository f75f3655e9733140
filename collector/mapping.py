"""OTLP -> spans-table and metrics-table columns: the one place that knows both layouts.

Column layout and value stringification follow the OpenTelemetry Collector's ClickHouse
exporter (``otel_traces``): ids as lowercase hex, ``SpanKind`` / ``StatusCode`` as words,
attributes flattened into ``Map(String, String)`` with non-string values rendered the way
pdata's ``Value.AsString()`` does (bools ``true``/``false``, doubles without exponent, bytes in
base64, arrays and kvlists as JSON).

The hot path is ``decode_spans``: the serialized Export goes to a C decoder (``_otlp.c``, built
at install time) that validates and maps it straight into Arrow buffers. ``SpanColumns`` is the
same mapping in Python over parsed protobuf objects: the reference the C decoder is tested
against, the fallback when the extension was not built, and the path OTLP/JSON takes. Rows never
exist as Python objects: columns are appended as flat lists (map columns as offsets + keys +
values), and validation runs in the same pass, so a span is touched once.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import ResourceMetrics
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span, Status

from latscope.semconv import LatscopeAttributes, ResourceAttributes
from latscope.tokens import DEFAULT_STALL_NS, parse_int_list, token_figures

_otlp: ModuleType | None
try:
    from latscope.collector import _otlp  # type: ignore[attr-defined,no-redef]
except ImportError:  # built without a C compiler: decode_spans falls back to SpanColumns
    _otlp = None

_MAP = pa.map_(pa.string(), pa.string())
_TS = pa.timestamp("ns")
_FIGURES = pa.list_(pa.float64())
# The resource attributes the spans of one ResourceSpans share are held once, as an Arrow
# dictionary with an index per row: copied onto every span, they made one 7.9 MB Export half a
# gigabyte of columns. ClickHouse expands the dictionary on insert, so the stored table is the
# same. (Scope attributes are not stored; string columns stay plain, because ClickHouse refuses a
# string dictionary with repeated values.)
_DICT_MAP = pa.dictionary(pa.int32(), _MAP)

SPANS_SCHEMA = pa.schema(
    [
        ("Timestamp", _TS),
        ("TraceId", pa.string()),
        ("SpanId", pa.string()),
        ("ParentSpanId", pa.string()),
        ("TraceState", pa.string()),
        ("SpanName", pa.string()),
        ("SpanKind", pa.string()),
        ("ServiceName", pa.string()),
        ("ResourceAttributes", _MAP),
        ("ScopeName", pa.string()),
        ("ScopeVersion", pa.string()),
        ("SpanAttributes", _MAP),
        ("Duration", pa.uint64()),
        ("StatusCode", pa.string()),
        ("StatusMessage", pa.string()),
        ("Events.Timestamp", pa.list_(_TS)),
        ("Events.Name", pa.list_(pa.string())),
        ("Events.Attributes", pa.list_(_MAP)),
        ("Links.TraceId", pa.list_(pa.string())),
        ("Links.SpanId", pa.list_(pa.string())),
        ("Links.TraceState", pa.list_(pa.string())),
        ("Links.Attributes", pa.list_(_MAP)),
        # latscope's own column (deploy/clickhouse/011_token_figures.sql): the figures of the
        # span's token offsets, which other writers leave empty.
        ("LatscopeTokenFigures", _FIGURES),
    ]
)

#: The columns the collector decodes into: ``SPANS_SCHEMA`` (the stored layout, which tables built
#: by hand may use too) with ResourceAttributes dictionary-encoded, one entry per resource.
DECODED_SPANS_SCHEMA = SPANS_SCHEMA.set(
    SPANS_SCHEMA.get_field_index("ResourceAttributes"), pa.field("ResourceAttributes", _DICT_MAP)
)

METRICS_SCHEMA = pa.schema(
    [
        ("Timestamp", _TS),
        ("ServiceName", pa.string()),
        ("MetricName", pa.string()),
        ("MetricKind", pa.string()),
        ("Unit", pa.string()),
        ("Value", pa.float64()),
        ("Attributes", _MAP),
        ("ResourceAttributes", _MAP),
        ("StartTimeUnix", _TS),
        ("AggregationTemporality", pa.int32()),
        ("IsMonotonic", pa.bool_()),
    ]
)

#: Tables of the histogram kinds (deploy/clickhouse/006_metrics_histograms.sql).
HISTOGRAM_TABLE = "latscope_metrics_histogram"
EXPONENTIAL_HISTOGRAM_TABLE = "latscope_metrics_exponential_histogram"

_DISTRIBUTION_HEAD = [
    ("Timestamp", _TS),
    ("StartTimeUnix", _TS),
    ("ServiceName", pa.string()),
    ("MetricName", pa.string()),
    ("MetricDescription", pa.string()),
    ("Unit", pa.string()),
    ("Attributes", _MAP),
    ("ResourceAttributes", _MAP),
    ("ScopeName", pa.string()),
    ("ScopeVersion", pa.string()),
    ("Count", pa.uint64()),
    ("Sum", pa.float64()),
    ("Min", pa.float64()),
    ("Max", pa.float64()),
]
_DISTRIBUTION_TAIL = [
    ("Exemplars.Timestamp", pa.list_(_TS)),
    ("Exemplars.Value", pa.list_(pa.float64())),
    ("Exemplars.TraceId", pa.list_(pa.string())),
    ("Exemplars.SpanId", pa.list_(pa.string())),
    ("Exemplars.FilteredAttributes", pa.list_(_MAP)),
    ("Flags", pa.uint32()),
    ("AggregationTemporality", pa.int32()),
]
HISTOGRAM_SCHEMA = pa.schema(
    [
        *_DISTRIBUTION_HEAD,
        ("BucketCounts", pa.list_(pa.uint64())),
        ("ExplicitBounds", pa.list_(pa.float64())),
        *_DISTRIBUTION_TAIL,
    ]
)
EXPONENTIAL_HISTOGRAM_SCHEMA = pa.schema(
    [
        *_DISTRIBUTION_HEAD,
        ("Scale", pa.int32()),
        ("ZeroCount", pa.uint64()),
        ("ZeroThreshold", pa.float64()),
        ("PositiveOffset", pa.int32()),
        ("PositiveBucketCounts", pa.list_(pa.uint64())),
        ("NegativeOffset", pa.int32()),
        ("NegativeBucketCounts", pa.list_(pa.uint64())),
        *_DISTRIBUTION_TAIL,
    ]
)
#: The range of ``scale`` the OTLP data model allows for exponential histograms.
_MIN_SCALE, _MAX_SCALE = -10, 20

SPAN_KINDS = (
    "Unspecified",  # Span.SPAN_KIND_UNSPECIFIED
    "Internal",
    "Server",
    "Client",
    "Producer",
    "Consumer",
)

STATUS_CODES = ("Unset", "Ok", "Error")  # Status.STATUS_CODE_UNSET, _OK, _ERROR

_ZERO_TRACE = bytes(16)
_ZERO_SPAN = bytes(8)
#: Arrow and ClickHouse keep nanosecond times as signed 64-bit: anything later (past the year
#: 2262) cannot be stored, so such a span is rejected rather than failing its whole Export.
_MAX_TIME = (1 << 63) - 1
_TIME_PROBLEM = "is past the year 2262 (not a signed 64-bit nanosecond time)"


@dataclass(frozen=True)
class Limits:
    """What a single span may carry before it is rejected as oversized."""

    #: most attributes on one span (events and links count their own separately)
    max_attributes: int = 1024
    #: longest rendered attribute value, in characters (strings) or bytes (bytes values)
    max_attribute_value: int = 64 * 1024
    #: a span starting before this (ns since the epoch) is rejected; 0: no bound. Set per
    #: Export from the collector's clock (``window``), never in a journal segment's header: a
    #: span accepted once is replayed whatever the time.
    oldest_start_ns: int = 0
    #: a span ending after this (ns since the epoch) is rejected; 0: no bound
    latest_end_ns: int = 0

    def window(self, now_ns: int, max_age_s: float, max_future_s: float) -> Limits:
        """These limits with the span time window of an Export received at ``now_ns``.

        >>> Limits().window(10**18, 0, 60).latest_end_ns
        1000000060000000000
        """
        return replace(
            self,
            oldest_start_ns=max(0, now_ns - int(max_age_s * 1e9)) if max_age_s else 0,
            latest_end_ns=min(_MAX_TIME, now_ns + int(max_future_s * 1e9)) if max_future_s else 0,
        )


_OLD_PROBLEM = "start_time_unix_nano is older than the collector accepts (--max-span-age-s)"
_FUTURE_PROBLEM = (
    "end_time_unix_nano is further in the future than the collector accepts (--max-span-future-s)"
)


def format_double(value: float) -> str:
    """A double as Go's ``strconv.FormatFloat(v, 'f', -1, 64)``: shortest, never an exponent."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(value)
    if "e" in text or "E" in text:
        from decimal import Decimal

        text = format(Decimal(text), "f")
    elif text.endswith(".0"):
        text = text[:-2]
    return text


def _json_value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "int_value":
        return value.int_value
    if kind == "double_value":
        d = value.double_value
        return d if math.isfinite(d) else format_double(d)
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    if kind == "array_value":
        return [_json_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _json_value(kv.value) for kv in value.kvlist_value.values}
    return None


def value_to_string(value: AnyValue) -> str:
    """Render one attribute value as the spans table stores it.

    >>> value_to_string(AnyValue(double_value=1e21))
    '1000000000000000000000'
    """
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "int_value":
        return str(value.int_value)
    if kind == "bool_value":
        return "true" if value.bool_value else "false"
    if kind == "double_value":
        return format_double(value.double_value)
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    if kind in ("array_value", "kvlist_value"):
        return json.dumps(_json_value(value), separators=(",", ":"), ensure_ascii=False)
    return ""


def attributes_to_pairs(attributes: Iterable[KeyValue]) -> list[tuple[str, str]]:
    """Attributes as (key, rendered value) pairs; a repeated key keeps its last value."""
    out: dict[str, str] = {}
    for kv in attributes:
        out[kv.key] = value_to_string(kv.value)
    return list(out.items())


class _MapColumn:
    """A ``Map(String, String)`` column under construction: offsets + flat keys and values."""

    __slots__ = ("keys", "offsets", "values")

    def __init__(self) -> None:
        self.offsets: list[int] = [0]
        self.keys: list[str] = []
        self.values: list[str] = []

    def add(self, keys: list[str], values: list[str]) -> None:
        self.keys += keys
        self.values += values
        self.offsets.append(len(self.keys))

    def array(self) -> pa.Array:
        return pa.MapArray.from_arrays(
            pa.array(self.offsets, pa.int32()),
            pa.array(self.keys, pa.string()),
            pa.array(self.values, pa.string()),
        )


def _render(keys: list[str], values: list[str], attributes: Any, limits: Limits) -> str | None:
    """Append rendered attributes to keys/values; returns a problem or None.

    String values (the vast majority) take a fast path with no rendering at all.
    """
    if len(attributes) > limits.max_attributes:
        return f"{len(attributes)} attributes, more than the limit of {limits.max_attributes}"
    max_len = limits.max_attribute_value
    add_key, add_value = keys.append, values.append
    for kv in attributes:
        v = kv.value
        # A non-empty string_value means the oneof holds a string: one call instead of two.
        text = v.string_value
        if not text:
            kind = v.WhichOneof("value")
            if kind == "int_value":
                text = str(v.int_value)
            elif kind == "double_value":
                text = format_double(v.double_value)
            elif kind == "bool_value":
                text = "true" if v.bool_value else "false"
            elif kind is not None and kind != "string_value":
                text = value_to_string(v)
        if len(text) > max_len:
            return f"attribute {kv.key[:64]!r} is {len(text)} long, more than {max_len}"
        add_key(kv.key)
        add_value(text)
    return None


def _dedup(keys: list[str], values: list[str]) -> tuple[list[str], list[str]]:
    # A repeated key keeps its last value, as a map would (the OTel spec forbids repeats,
    # but a hand-built Export can carry them and ClickHouse maps would keep both).
    merged = dict(zip(keys, values, strict=True))
    return list(merged), list(merged.values())


def stored_token_figures(offsets: str) -> list[float]:
    """What the collector stores in ``LatscopeTokenFigures`` for a span whose
    latscope.token_offsets_us is ``offsets``: tokens.token_figures at the default stall
    threshold, or nothing when it is not a JSON array of integers (the C decoder computes the
    same; the attributor computes them from the offsets where a writer stored none)."""
    tokens = parse_int_list(offsets)
    return token_figures(tokens, DEFAULT_STALL_NS) if tokens else []


def span_problem(span: Span, limits: Limits | None = None) -> str | None:
    """Why a span cannot be stored as sent (ids and times only), or None when it can."""
    tid, sid = span.trace_id, span.span_id
    if len(tid) != 16 or tid == _ZERO_TRACE:
        return "trace_id must be 16 bytes, not all zero"
    if len(sid) != 8 or sid == _ZERO_SPAN:
        return "span_id must be 8 bytes, not all zero"
    psid = span.parent_span_id
    if psid and len(psid) != 8:
        return "parent_span_id must be empty or 8 bytes"
    if span.end_time_unix_nano < span.start_time_unix_nano:
        return "end_time_unix_nano is before start_time_unix_nano"
    if span.end_time_unix_nano > _MAX_TIME:
        return "end_time_unix_nano " + _TIME_PROBLEM
    if limits is not None and span.start_time_unix_nano < limits.oldest_start_ns:
        return _OLD_PROBLEM
    if (
        limits is not None
        and limits.latest_end_ns
        and span.end_time_unix_nano > limits.latest_end_ns
    ):
        return _FUTURE_PROBLEM
    return None


@dataclass
class SpanColumns:
    """Spans of one or more Exports as columns, plus what was rejected and why."""

    limits: Limits = field(default_factory=Limits)
    rows: int = 0
    rejected: int = 0
    first_problem: str = ""

    def __post_init__(self) -> None:
        self.start: list[int] = []
        self.trace_id: list[str] = []
        self.span_id: list[str] = []
        self.parent: list[str] = []
        self.trace_state: list[str] = []
        self.name: list[str] = []
        self.kind: list[str] = []
        self.service: list[str] = []
        # A dictionary: one entry per resource with an accepted span, and each row's index into
        # it (as the C decoder builds them).
        self.resource_ix: list[int] = []
        self.resources = _MapColumn()
        self.scope_name: list[str] = []
        self.scope_version: list[str] = []
        self.attributes = _MapColumn()
        self.duration: list[int] = []
        self.status_code: list[str] = []
        self.status_message: list[str] = []
        # Events and links: list columns as offsets into flat children.
        self.ev_offsets: list[int] = [0]
        self.ev_time: list[int] = []
        self.ev_name: list[str] = []
        self.ev_attrs = _MapColumn()
        self.ln_offsets: list[int] = [0]
        self.ln_trace: list[str] = []
        self.ln_span: list[str] = []
        self.ln_state: list[str] = []
        self.ln_attrs = _MapColumn()
        # LatscopeTokenFigures: a list column as offsets into the flat figures.
        self.tf_offsets: list[int] = [0]
        self.tf: list[float] = []

    def _reject(self, span: Span, problem: str) -> None:
        self.rejected += 1
        if not self.first_problem:
            self.first_problem = f"span {span.span_id.hex() or '<empty>'}: {problem}"

    def add(self, resource_spans: Iterable[ResourceSpans]) -> None:
        """Validate and append every span; rejected spans are counted, the rest kept."""
        limits = self.limits
        kinds, codes = SPAN_KINDS, STATUS_CODES
        zero_trace, zero_span = _ZERO_TRACE, _ZERO_SPAN
        oldest, latest = limits.oldest_start_ns, limits.latest_end_ns or _MAX_TIME
        service_key = ResourceAttributes.SERVICE_NAME
        # Bound methods once per Export, not per span: this loop runs for every span received.
        add_attrs = self.attributes.add
        add_start, add_duration = self.start.append, self.duration.append
        add_trace, add_span, add_parent = (
            self.trace_id.append,
            self.span_id.append,
            self.parent.append,
        )
        add_state, add_name, add_kind = (
            self.trace_state.append,
            self.name.append,
            self.kind.append,
        )
        add_service, add_scope_name, add_scope_version = (
            self.service.append,
            self.scope_name.append,
            self.scope_version.append,
        )
        add_resource_ix = self.resource_ix.append
        add_code, add_message = self.status_code.append, self.status_message.append
        add_events_links = self._add_events_links
        offsets_key = LatscopeAttributes.TOKEN_OFFSETS_US
        add_figures, tf_offsets = self.tf.extend, self.tf_offsets
        rows = 0
        for rs in resource_spans:
            rkeys: list[str] = []
            rvalues: list[str] = []
            problem = _render(rkeys, rvalues, rs.resource.attributes, limits)
            if problem is not None:
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        self._reject(span, "resource: " + problem)
                continue
            if len(set(rkeys)) != len(rkeys):
                rkeys, rvalues = _dedup(rkeys, rvalues)
            service = ""
            if service_key in rkeys:
                service = rvalues[len(rkeys) - 1 - rkeys[::-1].index(service_key)]
            resource_ix = -1
            for ss in rs.scope_spans:
                scope = ss.scope
                scope_name, scope_version = scope.name, scope.version
                for span in ss.spans:
                    tid, sid, psid = span.trace_id, span.span_id, span.parent_span_id
                    start, end = span.start_time_unix_nano, span.end_time_unix_nano
                    if (
                        len(tid) != 16
                        or len(sid) != 8
                        or (psid and len(psid) != 8)
                        or end < start
                        or end > _MAX_TIME
                        or tid == zero_trace
                        or sid == zero_span
                        or start < oldest
                        or end > latest
                    ):
                        self._reject(span, span_problem(span, limits) or "invalid span")
                        continue
                    akeys: list[str] = []
                    avalues: list[str] = []
                    problem = _render(akeys, avalues, span.attributes, limits)
                    if problem is None:
                        problem = add_events_links(span, limits)
                    if problem is not None:
                        self._reject(span, problem)
                        continue
                    if len(set(akeys)) != len(akeys):
                        akeys, avalues = _dedup(akeys, avalues)
                    add_attrs(akeys, avalues)
                    if offsets_key in akeys:
                        add_figures(stored_token_figures(avalues[akeys.index(offsets_key)]))
                    tf_offsets.append(len(self.tf))
                    if resource_ix < 0:  # the resource's first accepted span
                        resource_ix = len(self.resources.offsets) - 1
                        self.resources.add(rkeys, rvalues)
                    add_resource_ix(resource_ix)
                    add_start(start)
                    add_duration(end - start)
                    add_trace(tid.hex())
                    add_span(sid.hex())
                    add_parent(psid.hex())
                    add_state(span.trace_state)
                    add_name(span.name)
                    kind = span.kind
                    add_kind(kinds[kind] if 0 <= kind < 6 else "Unspecified")
                    add_service(service)
                    add_scope_name(scope_name)
                    add_scope_version(scope_version)
                    status = span.status
                    code = status.code
                    add_code(codes[code] if 0 <= code < 3 else "Unset")
                    add_message(status.message)
                    rows += 1
        self.rows += rows

    def _add_events_links(self, span: Span, limits: Limits) -> str | None:
        events, links = span.events, span.links
        if not events and not links:
            self.ev_offsets.append(self.ev_offsets[-1])
            self.ln_offsets.append(self.ln_offsets[-1])
            return None
        # Render everything first so a rejected span leaves no half-written children.
        ev_rows = []
        for e in events:
            if e.time_unix_nano > _MAX_TIME:
                return f"event {e.name[:64]!r}: time_unix_nano {_TIME_PROBLEM}"
            k: list[str] = []
            v: list[str] = []
            problem = _render(k, v, e.attributes, limits)
            if problem is not None:
                return f"event {e.name[:64]!r}: {problem}"
            ev_rows.append((e.time_unix_nano, e.name, k, v))
        ln_rows = []
        for lk in links:
            k, v = [], []
            problem = _render(k, v, lk.attributes, limits)
            if problem is not None:
                return f"link: {problem}"
            ln_rows.append((lk.trace_id.hex(), lk.span_id.hex(), lk.trace_state, k, v))
        for t, name, k, v in ev_rows:
            self.ev_time.append(t)
            self.ev_name.append(name)
            self.ev_attrs.add(*_dedup(k, v))
        self.ev_offsets.append(len(self.ev_time))
        for trace, s, st, k, v in ln_rows:
            self.ln_trace.append(trace)
            self.ln_span.append(s)
            self.ln_state.append(st)
            self.ln_attrs.add(*_dedup(k, v))
        self.ln_offsets.append(len(self.ln_trace))
        return None

    def table(self) -> pa.Table:
        """The accepted spans as an Arrow table in ``DECODED_SPANS_SCHEMA``."""
        ev = pa.array(self.ev_offsets, pa.int32())
        ln = pa.array(self.ln_offsets, pa.int32())
        resource_ix = pa.array(self.resource_ix, pa.int32())
        s = pa.string()
        arrays = [
            pa.array(self.start, _TS),
            pa.array(self.trace_id, s),
            pa.array(self.span_id, s),
            pa.array(self.parent, s),
            pa.array(self.trace_state, s),
            pa.array(self.name, s),
            pa.array(self.kind, s),
            pa.array(self.service, s),
            _dictionary(resource_ix, self.resources.array()),
            pa.array(self.scope_name, s),
            pa.array(self.scope_version, s),
            self.attributes.array(),
            pa.array(self.duration, pa.uint64()),
            pa.array(self.status_code, s),
            pa.array(self.status_message, s),
            pa.ListArray.from_arrays(ev, pa.array(self.ev_time, _TS)),
            pa.ListArray.from_arrays(ev, pa.array(self.ev_name, s)),
            pa.ListArray.from_arrays(ev, self.ev_attrs.array()),
            pa.ListArray.from_arrays(ln, pa.array(self.ln_trace, s)),
            pa.ListArray.from_arrays(ln, pa.array(self.ln_span, s)),
            pa.ListArray.from_arrays(ln, pa.array(self.ln_state, s)),
            pa.ListArray.from_arrays(ln, self.ln_attrs.array()),
            pa.ListArray.from_arrays(
                pa.array(self.tf_offsets, pa.int32()), pa.array(self.tf, pa.float64())
            ),
        ]
        return pa.Table.from_arrays(arrays, schema=DECODED_SPANS_SCHEMA)


def _dictionary(indices: pa.Array, dictionary: pa.Array) -> pa.DictionaryArray:
    # The indices are built beside their dictionary, in range by construction.
    return pa.DictionaryArray.from_arrays(indices, dictionary, safe=False)


def table_bytes(table: pa.Table) -> int:
    """The memory a table's buffers take (a dictionary counted once, as it is held)."""
    return table.get_total_buffer_size()


def _entry_sizes(dictionary: pa.MapArray) -> pa.Array:
    """Bytes of each entry of a ``Map(String, String)`` dictionary once written out per row."""

    def per_entry(strings: pa.Array) -> pa.Array:
        ends = pc.cumulative_sum(pc.binary_length(strings).cast(pa.int64()))
        at = pc.take(pa.concat_arrays([pa.array([0], pa.int64()), ends]), bounds)
        return pc.pairwise_diff(at).slice(1)

    bounds = dictionary.offsets
    pairs = pc.pairwise_diff(bounds.cast(pa.int64())).slice(1)
    # Two offsets per pair and one per row, as ClickHouse and Arrow both lay maps out.
    extra = pc.add(pc.multiply(pairs, 8), 4)
    return pc.add(pc.add(per_entry(dictionary.keys), per_entry(dictionary.items)), extra)


def expanded_bytes(table: pa.Table) -> int:
    """A table's size with its dictionaries written out per row: what an insert of it costs
    ClickHouse, which expands them (``table_bytes`` is what it costs here).

    A dictionary column's chunks are joined first (``_joined``): each chunk holds one Export's
    resources, and a segment has dozens of chunks, which the kernels below would take one at a
    time, at about 1 ms each.
    """
    total = 0
    for column in table.columns:
        if not pa.types.is_dictionary(column.type):
            total += column.nbytes
            continue
        chunk = _joined(column)
        counts = pc.value_counts(chunk.indices)
        sizes = pc.take(_entry_sizes(chunk.dictionary), counts.field("values"))
        total += pc.sum(pc.multiply(sizes, counts.field("counts"))).as_py() or 0
        total += len(chunk) * column.type.index_type.bit_width // 8
    return total


def _joined(column: pa.ChunkedArray) -> pa.DictionaryArray:
    """A dictionary column's chunks as one array: their dictionaries one after the other, each
    chunk's indices shifted past the ones before.

    Arrow's ``combine_chunks`` cannot always merge dictionaries of maps ("unification of
    map<string, string> dictionaries is not implemented").
    """
    if column.num_chunks == 1:
        return column.chunk(0)
    kind = column.type
    dictionaries = [pa.array([], kind.value_type)]
    indices, base = [pa.array([], kind.index_type)], 0
    for chunk in column.chunks:
        dictionaries.append(chunk.dictionary)
        indices.append(pc.add(chunk.indices, pa.scalar(base, kind.index_type)))
        base += len(chunk.dictionary)
    return pa.DictionaryArray.from_arrays(
        pa.concat_arrays(indices), pa.concat_arrays(dictionaries), safe=False
    )


def combine(table: pa.Table) -> pa.Table:
    """``table`` with one chunk per column (ClickHouse takes that several times faster); the
    chunks of a dictionary column are joined by ``_joined``."""
    columns = [
        _joined(column)
        if pa.types.is_dictionary(column.type) and column.num_chunks > 1
        else column.combine_chunks()
        for column in table.columns
    ]
    return pa.Table.from_arrays(columns, schema=table.schema)


#: The spans table's column of resource ids (deploy/clickhouse/012_resource_ids.sql).
RESOURCE_ID = "LatscopeResourceId"


def resource_id(pairs: Iterable[tuple[str, str]]) -> int:
    """A resource's id: a 64-bit hash of its attributes as rendered, in order (never 0, which
    means "no id"). The same attributes give the same id in every collector process."""
    h = hashlib.blake2b(digest_size=8)
    for key, value in pairs:
        k, v = key.encode(), value.encode()
        h.update(len(k).to_bytes(4, "little"))
        h.update(k)
        h.update(len(v).to_bytes(4, "little"))
        h.update(v)
    return int.from_bytes(h.digest(), "little") or 1


def _per_entry(strings: pa.Array, bounds: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Each map entry's keys (or values) as one binary value: their bytes, and their lengths'
    bytes, without copying either (views over ``strings``' buffers cut at the entries'
    ``bounds``)."""
    offsets = pa.Array.from_buffers(
        pa.int32(), len(strings) + 1, [None, strings.buffers()[1]], offset=strings.offset
    )
    n = len(bounds) - 1
    joined = pa.Array.from_buffers(
        pa.binary(), n, [None, pc.take(offsets, bounds).buffers()[1], strings.buffers()[2]]
    )
    lengths = pc.binary_length(strings).cast(pa.int32())
    scaled = pc.multiply(bounds, pa.scalar(4, pa.int32()))
    sizes = pa.Array.from_buffers(
        pa.binary(), n, [None, scaled.buffers()[1], lengths.buffers()[1]], offset=scaled.offset
    )
    return joined, sizes


def _code(*arrays: pa.Array) -> pa.Array:
    """One int64 code per position, equal where all ``arrays`` are equal (in order of first
    appearance)."""
    code = pc.dictionary_encode(arrays[0]).indices.cast(pa.int64())
    for array in arrays[1:]:
        other = pc.dictionary_encode(array).indices.cast(pa.int64())
        combined = pc.add(pc.multiply(code, pa.scalar(len(array) + 1, pa.int64())), other)
        code = pc.dictionary_encode(combined).indices.cast(pa.int64())
    return code


def resource_ids(column: pa.Array) -> tuple[pa.Array, dict[int, pa.Scalar]]:
    """A ``ResourceAttributes`` column (dictionary-encoded, as decoded, or a plain map) -> each
    row's resource id (``resource_id``), and one entry of the attributes of each id.

    The ids are computed once per distinct entry: a batch holds a dictionary entry per
    ResourceSpans of each Export (thousands), mostly the same few resources. Equal entries are
    found by Arrow's hashing of each entry's keys, values and their lengths (views over the
    buffers), so only the distinct ones are hashed here.
    """
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if isinstance(column, pa.DictionaryArray):
        indices, entries = column.indices, column.dictionary
    else:
        indices, entries = pa.array(range(len(column)), pa.int32()), column
    if not len(entries):
        return pa.array([], pa.uint64()).take(indices.cast(pa.int64())), {}
    bounds = entries.offsets
    keys, key_sizes = _per_entry(entries.keys, bounds)
    values, value_sizes = _per_entry(entries.items, bounds)
    groups = _code(keys, key_sizes, values, value_sizes)
    count = pc.max(groups).as_py() + 1
    firsts = pc.index_in(pa.array(range(count), pa.int64()), value_set=groups)
    found: dict[int, pa.Scalar] = {}
    ids = []
    for at in firsts.to_pylist():
        entry = entries[at]
        rid = resource_id(entry.as_py() or ())
        found.setdefault(rid, entry)
        ids.append(rid)
    per_entry = pc.take(pa.array(ids, pa.uint64()), groups)
    return pc.take(per_entry, indices), found


def resource_rows(found: dict[int, pa.Scalar], ids: Iterable[int] | None = None) -> pa.Table:
    """Rows of ``latscope_resources`` for these ids (default: all) of ``resource_ids``'s
    ``found``; the table's Timestamp is the store's clock at the insert."""
    ids = list(found if ids is None else ids)
    attributes = [found[rid].as_py() for rid in ids]
    return pa.table(
        {
            "ResourceId": pa.array(ids, pa.uint64()),
            "ResourceAttributes": pa.array(attributes, _MAP),
        }
    )


def insert_slices(table: pa.Table, max_bytes: int, size: int | None = None) -> list[pa.Table]:
    """``table`` cut into consecutive slices of at most about ``max_bytes`` expanded bytes each;
    ``size``: its ``expanded_bytes``, when known already (the C decoder's count of its Exports).

    The cut depends only on the table and ``max_bytes``, so a replay of the same rows is cut the
    same way (each slice keeps its deduplication token).
    """
    rows = table.num_rows
    if size is None:
        size = expanded_bytes(table)
    if rows <= 1 or size <= max_bytes:
        return [table]
    per_slice = max(1, rows * max_bytes // size)
    return [table.slice(start, per_slice) for start in range(0, rows, per_slice)]


def spans_table(resource_spans: Iterable[ResourceSpans], limits: Limits | None = None) -> pa.Table:
    """OTLP ``ResourceSpans`` -> an Arrow table ready for ``Store.insert_arrow``.

    Invalid spans are left out; use ``SpanColumns`` to learn how many and why.
    """
    cols = SpanColumns(limits or Limits())
    cols.add(resource_spans)
    return cols.table()


# -- the C decoder --------------------------------------------------------------------------------

#: Whether ``decode_spans`` runs the C decoder (False: the extension was not built here).
NATIVE = _otlp is not None

#: Most memory one Export may take once decoded into columns; beyond it the Export is refused as
#: malformed (it can never be taken). Shared resource and scope attributes are held once, so the
#: columns of a well-formed Export are a small multiple of its size on the wire; what the
#: collector may hold in all is ``--memory-limit-bytes``.
MAX_DECODED_BYTES = 1 << 30


class MalformedExport(ValueError):
    """The bytes are not an OTLP ``ExportTraceServiceRequest`` (gRPC INVALID_ARGUMENT, HTTP 400)."""


class ExportTooLarge(MalformedExport):
    """Decoding stopped: the Export's columns would take more than ``max_bytes``.

    Past ``MAX_DECODED_BYTES`` the Export can never be taken (INVALID_ARGUMENT); below it, the
    caller's memory limit was what ran out, and the Export may be retried later.
    """


@dataclass
class DecodedSpans:
    """One Export's accepted spans as a table, and what was rejected and why."""

    table: pa.Table
    rows: int
    rejected: int
    first_problem: str
    #: ``expanded_bytes(table)``, as the C decoder counts it while decoding (None: not counted)
    expanded: int | None = None

    @property
    def nbytes(self) -> int:
        """The memory the decoded columns hold."""
        return table_bytes(self.table)


def _json_of(raw: bytes) -> str:
    # The C decoder's callback for arrays and kvlists, rare enough to render in Python.
    return value_to_string(AnyValue.FromString(raw))


if _otlp is not None:
    _otlp.set_value_renderer(_json_of)


def decode_spans(
    data: bytes,
    limits: Limits | None = None,
    *,
    native: bool | None = None,
    max_bytes: int = MAX_DECODED_BYTES,
) -> DecodedSpans:
    """A serialized ``ExportTraceServiceRequest`` -> its valid spans (``DECODED_SPANS_SCHEMA``).

    Raises ``MalformedExport`` when ``data`` is not an Export, and ``ExportTooLarge`` when its
    columns would take more than ``max_bytes`` (the C decoder stops there; the Python path, which
    builds Python objects first, checks afterwards). ``native=False`` takes the Python path (the
    reference) even where the C decoder is built; the default is ``NATIVE``.

    >>> decode_spans(ExportTraceServiceRequest().SerializeToString()).rows
    0
    """
    limits = limits or Limits()
    if (NATIVE if native is None else native) and _otlp is not None:
        try:
            rows, rejected, problem, array, address, expanded = _otlp.decode_traces(
                data,
                limits.max_attributes,
                limits.max_attribute_value,
                max_bytes,
                limits.oldest_start_ns,
                limits.latest_end_ns,
            )
        except _otlp.TooLarge as exc:
            raise ExportTooLarge(str(exc)) from None
        except _otlp.MalformedExport as exc:
            raise MalformedExport(str(exc)) from None
        table = table_from_array(array, address)
        return DecodedSpans(table, rows, rejected, problem, expanded)
    try:
        request = ExportTraceServiceRequest.FromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise MalformedExport(f"not a valid ExportTraceServiceRequest: {exc}") from None
    cols = SpanColumns(limits)
    cols.add(request.resource_spans)
    decoded = DecodedSpans(cols.table(), cols.rows, cols.rejected, cols.first_problem)
    if decoded.nbytes > max_bytes:
        raise ExportTooLarge(
            f"the Export expands to more than {max_bytes} bytes of columns; send smaller Exports"
        )
    return decoded


def table_from_array(array: Any, address: int) -> pa.Table:
    """The C decoder's columns as a ``DECODED_SPANS_SCHEMA`` table, without copying them.

    ``array``, the capsule that holds an ArrowArray of the C data interface at ``address`` (a
    struct of the schema's columns over the decoder's buffers, ``batch_of`` in ``_otlp.c``), is
    taken to keep it alive until Arrow has moved it out here; the capsule then only frees the
    struct that held it.
    """
    return pa.Table.from_batches([pa.RecordBatch._import_from_c(address, DECODED_SPANS_SCHEMA)])


# -- metrics -----------------------------------------------------------------------------------


@dataclass
class MetricColumns:
    """OTLP metric data points as columns of the three metric tables: gauges and sums
    (``latscope_metrics``), histograms and exponential histograms (one table each). Summaries,
    which the OTLP spec keeps for legacy sources only, are rejected with a reason."""

    limits: Limits = field(default_factory=Limits)
    rows: int = 0
    rejected: int = 0
    first_problem: str = ""

    def __post_init__(self) -> None:
        self.time: list[int] = []
        self.service: list[str] = []
        self.name: list[str] = []
        self.kind: list[str] = []
        self.unit: list[str] = []
        self.value: list[float] = []
        self.start: list[int] = []
        self.temporality: list[int] = []
        self.monotonic: list[bool] = []
        self.attributes = _MapColumn()
        self.resource = _MapColumn()
        self.histograms = _DistributionRows(HISTOGRAM_SCHEMA, self.limits)
        self.exponential = _DistributionRows(EXPONENTIAL_HISTOGRAM_SCHEMA, self.limits)

    def _reject(self, count: int, problem: str) -> None:
        self.rejected += count
        if not self.first_problem:
            self.first_problem = problem

    def add(self, resource_metrics: Iterable[ResourceMetrics]) -> None:
        limits = self.limits
        for rm in resource_metrics:
            rkeys: list[str] = []
            rvalues: list[str] = []
            problem = _render(rkeys, rvalues, rm.resource.attributes, limits)
            rkeys, rvalues = _dedup(rkeys, rvalues)
            service = dict(zip(rkeys, rvalues, strict=True)).get(
                ResourceAttributes.SERVICE_NAME, ""
            )
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    kind = metric.WhichOneof("data")
                    if kind not in ("gauge", "sum", "histogram", "exponential_histogram"):
                        # Summaries (legacy Prometheus/statsd quantiles) cannot be merged or
                        # re-aggregated; saying so beats storing them wrong.
                        count = len(getattr(metric, kind).data_points) if kind else 0
                        self._reject(
                            count, f"metric {metric.name[:64]!r}: type {kind} is not stored"
                        )
                        continue
                    data = getattr(metric, kind)
                    if problem is not None:
                        self._reject(len(data.data_points), f"resource: {problem}")
                        continue
                    if kind in ("gauge", "sum"):
                        self._add_points(metric, kind, data, service, rkeys, rvalues)
                    else:
                        rows = self.histograms if kind == "histogram" else self.exponential
                        for p in data.data_points:
                            why = rows.add(metric, sm.scope, data, p, service, rkeys, rvalues)
                            if why is None:
                                self.rows += 1
                            else:
                                self._reject(1, f"metric {metric.name[:64]!r}: {why}")

    def _add_points(
        self, metric: Any, kind: str, data: Any, service: str, rkeys: list[str], rvalues: list[str]
    ) -> None:
        temporality = data.aggregation_temporality if kind == "sum" else 0
        monotonic = data.is_monotonic if kind == "sum" else False
        for p in data.data_points:
            k: list[str] = []
            v: list[str] = []
            point_problem = _render(k, v, p.attributes, self.limits)
            if point_problem is not None:
                self._reject(1, f"metric {metric.name[:64]!r}: {point_problem}")
                continue
            which = p.WhichOneof("value")
            if which == "as_int":
                value = float(p.as_int)
            elif which == "as_double":
                value = p.as_double
            else:
                self._reject(1, f"metric {metric.name[:64]!r}: data point has no value")
                continue
            if p.time_unix_nano > _MAX_TIME or p.start_time_unix_nano > _MAX_TIME:
                self._reject(1, f"metric {metric.name[:64]!r}: time {_TIME_PROBLEM}")
                continue
            self.attributes.add(*_dedup(k, v))
            self.resource.add(rkeys, rvalues)
            self.time.append(p.time_unix_nano)
            self.service.append(service)
            self.name.append(metric.name)
            self.kind.append(kind)
            self.unit.append(metric.unit)
            self.value.append(value)
            self.start.append(p.start_time_unix_nano)
            self.temporality.append(temporality)
            self.monotonic.append(monotonic)
            self.rows += 1

    def table(self) -> pa.Table:
        """The gauge and sum points (``latscope_metrics``)."""
        s = pa.string()
        arrays = [
            pa.array(self.time, _TS),
            pa.array(self.service, s),
            pa.array(self.name, s),
            pa.array(self.kind, s),
            pa.array(self.unit, s),
            pa.array(self.value, pa.float64()),
            self.attributes.array(),
            self.resource.array(),
            pa.array(self.start, _TS),
            pa.array(self.temporality, pa.int32()),
            pa.array(self.monotonic, pa.bool_()),
        ]
        return pa.Table.from_arrays(arrays, schema=METRICS_SCHEMA)

    def histogram_tables(self) -> dict[str, pa.Table]:
        """The histogram kinds' tables that have rows, by table name."""
        out = {}
        if self.histograms.rows:
            out[HISTOGRAM_TABLE] = self.histograms.table()
        if self.exponential.rows:
            out[EXPONENTIAL_HISTOGRAM_TABLE] = self.exponential.table()
        return out


class _DistributionRows:
    """Histogram or exponential-histogram data points as rows of one table (low volume: one
    point per series per export interval, so plain lists of Python values are fine)."""

    def __init__(self, schema: pa.Schema, limits: Limits) -> None:
        self.schema = schema
        self.limits = limits
        self.explicit = schema is HISTOGRAM_SCHEMA
        self.columns: dict[str, list[Any]] = {name: [] for name in schema.names}
        self.rows = 0

    def add(
        self,
        metric: Any,
        scope: Any,
        data: Any,
        p: Any,
        service: str,
        rkeys: list[str],
        rvalues: list[str],
    ) -> str | None:
        """Append one data point; returns why it cannot be stored instead, or None."""
        limits = self.limits
        keys: list[str] = []
        values: list[str] = []
        problem = _render(keys, values, p.attributes, limits)
        if problem is not None:
            return problem
        if p.time_unix_nano > _MAX_TIME or p.start_time_unix_nano > _MAX_TIME:
            return f"time {_TIME_PROBLEM}"
        problem = self._check_explicit(p) if self.explicit else self._check_exponential(p)
        if problem is not None:
            return problem
        exemplars = _exemplars(p.exemplars, limits)
        if isinstance(exemplars, str):
            return exemplars
        c = self.columns
        c["Timestamp"].append(p.time_unix_nano)
        c["StartTimeUnix"].append(p.start_time_unix_nano)
        c["ServiceName"].append(service)
        c["MetricName"].append(metric.name)
        c["MetricDescription"].append(metric.description)
        c["Unit"].append(metric.unit)
        c["Attributes"].append(list(zip(*_dedup(keys, values), strict=True)))
        c["ResourceAttributes"].append(list(zip(rkeys, rvalues, strict=True)))
        c["ScopeName"].append(scope.name)
        c["ScopeVersion"].append(scope.version)
        c["Count"].append(p.count)
        c["Sum"].append(p.sum if p.HasField("sum") else None)
        c["Min"].append(p.min if p.HasField("min") else None)
        c["Max"].append(p.max if p.HasField("max") else None)
        if self.explicit:
            c["BucketCounts"].append(list(p.bucket_counts))
            c["ExplicitBounds"].append(list(p.explicit_bounds))
        else:
            c["Scale"].append(p.scale)
            c["ZeroCount"].append(p.zero_count)
            c["ZeroThreshold"].append(p.zero_threshold)
            c["PositiveOffset"].append(p.positive.offset)
            c["PositiveBucketCounts"].append(list(p.positive.bucket_counts))
            c["NegativeOffset"].append(p.negative.offset)
            c["NegativeBucketCounts"].append(list(p.negative.bucket_counts))
        for name, column in zip(_EXEMPLAR_COLUMNS, exemplars, strict=True):
            c[name].append(column)
        c["Flags"].append(p.flags)
        c["AggregationTemporality"].append(data.aggregation_temporality)
        self.rows += 1
        return None

    @staticmethod
    def _check_explicit(p: Any) -> str | None:
        bounds = p.explicit_bounds
        counts = p.bucket_counts
        if counts and len(counts) != len(bounds) + 1:
            return (
                f"{len(counts)} bucket counts for {len(bounds)} bounds "
                "(OTLP needs one more count than bounds)"
            )
        if any(not a < b for a, b in itertools.pairwise(bounds)) or any(
            math.isnan(b) for b in bounds
        ):
            return "explicit_bounds must be strictly increasing"
        if counts and sum(counts) != p.count:
            return f"count {p.count} is not the sum of the bucket counts ({sum(counts)})"
        return None

    @staticmethod
    def _check_exponential(p: Any) -> str | None:
        if not _MIN_SCALE <= p.scale <= _MAX_SCALE:
            return f"scale {p.scale} is outside {_MIN_SCALE}..{_MAX_SCALE}"
        total = p.zero_count + sum(p.positive.bucket_counts) + sum(p.negative.bucket_counts)
        if total != p.count:
            return f"count {p.count} is not the sum of the zero and bucket counts ({total})"
        return None

    def table(self) -> pa.Table:
        return pa.Table.from_pydict(self.columns, schema=self.schema)


_EXEMPLAR_COLUMNS = (
    "Exemplars.Timestamp",
    "Exemplars.Value",
    "Exemplars.TraceId",
    "Exemplars.SpanId",
    "Exemplars.FilteredAttributes",
)


def _exemplars(exemplars: Any, limits: Limits) -> tuple[list[Any], ...] | str:
    """An exemplar links a bucket to the trace it was measured in (ids as lowercase hex)."""
    times: list[int] = []
    values: list[float] = []
    traces: list[str] = []
    spans: list[str] = []
    attrs: list[list[tuple[str, str]]] = []
    for e in exemplars:
        keys: list[str] = []
        vals: list[str] = []
        problem = _render(keys, vals, e.filtered_attributes, limits)
        if problem is not None:
            return f"exemplar: {problem}"
        if e.time_unix_nano > _MAX_TIME:
            return f"exemplar time {_TIME_PROBLEM}"
        times.append(e.time_unix_nano)
        values.append(float(e.as_int) if e.WhichOneof("value") == "as_int" else e.as_double)
        traces.append(e.trace_id.hex())
        spans.append(e.span_id.hex())
        attrs.append(list(zip(*_dedup(keys, vals), strict=True)))
    return times, values, traces, spans, attrs


__all__ = [
    "DECODED_SPANS_SCHEMA",
    "EXPONENTIAL_HISTOGRAM_SCHEMA",
    "EXPONENTIAL_HISTOGRAM_TABLE",
    "HISTOGRAM_SCHEMA",
    "HISTOGRAM_TABLE",
    "MAX_DECODED_BYTES",
    "METRICS_SCHEMA",
    "NATIVE",
    "RESOURCE_ID",
    "SPANS_SCHEMA",
    "DecodedSpans",
    "ExportTooLarge",
    "Limits",
    "MalformedExport",
    "MetricColumns",
    "SpanColumns",
    "attributes_to_pairs",
    "combine",
    "decode_spans",
    "expanded_bytes",
    "format_double",
    "insert_slices",
    "resource_id",
    "resource_ids",
    "resource_rows",
    "span_problem",
    "spans_table",
    "stored_token_figures",
    "table_bytes",
    "table_from_array",
    "value_to_string",
]

# Keep the enums' numbering honest: the tuples above index by the proto enum value.
assert len(SPAN_KINDS) - 1 == Span.SPAN_KIND_CONSUMER
assert len(STATUS_CODES) - 1 == Status.STATUS_CODE_ERROR
