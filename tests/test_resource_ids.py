"""Resources by id (deploy/clickhouse/012_resource_ids.sql): the collector stores each span's
resource id and each resource once; the attributor's single-call path carries the ids and looks
the attributes up, and reads them from the spans wherever an id or its row is missing."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from latscope.attribution.attributor import Attributor
from latscope.attribution.engine import attribute_requests
from latscope.attribution.model import SpanRecord
from latscope.collector.mapping import RESOURCE_ID, resource_id, resource_ids, resource_rows
from latscope.semconv import ClientAttributes, Phase
from latscope.storage import RESOURCES_TABLE, SPANS_TABLE, Store
from tests.attribution_support import (
    MS,
    T0,
    TraceBuilder,
    spans_table,
    write_resources,
)
from tests.collector_harness import Collector, FlakyStore, start_collector

_MAP = pa.map_(pa.string(), pa.string())
POD = {"service.name": "llm-server", "k8s.pod.name": "llm-server-7c9d-x2", "host.name": "gpu-3"}


# -- the ids ---------------------------------------------------------------------------------


def test_each_row_gets_the_id_of_its_resource_computed_once_per_distinct_resource() -> None:
    a = [("service.name", "a"), ("host.name", "h1")]
    b = [("service.name", "a"), ("host.name", "h2")]
    # The same bytes as b's, cut into keys and values elsewhere: another resource.
    b_cut = [("service.nam", "ea"), ("host.name", "h2")]
    a_more = [*a, ("x", "")]
    entries = [a, b, a, b_cut, a_more, b, []]
    dictionary = pa.array(entries, _MAP)
    indices = [0, 1, 2, 3, 4, 5, 6, 0, 3]
    column = pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), dictionary)
    ids, found = resource_ids(column)
    assert ids.to_pylist() == [resource_id(entries[i]) for i in indices]
    assert len(set(ids.to_pylist())) == 5 and 0 not in ids.to_pylist()
    assert {k: v.as_py() for k, v in found.items()} == {
        resource_id(e): e for e in (a, b, b_cut, a_more, [])
    }
    # A plain map column, chunked, and a slice of one (offsets not at 0): the same ids.
    chunked = pa.chunked_array([dictionary.slice(0, 3), dictionary.slice(3)])
    assert resource_ids(chunked)[0].to_pylist() == [resource_id(e) for e in entries]
    assert resource_ids(dictionary.slice(2, 3))[0].to_pylist() == [
        resource_id(e) for e in entries[2:5]
    ]
    # Order matters (the attributes as rendered), and another process computes the same id.
    assert resource_id(a) != resource_id(a[::-1])
    assert resource_id([("service.name", "a"), ("host.name", "h1")]) == resource_id(a)


# -- the attributor --------------------------------------------------------------------------


def _call(resource: dict[str, str]) -> list[SpanRecord]:
    tb = TraceBuilder()
    c = tb.client(0, 400, attrs={ClientAttributes.LAST_BYTE_NS: T0 + 400 * MS})
    s = tb.server(5, 395, parent=c, resource=resource)
    tb.phase(Phase.PREFILL, 10, 20, parent=s)
    tb.phase(Phase.DECODE, 20, 330, parent=s)
    return tb.spans


class _Ran:
    """Which of the attributor's statements ran."""

    def __init__(self, store: Store, att: Attributor) -> None:
        self.store, self.att, self.names = store, att, []

    def __enter__(self) -> list[str]:
        command = self.store.command

        def spied(sql: str, *args: Any, **kwargs: Any) -> Any:
            names = {
                self.att._sql.insert: "general",
                self.att._sql.insert_simple: "single-call",
                self.att._sql.insert_simple_ids: "single-call by id",
            }
            if sql in names:
                self.names.append(names[sql])
            return command(sql, *args, **kwargs)

        self.store.command = spied  # type: ignore[method-assign]
        return self.names

    def __exit__(self, *exc: object) -> None:
        del self.store.command


def _rows(store: Store, trace_ids: list[str]) -> dict[str, tuple[dict[str, str], int, int]]:
    rows = store.query_rows(
        "SELECT TraceId, ResourceAttributes, E2eNs, DecodeNs FROM latscope_attribution FINAL "
        "WHERE TraceId IN {t:Array(String)}",
        {"t": trace_ids},
    )
    return {t: (dict(r), e2e, decode) for t, r, e2e, decode in rows}


def _want(trace_id: str, spans: list[SpanRecord]) -> tuple[dict[str, str], int, int]:
    (a,) = attribute_requests(trace_id, spans)
    return a.resource_attributes, a.e2e_ns, a.buckets_ns["decode"]


