"""A trace as its answers read it (``load_trace``: ``queries.TRACE_SPANS_SHOWN``): each attribute
value of more than ``ATTRIBUTE_CHARS`` characters cut, saying its length, but the values the rules
read, so that a trace of spans carrying prompts is read small and attributed as stored."""

from __future__ import annotations

import dataclasses
import random
import uuid
from contextlib import closing

import pytest

from latscope.attribution import RequestAttribution, attribute_requests, load_trace
from latscope.attribution.queries import (
    ATTRIBUTE_CHARS,
    TRACE_SPANS,
    TRACE_SPANS_READ_BY_RULES,
    TRACE_SPANS_SHOWN,
)
from latscope.attribution.spans import span_records as stored_records
from latscope.attribution.sql import rule_keys
from latscope.storage import SPANS_TABLE, Store, StoreResultTooLarge
from tests.attribution_support import calls_run, span_rows, store_traces
from tests.shapes_support import shapes_by_rulebook
from tests.upstream_traces import span_records


def _shown(value: str) -> str:
    if len(value) <= ATTRIBUTE_CHARS:
        return value
    return f"{value[:ATTRIBUTE_CHARS]}...[{len(value)} characters]"


def _resource(a: RequestAttribution) -> dict[str, str]:
    return {k: _shown(v) for k, v in a.resource_attributes.items()}


def _long(spans: list, keys: set[str]) -> list:
    """The spans with every attribute value the rules do not read made long (a prompt of 5,000
    two-byte characters added, each other value 3,000 characters longer), a value of
    ``ATTRIBUTE_CHARS`` two-byte characters (twice as many bytes: whole), and a long resource
    attribute."""
    out = []
    for s in spans:
        attributes = {k: v if k in keys else v + "p" * 3000 for k, v in s.attributes.items()}
        attributes["gen_ai.prompt"] = "é" * 5000
        attributes["gen_ai.system_instructions"] = "ü" * ATTRIBUTE_CHARS
        out.append(
            dataclasses.replace(s, attributes=attributes, resource={**s.resource, "x": "r" * 2000})
        )
    return out


def test_long_values_are_cut_and_every_shape_attributed_as_stored(store: Store) -> None:
    # Closed when the test ends, pass or fail: the shipped rulebook is installed again.
    with closing(shapes_by_rulebook()) as books:
        for built in books:
            keys = set(rule_keys())
            requests = cut = 0
            for records in (span_records(b.resource_spans) for b in built):
                long = {t: _long(spans, keys) for t, spans in records.items()}
                for stored in store_traces(store, long):
                    full = stored_records(store.query_rows(TRACE_SPANS, {"trace_id": stored}))
                    shown = load_trace(store, stored)
                    assert [s.span_id for s in shown] == [s.span_id for s in full]
                    for s, f in zip(shown, full, strict=True):
                        assert s.attributes.keys() == f.attributes.keys()
                        for k, v in f.attributes.items():
                            assert s.attributes[k] == (v if k in keys else _shown(v)), k
                            cut += s.attributes[k] != v
                        assert s.resource == {k: _shown(v) for k, v in f.resource.items()}
                    # The same figures; the resource as shown (above).
                    want = [
                        dataclasses.replace(a, resource_attributes=_resource(a))
                        for a in attribute_requests(stored, full)
                    ]
                    assert attribute_requests(stored, shown) == want, stored
                    requests += len(want)
            assert requests > len(built) and cut > 0


def test_the_rules_values_stay_whole_however_long(store: Store) -> None:
    [(stored, (_, spans))] = store_traces(
        store, {"t": _long(_one_span(), set(rule_keys()))}
    ).items()
    [span] = load_trace(store, stored)
    offsets = spans[0].attributes["latscope.token_offsets_us"]
    assert (
        len(offsets) > ATTRIBUTE_CHARS and span.attributes["latscope.token_offsets_us"] == offsets
    )
    assert span.attributes["gen_ai.prompt"] == "é" * ATTRIBUTE_CHARS + "...[5000 characters]"
    assert span.attributes["gen_ai.system_instructions"] == "ü" * ATTRIBUTE_CHARS


def test_values_are_cut_at_their_characters_whatever_their_bytes(store: Store) -> None:
    n = ATTRIBUTE_CHARS
    values = {
        "one": "a" * n, "one+": "a" * (n + 1),
        "two": "é" * n, "two+": "é" * (n + 1),
        "four": "😀" * n, "four+": "😀" * (n + 1),  # 4 x n bytes: whole; one more: cut
        "mixed": "😀é" * (n // 2) + "a", "mixed-": "😀é" * (n // 2),
    }  # fmt: skip
    [span] = _one_span()
    span = dataclasses.replace(span, attributes={**span.attributes, **values})
    [(stored, _)] = store_traces(store, {"t": [span]}).items()
    [shown] = load_trace(store, stored)
    assert {k: shown.attributes[k] for k in values} == {k: _shown(v) for k, v in values.items()}
    assert shown.attributes["four+"] == "😀" * n + f"...[{n + 1} characters]"
    assert sum(shown.attributes[k] == v for k, v in values.items()) == 4


def test_a_read_past_its_byte_bound_is_refused_by_the_store(store: Store) -> None:
    [(stored, _)] = store_traces(store, {"t": _long(_one_span(), set(rule_keys()))}).items()
    with pytest.raises(StoreResultTooLarge, match="TOO_MANY_ROWS_OR_BYTES"):
        load_trace(store, stored, max_bytes=1_000)
    assert len(load_trace(store, stored, max_bytes=1_000_000)) == len(load_trace(store, stored))


def _one_span() -> list:
    from latscope.attribution import SpanRecord

    offsets = "[" + ",".join(str(1000 * i) for i in range(400)) + "]"
    return [
        SpanRecord(
            span_id="00000000000000a1", parent_span_id="", name="decode", kind="Internal",
            service="s", start_ns=1_763_000_000_000_000_000, duration_ns=10**9,
            attributes={"latscope.token_offsets_us": offsets},
        )
    ]  # fmt: skip


def test_a_trace_of_long_values_is_read_streaming_under_a_small_memory_limit(
    store: Store,
) -> None:
    """Both reads of a trace (shown, and the attributor's by the rules' keys) stream the stored
    values through the cut or the filter: 75 MB of prompts are read under a 100 MiB query limit
    (with an ``ORDER BY``, ClickHouse sorted the stored maps whole: refused at 160 MiB here)."""
    trace_id = uuid.uuid4().hex
    spans = calls_run(800)
    rng = random.Random(5)
    for s in spans:
        s["attrs"] = {**s.get("attrs", {}), "gen_ai.prompt": rng.randbytes(8192).hex(),
                      "gen_ai.completion": rng.randbytes(8192).hex()}  # fmt: skip
    store.insert_arrow(SPANS_TABLE, span_rows(trace_id, spans))
    limit = "\nSETTINGS max_memory_usage = 104857600"
    params = {"trace_id": trace_id, "keys": rule_keys(), "cut": ATTRIBUTE_CHARS}
    shown = store.query_rows(TRACE_SPANS_SHOWN + limit, params)
    ruled = store.query_arrow(TRACE_SPANS_READ_BY_RULES + limit, params)
    assert len(shown) == ruled.num_rows == len(spans) == 2_401
    # In start order, as an ORDER BY gave them.
    starts = [s.start_ns for s in stored_records(shown)]
    assert starts == sorted(s["start"] for s in spans)
