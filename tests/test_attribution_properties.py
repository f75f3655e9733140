"""Property tests: for random multi-call traces the buckets are >= 0 and sum to e2e, and the SQL
attributor writes exactly the reference engine's rows; every call of random agent traces counts
once in the aggregates after the attributor ran, also when a late span re-attributes it."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from latscope.attribution import aggregates as ag
from latscope.attribution.attributor import Attributor
from latscope.attribution.engine import attribute_requests
from latscope.attribution.model import SpanRecord
from latscope.attribution.spans import normalized
from latscope.semconv import (
    ClientAttributes,
    GenAIAttributes,
    LatscopeAttributes,
    Phase,
    SpanKind,
    StatusCode,
    VllmAttributes,
)
from latscope.storage import SPANS_TABLE, Store
from tests.agent_traces import agent_run
from tests.attribution_support import T0, TraceBuilder, spans_table, sql_check
from tests.conftest import embedded_store
from tests.upstream_traces import span_records

SKEW = 10_000_000_000  # ±10 s
times = st.integers(min_value=0, max_value=2_000_000_000)
LEGACY_KIND = {v: k for k, v in SpanKind.LEGACY.items()}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return embedded_store(tmp_path_factory)


def _server(draw: st.DrawFn, tb: TraceBuilder, parent: str, skew: int, service: str) -> None:
    """One attempt: a SERVER span with phases (maybe under helper spans), or vLLM / SGLang."""
    ss = draw(times) + skew
    se = ss + draw(times)
    shape = draw(st.sampled_from(["phases", "phases", "vllm", "vllm-old", "sglang"]))
    attrs: dict = {}
    if shape in ("vllm", "vllm-old", "sglang"):
        attrs = {
            VllmAttributes.TIME_TO_FIRST_TOKEN: draw(st.floats(0, 2, allow_nan=False)),
            VllmAttributes.E2E: draw(st.floats(0, 2, allow_nan=False)),
            GenAIAttributes.USAGE_COMPLETION_TOKENS: draw(st.integers(0, 500)),
        }
        if shape == "vllm":
            attrs[VllmAttributes.TIME_IN_QUEUE] = draw(st.floats(0, 1, allow_nan=False))
            attrs[VllmAttributes.TIME_IN_MODEL_DECODE] = draw(st.floats(0, 2, allow_nan=False))
            attrs[VllmAttributes.TIME_IN_MODEL_PREFILL] = draw(st.floats(0, 1, allow_nan=False))
        if shape == "vllm-old":
            attrs[VllmAttributes.TIME_IN_QUEUE] = draw(st.floats(0, 1, allow_nan=False))
    kind = SpanKind.INTERNAL if shape == "sglang" else SpanKind.SERVER
    if draw(st.booleans()):
        attrs[GenAIAttributes.REQUEST_MODEL] = draw(st.sampled_from(["m1", "m2", ""]))
    server = tb.add(
        kind,
        ss,
        se,
        parent=parent,
        ns=True,
        service=service,
        attrs=attrs,
        status=draw(st.sampled_from(["Ok", "Error", "STATUS_CODE_ERROR"])),
    )
    if shape == "sglang":
        thread = tb.add(SpanKind.INTERNAL, ss, se, parent=server, ns=True, service=service)
        for name in draw(st.lists(st.sampled_from(["tokenize", "prefill_waiting",
                                                   "prefill_forward", "decode_loop",
                                                   "request_process"]), max_size=4)):  # fmt: skip
            ps = ss + draw(st.integers(-100_000_000, 2_000_000_000))
            tb.add(SpanKind.INTERNAL, ps, ps + draw(times), parent=thread, ns=True,
                   service=service, name=name)  # fmt: skip
        return
    if shape != "phases":
        return
    holder = server
    if draw(st.booleans()):  # phases one level further down
        holder = tb.add(SpanKind.INTERNAL, ss, se, parent=server, ns=True, service=service)
    for _ in range(draw(st.integers(0, 6))):
        ps = ss + draw(st.integers(-100_000_000, 2_000_000_000))
        pe = ps + draw(st.integers(0, 1_000_000_000))
        name = draw(st.sampled_from(Phase.ALL))
        pattrs: dict = {}
        if name == Phase.DECODE and draw(st.booleans()):
            offs = sorted(draw(st.lists(st.integers(0, 900_000), min_size=1, max_size=30)))
            pattrs[LatscopeAttributes.TOKEN_OFFSETS_US] = str(offs).replace(" ", "")
        if name in (Phase.PREFILL, Phase.DECODE) and draw(st.booleans()):
            pattrs[LatscopeAttributes.GPU_ENERGY_MJ] = draw(st.integers(0, 10_000))
        tb.phase(name, ps, pe, parent=draw(st.sampled_from([server, holder])), ns=True,
                 attrs=pattrs, service=service)  # fmt: skip


@st.composite
def traces(draw: st.DrawFn) -> list[SpanRecord]:
    """A trace holding up to four calls: in sequence or overlapping, each with or without a
    client span (latscope's, or a headers-only one), retries or parallel samples, clock skew,
    sometimes behind a gateway, plus unrelated spans and older exporters' kind spellings."""
    tb = TraceBuilder()
    root = tb.add(SpanKind.SERVER, 0, 3_000_000_000, ns=True, service="agent")
    for n in range(draw(st.integers(0, 4))):
        skew = draw(st.sampled_from([0, 0, draw(st.integers(-SKEW, SKEW))]))
        service = f"model-{n % 2}"
        parent = root if draw(st.booleans()) else ""
        if draw(st.booleans()):  # a gateway hop first
            gs = draw(times)
            gc = tb.add(SpanKind.CLIENT, gs, gs + draw(times), parent=parent, ns=True,
                        service="agent")  # fmt: skip
            parent = tb.add(SpanKind.SERVER, gs, gs + draw(times), parent=gc, ns=True,
                            service="gateway")  # fmt: skip
        if draw(st.booleans()):
            cs = draw(times)
            cattrs = {}
            if draw(st.booleans()):  # latscope's client: it read the whole response
                cattrs[ClientAttributes.LAST_BYTE_NS] = T0 + cs
            if draw(st.booleans()):
                cattrs[LatscopeAttributes.FIRST_TOKEN_NS] = T0 + cs + draw(times)
            if draw(st.booleans()):
                cattrs[GenAIAttributes.USAGE_INPUT_TOKENS] = draw(st.sampled_from(["12", "x", ""]))
            parent = tb.add(SpanKind.CLIENT, cs, cs + draw(times), parent=parent, ns=True,
                            service="agent", attrs=cattrs)  # fmt: skip
        for _ in range(draw(st.integers(1, 3))):  # attempts: retries or parallel samples
            _server(draw, tb, parent, skew, service)
    if draw(st.booleans()):  # an unrelated span
        tb.add(SpanKind.INTERNAL, draw(times), draw(times) + 3_000_000_000, parent=root, ns=True)
    spans = tb.spans
    if draw(st.booleans()):  # as an older exporter stored them
        from dataclasses import replace

        spans = [
            replace(s, kind=LEGACY_KIND.get(s.kind, s.kind),
                    status={v: k for k, v in StatusCode.LEGACY.items()}.get(s.status, s.status))
            for s in spans
        ]  # fmt: skip
    return spans


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces())
def test_buckets_are_non_negative_and_sum_to_e2e(spans: list[SpanRecord]) -> None:
    for a in attribute_requests("t", normalized(spans)):
        values = [v for v in a.buckets_ns.values() if v is not None]
        assert all(v >= 0 for v in values), a.buckets_ns
        assert sum(values) == a.e2e_ns
        assert (a.buckets_ns["network"] is None) == (not a.has_client)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(traces(), min_size=1, max_size=12))
