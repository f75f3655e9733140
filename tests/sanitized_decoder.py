"""Run as a script: the C decoder built with AddressSanitizer and UBSan, fed generated, re-encoded,
damaged and random Exports, each compared with the Python mapping.

    python tests/sanitized_decoder.py PATH_TO_SANITIZED_SO EXAMPLES

Run by ``test_collector_decoder.py`` under ``LD_PRELOAD`` of the sanitizer runtimes, with no
chDB imported (its loader does not run under AddressSanitizer). A memory error or undefined
behaviour aborts the process; a difference from the Python mapping fails an assertion.
"""

from __future__ import annotations

import importlib.util
import random
import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from latscope.collector import mapping
from latscope.collector.mapping import Limits, MalformedExport, decode_spans
from tests.collector_exports import exports, limits, mutate, reencode


def _load(path: str) -> None:
    spec = importlib.util.spec_from_file_location("latscope.collector._otlp", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.set_value_renderer(mapping._json_of)
    mapping._otlp = module


def _compare(data: bytes, lim: Limits, seen: dict[str, int]) -> None:
    try:
        native = decode_spans(data, lim, native=True)
    except MalformedExport:
        seen["malformed"] += 1
        return
    seen["decoded"] += 1
    # Decoded and dropped before Arrow takes the columns: the capsule releases them itself.
    assert mapping._otlp is not None
    mapping._otlp.decode_traces(data, lim.max_attributes, lim.max_attribute_value, 1 << 30)
    try:
        reference = decode_spans(data, lim, native=False)
    except MalformedExport:
        return  # upb is stricter in places the tests of the decoder itself cover
    assert (native.rows, native.rejected) == (reference.rows, reference.rejected)
    assert native.table.equals(reference.table)


def _edge_cases() -> list[bytes]:
    """Exports that once reached undefined behaviour: keys and values with no bytes at all."""
    out = []
    for attributes in ([("", ""), ("", "")], [("", ""), ("a", ""), ("", "x")], [("", "")] * 40):
        request = ExportTraceServiceRequest()
        rs = request.resource_spans.add()
        for key, value in attributes:
            rs.resource.attributes.add(key=key).value.string_value = value
        span = rs.scope_spans.add().spans.add(
            trace_id=b"\x01" * 16, span_id=b"\x02" * 8, start_time_unix_nano=1, end_time_unix_nano=2
        )
        for key, value in attributes:
            span.attributes.add(key=key).value.string_value = value
        event = span.events.add(time_unix_nano=1)
        for key, value in attributes:
            event.attributes.add(key=key).value.string_value = value
        out.append(request.SerializeToString())
    return out


def main() -> None:
    path, examples = sys.argv[1], int(sys.argv[2])
    _load(path)
    seen = {"decoded": 0, "malformed": 0}
    for data in _edge_cases():
        _compare(data, Limits(), seen)

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(exports(), st.integers(0, 2**32), limits)
    def run(export: ExportTraceServiceRequest, seed: int, lim: Limits) -> None:
        rng = random.Random(seed)
        data = export.SerializeToString()
        _compare(data, lim, seen)
        _compare(reencode(data, ExportTraceServiceRequest.DESCRIPTOR, rng), lim, seen)
        for edits in (1, 3, 10):
            _compare(mutate(data, rng, edits), lim, seen)
        _compare(rng.randbytes(rng.randrange(300)), lim, seen)

    run()
    print(seen["decoded"], seen["malformed"])


if __name__ == "__main__":
    main()
