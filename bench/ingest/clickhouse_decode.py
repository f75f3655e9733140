"""Probe: how fast ClickHouse itself decodes OTLP Exports and maps spans (no Python per span).

    .venv/bin/python -m bench.ingest.clickhouse_decode [--exports 100]

Writes length-delimited Exports to a file and runs, in the embedded ClickHouse on one thread,
the Protobuf decode (schema: otlp_projection.proto) plus the spans-table mapping of the ids,
times and attributes in SQL, against the Python hot path (decode + ``SpanColumns``) on the same
Exports. Not the collector: oneof presence, double formatting, arrays, events and links are
not handled here; it measures whether moving the mapping into ClickHouse would reach the target.
"""

from __future__ import annotations

import argparse
import random
import resource
import shutil
import tempfile
from pathlib import Path

import chdb
from google.protobuf.internal.encoder import _VarintBytes
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bench.ingest.traces import make_batch
from latscope.collector.mapping import SpanColumns

T0 = 1_763_000_000_000_000_000
_V = "Tuple(string_value String, bool_value Bool, int_value Int64, double_value Float64)"
STRUCTURE = (
    f"resource_spans Array(Tuple(resource Tuple(attributes Array(Tuple(key String, value {_V}))),"
    " scope_spans Array(Tuple(scope Tuple(name String, version String), spans Array(Tuple("
    "trace_id String, span_id String, parent_span_id String, name String, kind Int32,"
    f" start_time_unix_nano UInt64, end_time_unix_nano UInt64,"
    f" attributes Array(Tuple(key String, value {_V}))))))))"
)
QUERY = """
SELECT count(), sum(length(attrs)) FROM (
  SELECT lower(hex(sp.trace_id)) AS tid, lower(hex(sp.span_id)) AS sid,
         lower(hex(sp.parent_span_id)) AS pid, sp.name AS name,
         toDateTime64(sp.start_time_unix_nano / 1e9, 9) AS ts,
         sp.end_time_unix_nano - sp.start_time_unix_nano AS dur,
         mapFromArrays(
           arrayMap(kv -> kv.key, sp.attributes),
           arrayMap(kv -> if(kv.value.string_value != '', kv.value.string_value,
                          if(kv.value.double_value != 0, toString(kv.value.double_value),
                          if(kv.value.int_value != 0, toString(kv.value.int_value),
                          if(kv.value.bool_value, 'true', '')))), sp.attributes)) AS attrs
  FROM (SELECT arrayJoin(arrayFlatten(arrayMap(rs -> arrayMap(ss -> ss.spans, rs.scope_spans),
                                                 resource_spans))) AS sp
        FROM file('{path}', 'Protobuf', '{structure}')))
SETTINGS format_schema = '{schema}:ExportTraceServiceRequest', max_threads = 1
"""


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--exports", type=int, default=100)
    parser.add_argument("--requests", type=int, default=64)
    args = parser.parse_args()
    rng = random.Random(1)
    payloads = [
        make_batch(rng, T0 + i * 10**9, args.requests).SerializeToString()
        for i in range(args.exports)
    ]
    spans = args.exports * args.requests * 7
    workdir = Path(tempfile.mkdtemp(prefix="latscope-chdecode-"))
    try:
        data = workdir / "exports.bin"
        with data.open("wb") as f:
            for payload in payloads:
                f.write(_VarintBytes(len(payload)) + payload)
        schema = workdir / "otlp_projection.proto"
        shutil.copy(Path(__file__).with_name("otlp_projection.proto"), schema)
        sql = QUERY.format(path=data, structure=STRUCTURE, schema=schema)
        best_ch = best_py = float("inf")
        for _ in range(3):
            cpu0 = _cpu()
            result = str(chdb.query(sql, "TSV")).split()
            best_ch = min(best_ch, _cpu() - cpu0)
            assert int(result[0]) == spans, result
            cpu0 = _cpu()
            for payload in payloads:
                cols = SpanColumns()
                cols.add(ExportTraceServiceRequest.FromString(payload).resource_spans)
                cols.table()
            best_py = min(best_py, _cpu() - cpu0)
        print(f"{spans} spans, best of 3, one thread")
        print(f"ClickHouse decode + map : {spans / best_ch:>10,.0f} spans/CPU-s")
        print(f"Python decode + map     : {spans / best_py:>10,.0f} spans/CPU-s")
        print(f"ratio                   : {best_py / best_ch:.1f}x")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