def _store(store: Store, traces: dict[str, list[SpanRecord]], *, ids: bool, rows: bool) -> None:
    table = spans_table(traces, figures=ids)
    if rows:
        write_resources(store, table)
    store.insert_arrow(SPANS_TABLE, table)


@pytest.fixture(name="attributor")
def attributor_fixture(store: Store) -> Iterator[Attributor]:
    att = Attributor(store, settle_s=0, poll_s=0.1)
    att.run_until_idle()  # what earlier tests left
    yield att


def test_a_slice_whose_spans_all_have_ids_is_attributed_by_id(
    store: Store, attributor: Attributor
) -> None:
    """Every span with an id and its resource's row: the single-call statement carries ids, and
    the rows hold each server's attributes, as the reference engine gives them."""
    other = {**POD, "k8s.pod.name": "llm-server-7c9d-y7"}
    traces = {uuid.uuid4().hex: _call(r) for r in (POD, other, POD)}
    _store(store, traces, ids=True, rows=True)
    time.sleep(0.01)
    with _Ran(store, attributor) as ran:
        assert attributor.run_until_idle() == 3
    assert ran == ["single-call by id"]
    assert _rows(store, list(traces)) == {t: _want(t, s) for t, s in traces.items()}


def test_a_resource_without_its_row_is_read_from_the_spans(
    store: Store, attributor: Attributor
) -> None:
    """An id whose row was never written (or is older than the refresh the collector keeps):
    the single-call path leaves the trace, and the general path gives it the same row."""
    missing = {**POD, "k8s.pod.name": f"pod-{uuid.uuid4().hex[:8]}"}
    stale = {**POD, "k8s.pod.name": f"pod-{uuid.uuid4().hex[:8]}"}
    found, lost, old = (uuid.uuid4().hex for _ in range(3))
    traces = {found: _call(POD), lost: _call(missing), old: _call(stale)}
    table = spans_table(traces)
    write_resources(store, spans_table({found: traces[found]}))
    # The stale resource's only row is a day old.
    store.command(
        f"INSERT INTO {RESOURCES_TABLE} (Timestamp, ResourceId, ResourceAttributes) "
        "SELECT now64(6) - INTERVAL 1 DAY, {id:UInt64}, "
        "mapFromArrays({keys:Array(String)}, {values:Array(String)})",
        {
            "id": resource_id(list(stale.items())),
            "keys": list(stale),
            "values": list(stale.values()),
        },
    )
    store.insert_arrow(SPANS_TABLE, table)
    time.sleep(0.01)
    with _Ran(store, attributor) as ran:
        assert attributor.run_until_idle() == 3
    assert ran == ["single-call by id", "general"]
    assert _rows(store, list(traces)) == {t: _want(t, s) for t, s in traces.items()}


def test_a_slice_with_a_span_without_an_id_reads_the_attributes(
    store: Store, attributor: Attributor
) -> None:
    """Spans of another writer (no id) in the slice: the single-call statement reads the
    resources' attributes for the whole batch, and answers every trace."""
    named, plain = uuid.uuid4().hex, uuid.uuid4().hex
    _store(store, {named: _call(POD)}, ids=True, rows=True)
    _store(store, {plain: _call(POD)}, ids=False, rows=False)
    time.sleep(0.01)
    with _Ran(store, attributor) as ran:
        assert attributor.run_until_idle() == 2
    assert ran == ["single-call"]
    stored = store.query_rows(
        f"SELECT TraceId, {RESOURCE_ID} FROM {SPANS_TABLE} WHERE TraceId IN {{t:Array(String)}} "
        "AND SpanKind = 'Server'",
        {"t": [named, plain]},
    )
    assert dict(stored) == {named: resource_id(list(POD.items())), plain: 0}
    assert _rows(store, [named, plain]) == {
        named: _want(named, _call(POD)),
        plain: _want(plain, _call(POD)),
    }


# -- the collector ---------------------------------------------------------------------------


def _kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def _export(resource: dict[str, str], spans: int) -> trace_service_pb2.ExportTraceServiceRequest:
    """One Export of ``spans`` spans, each in a ResourceSpans of its own (as an Export merged
    from many SDK batches holds them): one dictionary entry each, one resource."""
    req = trace_service_pb2.ExportTraceServiceRequest()
    for i in range(spans):
        rs = req.resource_spans.add()
        rs.resource.attributes.extend(_kv(k, v) for k, v in resource.items())
        span = rs.scope_spans.add().spans.add(name="op", kind=Span.SPAN_KIND_SERVER)
        span.trace_id, span.span_id = uuid.uuid4().bytes, uuid.uuid4().bytes[:8]
        span.start_time_unix_nano = T0 + i * MS
        span.end_time_unix_nano = T0 + i * MS + MS
    return req


