"""Generated OTLP trace Exports for the decoder tests: hypothesis strategies for every value type
and every kind of invalid span, and a re-encoder that writes the same Export the many ways the
protobuf wire format allows (field order shuffled, unknown fields and groups, a message split in
two occurrences that a parser must merge, a scalar sent twice, known fields with the wrong wire
type, non-minimal lengths).
"""

from __future__ import annotations

import random

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    ArrayValue,
    InstrumentationScope,
    KeyValue,
    KeyValueList,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from latscope.collector.mapping import Limits

# -- strategies -----------------------------------------------------------------------------------


def _mostly(usual: st.SearchStrategy, odd: st.SearchStrategy) -> st.SearchStrategy:
    """usual nine times in ten (one_of would make it one in two)."""
    return st.integers(0, 9).flatmap(lambda i: usual if i < 9 else odd)


text = st.text(max_size=10)
#: latscope's token offsets, whose figures the decoders compute: a JSON array of integers (some of
#: more than 15 digits), or text that nearly is one.
OFFSETS_KEY = "latscope.token_offsets_us"
offsets_texts = st.one_of(
    st.lists(_mostly(st.integers(0, 10**6), st.integers(-(10**16), 10**16)), max_size=8).map(
        lambda v: "[" + ",".join(map(str, v)) + "]"
    ),
    st.text(alphabet="[]0123456789-, \t\n", max_size=16),
)
keys = st.one_of(st.sampled_from(["service.name", "a", "b", "é", "k" * 70, "", OFFSETS_KEY]), text)
int64 = st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-3, 3))
doubles = st.one_of(
    st.floats(),  # nan, ±inf, ±0.0, subnormals, the largest and the smallest
    st.sampled_from([1e21, 1e16, 1e15, 1.5e-7, 1e-5, 0.0001, 123456789.125, 0.1, -2.5e300]),
)

scalar_values = st.one_of(
    st.builds(
        lambda s: AnyValue(string_value=s), st.one_of(text, st.text(min_size=15), offsets_texts)
    ),
    st.builds(lambda b: AnyValue(bool_value=b), st.booleans()),
    st.builds(lambda i: AnyValue(int_value=i), int64),
    st.builds(lambda d: AnyValue(double_value=d), doubles),
    st.builds(lambda b: AnyValue(bytes_value=b), st.binary(max_size=14)),
    st.builds(lambda i: AnyValue(string_value_strindex=i), st.integers(0, 5)),
    st.just(AnyValue()),
)


def _array(values: list[AnyValue]) -> AnyValue:
    return AnyValue(array_value=ArrayValue(values=values))


def _kvlist(pairs: list[tuple[str, AnyValue]]) -> AnyValue:
    return AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key=k, value=v) for k, v in pairs]))


values = st.recursive(
    scalar_values,
    lambda inner: st.one_of(
        st.builds(_array, st.lists(inner, max_size=3)),
        st.builds(_kvlist, st.lists(st.tuples(keys, inner), max_size=3)),
    ),
    max_leaves=6,
)
# Mostly scalars, as real spans carry them, but arrays and kvlists often enough.
attribute_values = _mostly(scalar_values, values)
attributes = st.lists(_mostly(
    st.builds(lambda k, v: KeyValue(key=k, value=v), keys, attribute_values),
    st.builds(lambda t: KeyValue(key=OFFSETS_KEY, value=AnyValue(string_value=t)), offsets_texts),
), max_size=6)  # fmt: skip
times = st.one_of(st.integers(0, 2**40), st.integers(2**63 - 3, 2**64 - 1), st.just(0))


# Mostly valid, so most Exports store rows; every kind of invalid id often enough.
trace_ids = _mostly(
    st.binary(min_size=15, max_size=15).map(lambda b: b"\x01" + b),
    st.sampled_from([b"", bytes(16), b"\1" * 8]),
)
span_ids = _mostly(
    st.binary(min_size=7, max_size=7).map(lambda b: b + b"\x02"),
    st.sampled_from([b"", bytes(8), b"\1" * 4]),
)
parent_ids = _mostly(st.one_of(st.just(b""), span_ids), st.just(b"\1" * 4))
small_times = _mostly(st.integers(0, 2**62), times)


