"""Random and mutated Export payloads never crash the collector (gRPC and HTTP), and the C
decoder agrees with the Python mapping (the reference) on every Export, valid or not."""

from __future__ import annotations

import random
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bench.ingest.traces import make_batch
from latscope.collector import mapping
from latscope.collector.mapping import (
    Limits,
    MalformedExport,
    decode_spans,
    expanded_bytes,
    format_double,
    table_from_array,
)
from latscope.storage import Store
from tests.collector_exports import exports, limits, mutate, reencode, varint
from tests.collector_harness import Collector, start_collector, store_fixture  # noqa: F401
from tests.hypothesis_support import examples

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
VALID = make_batch(random.Random(7), 1_763_000_000_000_000_000, 2).SerializeToString()


@pytest.fixture(scope="module")
def fuzz_collector(
    store: Store, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Collector, grpc.Channel, httpx.Client]]:
    c = start_collector(store, tmp_path_factory.mktemp("fuzz") / "spool")
    channel = grpc.insecure_channel(c.grpc)
    client = httpx.Client(base_url=c.http, timeout=10)
    try:
        yield c, channel, client
    finally:
        client.close()
        channel.close()
        c.stop()


def _mutate(data: bytes, edits: list[tuple[int, int]], cut: int) -> bytes:
    buf = bytearray(data)
    for pos, value in edits:
        buf[pos % len(buf)] = value
    return bytes(buf[: max(0, len(buf) - cut)])


payloads = st.one_of(
    st.binary(max_size=512),
    st.builds(
        _mutate,
        st.just(VALID),
        st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=8),
        st.integers(0, 64),
    ),
)


@pytest.mark.subprocess
@settings(max_examples=examples(60))
@given(payload=payloads)
def test_fuzzed_exports_get_an_answer_and_never_crash(
    fuzz_collector: tuple[Collector, grpc.Channel, httpx.Client], payload: bytes
) -> None:
    _c, channel, client = fuzz_collector
    call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
    try:
        call(payload, timeout=10)
    except grpc.RpcError as exc:
        # A payload that is not an Export is refused; the server itself never fails.
        assert exc.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT), exc
        assert "Exception calling application" not in (exc.details() or "")
    response = client.post(
        "/v1/traces", content=payload, headers={"content-type": "application/x-protobuf"}
    )
    assert response.status_code in (200, 400), response.text
    json_response = client.post(
        "/v1/traces", content=payload, headers={"content-type": "application/json"}
    )
    assert json_response.status_code in (200, 400), json_response.text
    assert client.get("/healthz").status_code == 200


# -- the C decoder against the Python mapping ---------------------------------------------------

native = pytest.mark.skipif(not mapping.NATIVE, reason="the C decoder is not built here")
REALISTIC = [
    make_batch(random.Random(seed), 1_763_000_000_000_000_000, 3).SerializeToString()
    for seed in range(4)
]


def _decode(data: bytes, limits: Limits, native: bool) -> tuple | str:
    try:
        d = decode_spans(data, limits, native=native)
    except MalformedExport:
        return "malformed"
    if native:
        d.table.validate(full=True)  # offsets, UTF-8, lengths: what Arrow and ClickHouse assume
        # Counted while decoding, it must be what the table's own count gives: a segment in
        # memory and the same segment replayed from the spool are sliced (and tokened) alike.
        assert d.expanded == expanded_bytes(d.table), (d.expanded, expanded_bytes(d.table))
    return d.rows, d.rejected, d.first_problem, d.table


def assert_same(data: bytes, limits: Limits) -> None:
    """The C decoder and the reference accept the same bytes and produce the same answer."""
    _assert_equal(_decode(data, limits, True), _decode(data, limits, False), data)


def _assert_equal(got: tuple | str, want: tuple | str, data: bytes) -> None:
    """Two of ``_decode``'s answers about ``data`` are the same: refusal, counts, table."""
    if isinstance(got, str) or isinstance(want, str):
        assert got == want, (got if isinstance(got, str) else "decoded", want, data)
        return
    assert got[:3] == want[:3], data
    table_got, table_want = got[3], want[3]
    assert isinstance(table_got, pa.Table) and isinstance(table_want, pa.Table)
    for name in table_want.column_names:
        assert table_got[name].equals(table_want[name]), (
            name, table_got[name].to_pylist(), table_want[name].to_pylist()
        )  # fmt: skip
    assert table_got.schema == table_want.schema


@pytest.mark.slow
@native
@settings(max_examples=examples(400), suppress_health_check=list(HealthCheck))
@given(
    request=exports(),
    limits=limits,
    seed=st.integers(0, 2**32 - 1),
    how=st.sampled_from(["as protobuf writes it", "re-encoded", "re-encoded and damaged"]),
)
def test_c_decoder_matches_the_python_mapping(
    request: ExportTraceServiceRequest, limits: Limits, seed: int, how: str
) -> None:
    # Every value type, events, links, unicode, invalid spans, repeated keys; re-encoded with
    # shuffled field order, unknown fields and groups, merged messages, repeated scalars and
    # wrong wire types; damaged with changed, inserted and cut bytes.
    rng = random.Random(seed)
    data = request.SerializeToString()
    if how != "as protobuf writes it":
        data = reencode(data, ExportTraceServiceRequest.DESCRIPTOR, rng)
    if how == "re-encoded and damaged":
        data = mutate(data, rng, rng.randrange(1, 4))
    assert_same(data, limits)