def _send(collector: Collector, req: trace_service_pb2.ExportTraceServiceRequest) -> None:
    with grpc.insecure_channel(collector.grpc) as channel:
        trace_service_pb2_grpc.TraceServiceStub(channel).Export(req, timeout=10)
    collector.wait_stored()


def _resource_rows(store: Store, rid: int) -> list[dict[str, str]]:
    rows = store.query_rows(
        f"SELECT ResourceAttributes FROM {RESOURCES_TABLE} WHERE ResourceId = {{id:UInt64}}",
        {"id": rid},
    )
    return [dict(r) for (r,) in rows]


def _ids_of(store: Store, service: str) -> list[int]:
    rows = store.query_rows(
        f"SELECT DISTINCT {RESOURCE_ID} FROM {SPANS_TABLE} WHERE ServiceName = {{s:String}}",
        {"s": service},
    )
    return [int(r) for (r,) in rows]


def test_the_collector_stores_each_spans_resource_id_and_each_resource_once(
    store: Store, tmp_path: Path
) -> None:
    service = f"svc-{uuid.uuid4().hex[:12]}"
    resource = {"service.name": service, "k8s.pod.name": "p-1", "host.name": "h"}
    rid = resource_id(list(resource.items()))
    collector = start_collector(store, tmp_path / "spool")
    try:
        _send(collector, _export(resource, 50))
        _send(collector, _export(resource, 50))
    finally:
        collector.stop()
    assert _ids_of(store, service) == [rid]
    # Written before the first spans, not again by later batches of the same process.
    assert _resource_rows(store, rid) == [resource]


def test_a_failed_resource_write_holds_no_span_back(store: Store, tmp_path: Path) -> None:
    """The resources' row is not needed for a right answer (the attributor reads a resource
    it does not find from the spans): when writing it fails, the spans are stored all the
    same, with their ids, and the next batch writes it."""
    service = f"svc-{uuid.uuid4().hex[:12]}"
    resource = {"service.name": service, "k8s.pod.name": "p-2"}
    rid = resource_id(list(resource.items()))
    flaky = FlakyStore(store)
    real_insert = flaky.insert_arrow
    refused = []

    def insert(table: str, data: pa.Table, **kwargs: Any) -> None:
        if table == RESOURCES_TABLE and not refused:
            refused.append(data.num_rows)
            from latscope.storage import StoreError

            raise StoreError("refused for the test")
        real_insert(table, data, **kwargs)

    flaky.insert_arrow = insert  # type: ignore[method-assign]
    collector = start_collector(flaky, tmp_path / "spool")
    try:
        _send(collector, _export(resource, 10))
        assert refused == [1]
        assert _ids_of(store, service) == [rid]
        assert _resource_rows(store, rid) == []
        _send(collector, _export(resource, 10))
    finally:
        collector.stop()
    assert _resource_rows(store, rid) == [resource]
    assert store.query_rows(
        f"SELECT count() FROM {SPANS_TABLE} WHERE ServiceName = {{s:String}}", {"s": service}
    ) == [(20,)]


def test_a_cluster_nodes_attributor_looks_resources_up_in_its_own_copy(store: Store) -> None:
    """--attributor-tables local: the node's latscope_resources_local (every node holds the
    whole table, deploy/clickhouse/cluster), not the Distributed table."""
    for table in (SPANS_TABLE, "latscope_attribution", RESOURCES_TABLE):
        store.command(f"CREATE TABLE IF NOT EXISTS {table}_local AS {table}")
    att = Attributor(store, settle_s=0, tables="local", step_s=3600)
    assert f"FROM {RESOURCES_TABLE}_local\n" in att._sql.insert_simple_ids
    att.run_until_idle()  # what earlier tests left
    resource = {**POD, "k8s.pod.name": f"pod-{uuid.uuid4().hex[:8]}"}
    trace_id = uuid.uuid4().hex
    table = spans_table({trace_id: _call(resource)})
    _, found = resource_ids(table.column("ResourceAttributes"))
    store.insert_arrow(f"{RESOURCES_TABLE}_local", resource_rows(found))
    store.insert_arrow(f"{SPANS_TABLE}_local", table)
    time.sleep(0.01)
    with _Ran(store, att) as ran:
        assert att.run_until_idle() == 1
    assert ran == ["single-call by id"]
    [(got,)] = store.query_rows(
        "SELECT ResourceAttributes FROM latscope_attribution_local WHERE TraceId = {t:String}",
        {"t": trace_id},
    )
    assert dict(got) == resource