@st.composite
def spans(draw: st.DrawFn) -> Span:
    start = draw(small_times)
    end = draw(
        _mostly(st.builds(lambda d: min(start + d, 2**64 - 1), st.integers(0, 10**9)), times)
    )
    span = Span(
        trace_id=draw(trace_ids),
        span_id=draw(span_ids),
        parent_span_id=draw(parent_ids),
        trace_state=draw(text),
        name=draw(text),
        kind=draw(st.integers(-2, 8)),
        start_time_unix_nano=start,
        end_time_unix_nano=end,
        attributes=draw(attributes),
    )
    for _ in range(draw(st.integers(0, 2))):
        time = draw(small_times)
        span.events.add(time_unix_nano=time, name=draw(text), attributes=draw(attributes))
    for _ in range(draw(st.integers(0, 2))):
        span.links.add(
            trace_id=draw(st.binary(max_size=17)),
            span_id=draw(st.binary(max_size=9)),
            trace_state=draw(text),
            attributes=draw(attributes),
        )
    if draw(st.booleans()):
        span.status.CopyFrom(Status(code=draw(st.integers(-1, 4)), message=draw(text)))
    return span


@st.composite
def exports(draw: st.DrawFn) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(0, 3))):
        rs = ResourceSpans(resource=Resource(attributes=draw(attributes)))
        for _ in range(draw(st.integers(0, 2))):
            ss = ScopeSpans(
                scope=InstrumentationScope(
                    name=draw(text), version=draw(text), attributes=draw(attributes)
                ),
                spans=draw(st.lists(spans(), max_size=4)),
            )
            if len(ss.spans) > 1 and draw(st.booleans()):
                _share_keys(ss.spans, draw)
            rs.scope_spans.append(ss)
        request.resource_spans.append(rs)
    return request


def _share_keys(spans: list[Span], draw: st.DrawFn) -> None:
    """Give spans the first one's attribute keys, as one instrumentation's spans have (the C
    decoder skips the repeated-key check for a row with the previous row's keys), sometimes
    with a key repeated."""
    keys = [kv.key for kv in spans[0].attributes]
    for span in spans[1:]:
        del span.attributes[:]
        for key in keys + draw(st.lists(st.sampled_from(keys or ["k"]), max_size=1)):
            span.attributes.add(key=key).value.CopyFrom(draw(scalar_values))


limits = _mostly(
    st.one_of(
        st.just(Limits()),
        st.builds(Limits, max_attributes=st.integers(3, 8), max_attribute_value=st.integers(8, 60)),
    ),
    st.builds(Limits, max_attributes=st.integers(0, 6), max_attribute_value=st.integers(0, 24)),
)

# -- the wire format, re-encoded ------------------------------------------------------------------


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def fields(data: bytes) -> list[tuple[int, int, bytes | int]]:
    """A valid message's fields as (number, wire type, payload) in wire order (no groups)."""
    out: list[tuple[int, int, bytes | int]] = []
    pos = 0
    while pos < len(data):
        tag, pos = _read_varint(data, pos)
        number, wt = tag >> 3, tag & 7
        if wt == 0:
            value, pos = _read_varint(data, pos)
            out.append((number, wt, value))
        elif wt == 1:
            out.append((number, wt, data[pos : pos + 8]))
            pos += 8
        elif wt == 5:
            out.append((number, wt, data[pos : pos + 4]))
            pos += 4
        elif wt == 2:
            size, pos = _read_varint(data, pos)
            out.append((number, wt, data[pos : pos + size]))
            pos += size
        else:
            raise ValueError(f"unexpected wire type {wt}")
    return out


def _unknown(rng: random.Random, depth: int = 0) -> bytes:
    number = rng.choice([17, 99, 1000, 536870911])
    kind = rng.randrange(5 if depth < 2 else 4)
    if kind == 0:
        return varint(number << 3) + varint(rng.getrandbits(64))
    if kind == 1:
        return varint(number << 3 | 1) + rng.randbytes(8)
    if kind == 2:
        return varint(number << 3 | 5) + rng.randbytes(4)
    if kind == 3:
        payload = rng.randbytes(rng.randrange(6))  # not UTF-8 checked: unknown
        return varint(number << 3 | 2) + varint(len(payload)) + payload
    inner = b"".join(_unknown(rng, depth + 1) for _ in range(rng.randrange(3)))
    return varint(number << 3 | 3) + inner + varint(number << 3 | 4)