@native
@settings(max_examples=examples(300), suppress_health_check=list(HealthCheck))
@given(
    data=st.one_of(
        st.binary(max_size=300),
        st.builds(
            lambda i, seed, edits: mutate(REALISTIC[i], random.Random(seed), edits),
            st.integers(0, len(REALISTIC) - 1),
            st.integers(0, 2**32 - 1),
            st.integers(1, 8),
        ),
    )
)
def test_c_decoder_survives_random_and_damaged_bytes(data: bytes) -> None:
    assert_same(data, Limits())


@native
@settings(max_examples=examples(40), suppress_health_check=list(HealthCheck), deadline=None)
@given(batch=st.lists(exports(), min_size=4, max_size=4), limits=limits)
def test_exports_decoded_in_threads_at_once_each_decode_as_alone(
    batch: list[ExportTraceServiceRequest], limits: Limits
) -> None:
    """The C decoder runs without the GIL and takes it back for a double's repr, an array's or a
    kvlist's JSON and the first rejection's text: Exports decoded by eight threads at once, with
    no lock between them, each give what they give decoded alone."""
    data = [e.SerializeToString() for e in batch] * 6
    alone = [_decode(d, limits, True) for d in data]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda d: _decode(d, limits, True), data))
    for a, t, d in zip(alone, together, data, strict=True):
        _assert_equal(t, a, d)


def _doubles(rng: random.Random, n: int) -> list[float]:
    """Doubles of every kind: short decimals at every scale (most attribute values), values
    needing 16 or 17 digits, any 64-bit pattern (NaN and infinities among them), and the edges
    of where Python's repr writes an exponent."""
    out = [0.0, -0.0, 0.7, 0.1 + 0.2, 1e-4, 1e-5, 9999999999999998.0, 1e16, 1e21, 1e22, 1e23]
    out += [1.5e-7, 5e-324, 1.7976931348623157e308, 2.0**53, 2.675, 1 / 3, -2.5]
    while len(out) < n:
        out.append(round(rng.random(), rng.randint(0, 17)) * 10.0 ** rng.randint(-25, 20))
        out.append(rng.randint(0, 10 ** rng.randint(1, 16)) / 10 ** rng.randint(0, 22))
        out.append(struct.unpack("<d", rng.randbytes(8))[0])
        out[-3:] = [v * rng.choice((1, -1)) for v in out[-3:]]
    return out


@native
def test_every_double_is_written_as_the_reference_writes_it() -> None:
    """A double attribute's text from the C decoder is ``format_double``'s, for 30,000 doubles
    in Exports of 100 attributes a span."""
    values = _doubles(random.Random(11), 30_000)
    for i in range(0, len(values), 100):
        request = ExportTraceServiceRequest()
        span = request.resource_spans.add().scope_spans.add().spans.add(
            trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="s",
            start_time_unix_nano=1_763_000_000_000_000_000,
            end_time_unix_nano=1_763_000_000_000_000_001,
        )  # fmt: skip
        part = values[i : i + 100]
        for j, v in enumerate(part):
            span.attributes.add(key=f"k{j}").value.double_value = v
        decoded = decode_spans(request.SerializeToString(), Limits(max_attributes=128))
        got = dict(decoded.table.column("SpanAttributes")[0].as_py())
        assert [got[f"k{j}"] for j in range(len(part))] == [format_double(v) for v in part]


def _ld(field: int, payload: bytes) -> bytes:
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def _in_span(body: bytes) -> bytes:
    ids = _ld(1, b"\x01" * 16) + _ld(2, b"\x02" * 8)
    return _ld(1, _ld(2, _ld(2, ids + body)))


@native
@pytest.mark.parametrize("depth", range(44, 50))
def test_nesting_limit_is_upbs(depth: int) -> None:
    # A span attribute's value nested in arrays, around protobuf's limit of 100 levels.
    value = _ld(1, b"x")
    for _ in range(depth):
        value = _ld(5, _ld(1, value))
    assert_same(_in_span(_ld(9, _ld(1, b"k") + _ld(2, value))), Limits())
    group = b""
    for _ in range(depth * 2 + 2):
        group = varint(99 << 3 | 3) + group + varint(99 << 3 | 4)
    assert_same(_in_span(group), Limits())


@native
def test_an_export_that_expands_past_the_limit_is_malformed() -> None:
    from latscope.collector import _otlp  # type: ignore[attr-defined]

    # A shared resource attribute is held once, not copied onto each of the many small spans
    # (it used to be: 300 copies of 4 kB).
    resource = _ld(1, _ld(1, _ld(1, b"k") + _ld(2, _ld(1, b"v" * 4000))))
    span = _ld(2, _ld(1, b"\x01" * 16) + _ld(2, b"\x02" * 8))
    data = _ld(1, resource + _ld(2, span * 300))
    rows, _, _, array, address, _ = _otlp.decode_traces(data, 1024, 65536, 1 << 30)
    assert rows == 300
    assert table_from_array(array, address).get_total_buffer_size() < 4000 + 300 * 200
    # Columns past max_bytes stop the decoder: TooLarge, a MalformedExport.
    named = _ld(2, _ld(1, b"\x01" * 16) + _ld(2, b"\x02" * 8) + _ld(5, b"n" * 1000))
    big = _ld(1, _ld(2, named * 300))
    with pytest.raises(_otlp.TooLarge, match="expands to more than"):
        _otlp.decode_traces(big, 1024, 65536, 1 << 18)
    assert issubclass(_otlp.TooLarge, _otlp.MalformedExport)
