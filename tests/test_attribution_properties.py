"""Property tests: for random span layouts the buckets are >= 0, sum to e2e, and the batch engine
agrees with the per-request engine row for row."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from latscope.attribution.batch import attribute_records
from latscope.attribution.engine import attribute_trace
from latscope.semconv import Phase, SpanKind, VllmAttributes
from tests.attribution_support import TraceBuilder, assert_rows_equal, oracle_row

SKEW = 10_000_000_000  # ±10 s
times = st.integers(min_value=0, max_value=2_000_000_000)


@st.composite
def traces(draw: st.DrawFn) -> list:
    tb = TraceBuilder()
    skew = draw(st.sampled_from([0, 0, draw(st.integers(-SKEW, SKEW))]))
    parent = ""
    if draw(st.booleans()):
        cs = draw(times)
        parent = tb.client(cs, cs + draw(times), ns=True)
    for _ in range(draw(st.integers(0, 3))):  # attempts (0: a trace with no server span)
        ss = draw(times) + skew
        se = ss + draw(times)
        vllm = draw(st.booleans()) and draw(st.booleans())
        attrs = {}
        if vllm:
            attrs = {
                VllmAttributes.TIME_IN_QUEUE: draw(st.floats(0, 1, allow_nan=False)),
                VllmAttributes.TIME_TO_FIRST_TOKEN: draw(st.floats(0, 2, allow_nan=False)),
                VllmAttributes.TIME_IN_MODEL_DECODE: draw(st.floats(0, 2, allow_nan=False)),
                "gen_ai.usage.completion_tokens": draw(st.integers(0, 500)),
            }
        server = tb.server(
            ss,
            se,
            parent=parent,
            ns=True,
            attrs=attrs,
            status=draw(st.sampled_from(["Ok", "Error"])),
        )
        holder = server
        if draw(st.booleans()):  # phases one level further down
            holder = tb.add(SpanKind.INTERNAL, ss, se, parent=server, ns=True)
        for _ in range(0 if vllm else draw(st.integers(0, 6))):
            ps = ss + draw(st.integers(-100_000_000, 2_000_000_000))
            pe = ps + draw(st.integers(0, 1_000_000_000))
            name = draw(st.sampled_from(Phase.ALL))
            attrs = {}
            if name == Phase.DECODE and draw(st.booleans()):
                offs = sorted(draw(st.lists(st.integers(0, 900_000), min_size=1, max_size=30)))
                attrs["latscope.token_offsets_us"] = "[" + ",".join(map(str, offs)) + "]"
            if name in (Phase.PREFILL, Phase.DECODE) and draw(st.booleans()):
                attrs["latscope.gpu.energy_mj"] = draw(st.integers(0, 10_000))
            tb.phase(
                name, ps, pe, parent=draw(st.sampled_from([server, holder])), ns=True, attrs=attrs
            )
    if draw(st.booleans()):  # an unrelated span
        tb.add(SpanKind.INTERNAL, draw(times), draw(times) + 2_000_000_000, ns=True)
    return tb.spans


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces())
def test_buckets_are_non_negative_and_sum_to_e2e(spans: list) -> None:
    a = attribute_trace("t", spans)
    if a is None:
        assert not any(s.kind == SpanKind.SERVER for s in spans)
        return
    values = [v for v in a.buckets_ns.values() if v is not None]
    assert all(v >= 0 for v in values), a.buckets_ns
    assert sum(values) == a.e2e_ns
    assert (a.buckets_ns["network"] is None) == (not a.has_client)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(traces(), min_size=1, max_size=8))
def test_batch_engine_agrees_with_the_per_request_engine(batch: list) -> None:
    records = {f"{i:032x}": spans for i, spans in enumerate(batch)}
    frame = attribute_records(records)
    got = {row["TraceId"]: row for row in frame.iter_rows(named=True)}
    want = {}
    for trace_id, spans in records.items():
        a = attribute_trace(trace_id, spans)
        if a is not None:
            want[trace_id] = oracle_row(a, len(spans))
    assert got.keys() == want.keys()
    for trace_id, row in want.items():
        assert_rows_equal(row, got[trace_id])
        total = sum(
            got[trace_id][c] or 0
            for c in (
                "NetworkNs",
                "QueueNs",
                "PreprocessNs",
                "PrefillNs",
                "DecodeNs",
                "PostprocessNs",
                "OtherNs",
            )
        )
        assert total == got[trace_id]["E2eNs"]