def _decoy(fd: FieldDescriptor, rng: random.Random) -> bytes:
    """An earlier value of a scalar field, which the real one after it must override."""
    number = fd.number
    if fd.type in (FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_DOUBLE):
        return varint(number << 3 | 1) + rng.randbytes(8)
    if fd.type == FieldDescriptor.TYPE_FIXED32:
        return varint(number << 3 | 5) + rng.randbytes(4)
    if fd.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
        return varint(number << 3 | 2) + varint(3) + b"abc"
    return varint(number << 3) + varint(rng.getrandbits(40))


def _wrong_wire_type(number: int, wt: int, rng: random.Random) -> bytes:
    """A known field number with a wire type it does not have: an unknown field to a parser."""
    other = rng.choice([w for w in (0, 1, 2, 5) if w != wt])
    return {
        0: varint(number << 3) + varint(7),
        1: varint(number << 3 | 1) + bytes(8),
        2: varint(number << 3 | 2) + varint(2) + b"\xff\xfe",
        5: varint(number << 3 | 5) + bytes(4),
    }[other]


def reencode(data: bytes, descriptor: Descriptor, rng: random.Random) -> bytes:
    """The same message, written another valid way (a protobuf parser reads the same values)."""
    return b"".join(_reencode(data, descriptor, rng))


def _reencode(data: bytes, descriptor: Descriptor, rng: random.Random) -> list[bytes]:
    parts: list[bytes] = []
    for number, wt, payload in fields(data):
        fd = descriptor.fields_by_number.get(number)
        if wt == 2:
            assert isinstance(payload, bytes)
            if fd is not None and fd.type == FieldDescriptor.TYPE_MESSAGE:
                sub = _reencode(payload, fd.message_type, rng)
                if not fd.is_repeated and len(sub) > 1 and rng.random() < 0.3:
                    # A singular message in two occurrences: the parser merges them.
                    cut = rng.randrange(1, len(sub))
                    first = b"".join(sub[:cut])
                    parts.append(varint(number << 3 | 2) + varint(len(first)) + first)
                    sub = sub[cut:]
                payload = b"".join(sub)
            size = varint(len(payload))
            if rng.random() < 0.1 and len(size) < 5:
                size = bytes(b | 0x80 for b in size) + b"\x00"  # one byte longer, same value
            body = size + payload
        elif wt == 0:
            assert isinstance(payload, int)
            body = varint(payload)
        else:
            assert isinstance(payload, bytes)
            body = payload
        field = varint(number << 3 | wt) + body
        scalar = fd is not None and not fd.is_repeated and fd.type != FieldDescriptor.TYPE_MESSAGE
        if scalar and rng.random() < 0.2:
            field = _decoy(fd, rng) + field
        parts.append(field)
    if rng.random() < 0.5:
        # Any order is valid; for repeated fields and oneofs it changes the message, which is
        # fine: both decoders read the same bytes.
        rng.shuffle(parts)
    for _ in range(rng.randrange(3) if rng.random() < 0.4 else 0):
        parts.insert(rng.randrange(len(parts) + 1), _unknown(rng))
    if descriptor.fields and rng.random() < 0.15:
        fd = rng.choice(descriptor.fields)
        wire = 2 if fd.type in _LENGTH_DELIMITED else _FIXED.get(fd.type, 0)
        parts.insert(rng.randrange(len(parts) + 1), _wrong_wire_type(fd.number, wire, rng))
    return parts


_FIXED = {
    FieldDescriptor.TYPE_FIXED64: 1,
    FieldDescriptor.TYPE_DOUBLE: 1,
    FieldDescriptor.TYPE_FIXED32: 5,
}
_LENGTH_DELIMITED = (
    FieldDescriptor.TYPE_MESSAGE,
    FieldDescriptor.TYPE_STRING,
    FieldDescriptor.TYPE_BYTES,
)


def mutate(data: bytes, rng: random.Random, edits: int) -> bytes:
    """Random damage: bytes changed, inserted or removed, or the end cut off."""
    buf = bytearray(data)
    for _ in range(edits):
        what = rng.randrange(4)
        if what == 0 and buf:
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        elif what == 1:
            buf.insert(rng.randrange(len(buf) + 1), rng.randrange(256))
        elif what == 2 and buf:
            del buf[rng.randrange(len(buf))]
        elif buf:
            del buf[rng.randrange(len(buf)) :]
    return bytes(buf)


__all__ = ["exports", "fields", "limits", "mutate", "reencode", "spans", "values", "varint"]