def test_sql_attributor_agrees_with_the_reference(store: Store, batch: list) -> None:
    """Each example is one statement over several traces (the attributor's batches)."""
    traces_ = {f"t{i}": normalized(spans) for i, spans in enumerate(batch)}
    # The store holds the spans as written (legacy spellings included); the reference reads
    # them as load_trace does.
    sql_check(store, {f"t{i}": spans for i, spans in enumerate(batch)}, reference=traces_)


def test_every_call_of_agent_runs_counts_once_in_the_aggregates(store: Store) -> None:
    """Random agent traces through the attributor: each call is one row, and the summaries of
    their services count each call once, also after the attributor went over them again."""
    from dataclasses import replace

    prefix = uuid.uuid4().hex[:8]
    records: dict[str, list[SpanRecord]] = {}
    want: set[tuple[str, str]] = set()
    for seed in range(8):
        run = agent_run(seed, parallel=True, gateways=True, retries=True, skew=True)
        for trace_id, spans in span_records(run.built.resource_spans).items():
            records[prefix + trace_id[8:]] = [
                replace(s, service=f"{prefix}-{s.service}") for s in spans
            ]
        want |= {(prefix + t.trace_id[8:], t.request_id.split("-")[1]) for t in run.requests}
    store.insert_arrow(SPANS_TABLE, spans_table(records))
    attributor = Attributor(store, settle_s=0)
    services = {s.service for spans in records.values() for s in spans}
    for _ in range(2):
        attributor.watermark_us = 0
        attributor.run_until_idle()
        rows = store.query_rows(
            "SELECT TraceId, RequestSpanId FROM latscope_attribution FINAL "
            "WHERE startsWith(TraceId, {p:String})",
            {"p": prefix},
        )
        assert sorted(rows) == sorted(want)
        counted = sum(
            ag.summary(store, since_ns=0, until_ns=2**62, service=service)["count"]
            for service in services
        )
        assert counted == len(want)
