"""Property tests: for random multi-call traces the buckets are >= 0 and sum to e2e, and the SQL
attributor writes exactly the reference engine's rows; every call of random agent traces counts
once in the aggregates after the attributor ran, also when a late span re-attributes it."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latscope.attribution import aggregates as ag
from latscope.attribution.attributor import Attributor
from latscope.attribution.engine import attribute_requests
from latscope.attribution.model import SpanRecord
from latscope.attribution.spans import normalized
from latscope.semconv import (
    ClientAttributes,
    GenAIAttributes,
    GenAIEvents,
    LatscopeAttributes,
    OpenInferenceAttributes,
    Phase,
    SpanKind,
    StatusCode,
    VllmAttributes,
)
from latscope.storage import SPANS_TABLE, Store
from latscope.tokens import DEFAULT_STALL_NS
from tests.agent_traces import agent_run
from tests.attribution_support import MS, T0, TraceBuilder, spans_table, sql_check, stalls_call
from tests.hypothesis_support import examples
from tests.upstream_traces import span_records

SKEW = 10_000_000_000  # ±10 s
#: Token offsets at the edge of the accepted form (a JSON array of integers): not lists, JSON's
#: whitespace, and what a looser pattern took for one (leading zeros, a vertical tab or form
#: feed, a final newline), which JSON refuses.
OFFSETS_EDGES = [
    "[]", "[1,x]", "[ 0 ,\n1000 ,\t2500\r]", "[-0,7]", "[007]", "[0,\x0b1000]", "[0,\x0c1000]",
    "[0,1000]\n", "[1e3]",
]  # fmt: skip
times = st.integers(min_value=0, max_value=2_000_000_000)
NUMBERS = st.sampled_from(["12", "-3", "1.5e3", "x", "", "99999999999999999999", "4.7"])
LEGACY_KIND = {v: k for k, v in SpanKind.LEGACY.items()}


#: What a SERVER span may say of itself (engine._says_inference), and what it says in vain.
SAID = st.sampled_from(
    [
        {},
        {"http.route": "/v1/chat/completions"},
        {"http.route": "/search"},
        {"http.route": "/v2/models/{model}/generate"},
        {GenAIAttributes.REQUEST_MODEL: "m3"},
        {GenAIAttributes.OPERATION_NAME: "chat"},
        {GenAIAttributes.OPERATION_NAME: "execute_tool"},
    ]
)


def _asgi_sends(draw: st.DrawFn, tb: TraceBuilder, server: str, ss: int, service: str) -> None:
    """The ASGI instrumentation's ``http send`` spans under a SERVER span: a response start
    and body messages (the last one ends the response), sometimes none."""
    for event in draw(st.lists(st.sampled_from(["http.response.start", "http.response.body",
                                                "http.request"]), max_size=3)):  # fmt: skip
        at = ss + draw(st.integers(-50_000_000, 2_500_000_000))
        key = draw(st.sampled_from(["asgi.event.type", "type"]))  # before asgi 0.43b0: type
        tb.add(SpanKind.INTERNAL, at, at + draw(st.integers(0, 1_000_000)), parent=server,
               ns=True, service=service, attrs={key: event},
               name="POST /v1/chat/completions http send")  # fmt: skip


def _sglang_slices(draw: st.DrawFn, tb: TraceBuilder, server: str, ss: int, se: int,
                   service: str, names: list[str]) -> None:  # fmt: skip
    thread = tb.add(SpanKind.INTERNAL, ss, se, parent=server, ns=True, service=service)
    for name in draw(st.lists(st.sampled_from(names), max_size=4)):
        ps = ss + draw(st.integers(-100_000_000, 2_000_000_000))
        tb.add(SpanKind.INTERNAL, ps, ps + draw(times), parent=thread, ns=True,
               service=service, name=name)  # fmt: skip


def _server(draw: st.DrawFn, tb: TraceBuilder, parent: str, skew: int, service: str) -> None:
    """One attempt: a SERVER span with phases (maybe under helper spans), vLLM / SGLang (maybe
    inside the HTTP framework's SERVER span, with its response messages), an SGLang
    prefill/decode pair with KV-cache transfer stages, or a SERVER span that says (or does not
    say) it serves a model."""
    ss = draw(times) + skew
    se = ss + draw(times)
    shape = draw(st.sampled_from(["phases", "phases", "vllm", "vllm-old", "sglang", "said", "pd"]))
    if draw(st.integers(0, 3)) == 0:  # the HTTP framework's span around it, same service
        ws = ss - draw(st.integers(0, 5_000_000))
        we = max(ws, se + draw(st.integers(-5_000_000, 900_000_000)))
        parent = tb.add(SpanKind.SERVER, ws, we, parent=parent, ns=True, service=service,
                        attrs=draw(SAID))  # fmt: skip
        _asgi_sends(draw, tb, parent, ss, service)
    if shape == "said":
        status = draw(st.sampled_from(["Ok", "Error"]))
        server = tb.add(SpanKind.SERVER, ss, se, parent=parent, ns=True, service=service,
                        attrs=draw(SAID), status=status)  # fmt: skip
        _asgi_sends(draw, tb, server, ss, service)
        return
    if shape == "pd":
        for role in ("prefill", "decode"):
            rs = ss + draw(st.integers(0, 20_000_000))
            re_ = rs + draw(times)
            attrs = {
                VllmAttributes.TIME_TO_FIRST_TOKEN: draw(st.floats(0, 2, allow_nan=False)),
                VllmAttributes.E2E: draw(st.floats(0, 2, allow_nan=False)),
                GenAIAttributes.USAGE_COMPLETION_TOKENS: draw(st.integers(0, 500)),
            }
            root = tb.add(SpanKind.INTERNAL, rs, re_, parent=parent, ns=True, service=service,
                          attrs=attrs, name=f"{role} Req 8d1f0c5e")  # fmt: skip
            _sglang_slices(draw, tb, root, rs, re_, service, [
                "tokenize", f"{role}_bootstrap", f"{role}_waiting", "prefill_forward",
                "prefill_transfer_kv_cache", "decode_transferred", "decode_forward",
            ])  # fmt: skip
        return
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
        _sglang_slices(draw, tb, server, ss, se, service, [
            "tokenize", "prefill_waiting", "prefill_forward", "decode_loop", "request_process",
        ])  # fmt: skip
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


#: What a client chain may say of streaming (engine.streamed), and how.
STREAMING = st.sampled_from(
    [
        {GenAIAttributes.REQUEST_STREAM: "true"},
        {GenAIAttributes.REQUEST_STREAM: "false"},
        {GenAIAttributes.IS_STREAMING: "False"},
        {GenAIAttributes.IS_STREAMING: "True"},
        {GenAIAttributes.IS_STREAMING: "maybe"},
        {OpenInferenceAttributes.INVOCATION_PARAMETERS: '{"model": "m", "stream": true}'},
        {OpenInferenceAttributes.INVOCATION_PARAMETERS: '{"model": "m"}'},
        {OpenInferenceAttributes.INVOCATION_PARAMETERS: '{"stream" :\ttrue}'},
    ]
)


def _genai_operation(draw: st.DrawFn, tb: TraceBuilder, cs: int, parent: str) -> str:
    """A client-side GenAI operation: openai-v2's / traceloop's CLIENT ``chat`` span or
    OpenInference's INTERNAL LLM span, with its first-chunk events, token counts and
    streaming flag; sometimes an LLM span of a framework around it."""
    if draw(st.integers(0, 4)) == 0:
        parent = tb.add(SpanKind.INTERNAL, cs - draw(st.integers(0, 3_000_000)),
                        cs + draw(times), parent=parent, ns=True, service="agent",
                        attrs={OpenInferenceAttributes.SPAN_KIND: "LLM"})  # fmt: skip
    kind = draw(st.sampled_from([SpanKind.CLIENT, SpanKind.INTERNAL]))
    attrs: dict = (
        {GenAIAttributes.OPERATION_NAME: draw(st.sampled_from(["chat", "embeddings"]))}
        if kind == SpanKind.CLIENT or draw(st.booleans())
        else {OpenInferenceAttributes.SPAN_KIND: "LLM"}
    )
    if draw(st.booleans()):
        attrs.update(draw(STREAMING))
    for key in (OpenInferenceAttributes.TOKEN_COUNT_PROMPT,
                OpenInferenceAttributes.TOKEN_COUNT_COMPLETION,
                GenAIAttributes.USAGE_OUTPUT_TOKENS):  # fmt: skip
        if draw(st.integers(0, 2)) == 0:
            attrs[key] = draw(NUMBERS)
    names = draw(st.lists(st.sampled_from(GenAIEvents.FIRST_CHUNK), max_size=2))
    events = tuple((n, T0 + cs + draw(times)) for n in names)
    return tb.add(kind, cs - draw(st.integers(0, 5_000_000)), cs + draw(times), parent=parent,
                  ns=True, service="agent", attrs=attrs, events=events)  # fmt: skip


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
        transports = [parent]
        if draw(st.booleans()):
            cs = draw(times)
            if draw(st.booleans()):  # a GenAI operation around the HTTP exchange
                parent = _genai_operation(draw, tb, cs, parent)
            transports = []
            for _ in range(draw(st.sampled_from([1, 1, 2]))):  # the HTTP client's retries
                ts = cs + draw(st.integers(0, 100_000_000))
                cattrs = {}
                if draw(st.booleans()):  # latscope's client: it read the whole response
                    cattrs[ClientAttributes.LAST_BYTE_NS] = T0 + ts
                if draw(st.booleans()):
                    cattrs[LatscopeAttributes.FIRST_TOKEN_NS] = T0 + ts + draw(times)
                if draw(st.booleans()):
                    cattrs[GenAIAttributes.USAGE_INPUT_TOKENS] = draw(
                        st.sampled_from(["12", "x", ""])
                    )
                if draw(st.integers(0, 3)) == 0:
                    cattrs.update(draw(STREAMING))
                transports.append(tb.add(SpanKind.CLIENT, ts, ts + draw(times), parent=parent,
                                         ns=True, service="agent", attrs=cattrs))  # fmt: skip
        for transport in transports:
            for _ in range(draw(st.integers(1, 3))):  # attempts: retries or parallel samples
                _server(draw, tb, transport, skew, service)
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


@settings(max_examples=examples(200))
@given(traces())
def test_buckets_are_non_negative_and_sum_to_e2e(spans: list[SpanRecord]) -> None:
    for a in attribute_requests("t", normalized(spans)):
        values = [v for v in a.buckets_ns.values() if v is not None]
        assert all(v >= 0 for v in values), a.buckets_ns
        assert sum(values) == a.e2e_ns
        assert (a.buckets_ns["network"] is None) == (not a.has_client)


@pytest.mark.slow
@settings(max_examples=examples(8))
@given(st.lists(traces(), min_size=1, max_size=12))
def test_sql_attributor_agrees_with_the_reference(store: Store, batch: list) -> None:
    """Each example is one statement over several traces (the attributor's batches)."""
    traces_ = {f"t{i}": normalized(spans) for i, spans in enumerate(batch)}
    # The store holds the spans as written (legacy spellings included); the reference reads
    # them as load_trace does.
    sql_check(store, {f"t{i}": spans for i, spans in enumerate(batch)}, reference=traces_)


@pytest.mark.slow
def test_every_call_of_agent_runs_counts_once_in_the_aggregates(store: Store) -> None:
    """Random agent traces through the attributor: each call is one row, and the summaries of
    their services count each call once, also after the attributor went over them again."""
    from dataclasses import replace

    prefix = uuid.uuid4().hex[:8]
    records: dict[str, list[SpanRecord]] = {}
    want: set[tuple[str, str]] = set()
    for seed in range(5):
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
            ag.summary(store, since_ns=0, until_ns=2**62, service=service).count
            for service in services
        )
        assert counted == len(want)


GPU_KEYS_DRAWN = (LatscopeAttributes.GPU_ENERGY_MJ, LatscopeAttributes.GPU_UTIL_MEAN)


@st.composite
def single_calls(draw: st.DrawFn) -> list[SpanRecord]:
    """Traces of the single-call path's shape (a client chain, one SERVER span, its phases) and
    its near misses, each drawn often: a second SERVER span (an app above the client), a phase
    one level down or under the client, a gen_ai.latency.* key (a number or not), a client that
    is a phase, the server's parent stored but not a client, a span stored twice."""
    tb = TraceBuilder()
    skew = draw(st.sampled_from([0, 0, draw(st.integers(-SKEW, SKEW))]))
    parent = ""
    if draw(st.integers(0, 4)) == 0:  # an app's SERVER span above the call
        parent = tb.add(SpanKind.SERVER, 0, 3_000_000_000, ns=True, service="app")
    chain = draw(st.integers(0, 3))  # CLIENT spans: c2, c1, c (outermost first)
    for level in range(chain):
        cs = draw(times)
        cattrs: dict = {}
        for key in (GenAIAttributes.REQUEST_MODEL, GenAIAttributes.PROVIDER_NAME,
                    GenAIAttributes.SYSTEM, GenAIAttributes.USAGE_OUTPUT_TOKENS,
                    GenAIAttributes.USAGE_COMPLETION_TOKENS, GenAIAttributes.USAGE_INPUT_TOKENS,
                    GenAIAttributes.RESPONSE_TIME_TO_FIRST_CHUNK,
                    OpenInferenceAttributes.TOKEN_COUNT_PROMPT,
                    OpenInferenceAttributes.TOKEN_COUNT_COMPLETION):  # fmt: skip
            if draw(st.integers(0, 2)) == 0:
                cattrs[key] = draw(st.sampled_from(["m1", "openai"]) | NUMBERS)
        if draw(st.integers(0, 2)) == 0:  # a GenAI operation (the request's client if outermost)
            cattrs[GenAIAttributes.OPERATION_NAME] = "chat"
        if draw(st.integers(0, 3)) == 0:
            cattrs.update(draw(STREAMING))
        kind = SpanKind.CLIENT
        if level == 0 and level < chain - 1 and draw(st.integers(0, 5)) == 0:
            # OpenInference's LLM span (INTERNAL) around the call: the general path's
            kind = SpanKind.INTERNAL
            cattrs[OpenInferenceAttributes.SPAN_KIND] = "LLM"
        # A first-chunk time in seconds: one beyond Int64 ns is out of this test's scope.
        if cattrs.get(GenAIAttributes.RESPONSE_TIME_TO_FIRST_CHUNK, "").startswith("9999"):
            cattrs[GenAIAttributes.RESPONSE_TIME_TO_FIRST_CHUNK] = "0.25"
        if level == chain - 1:
            if draw(st.booleans()):
                cattrs[ClientAttributes.LAST_BYTE_NS] = draw(st.just(str(T0 + cs)) | NUMBERS)
            if draw(st.booleans()):
                cattrs[LatscopeAttributes.FIRST_TOKEN_NS] = T0 + cs + draw(times)
            if draw(st.integers(0, 5)) == 0:
                cattrs[LatscopeAttributes.PHASE] = Phase.QUEUE  # a client that is a phase
        events: tuple = ()
        if draw(st.integers(0, 3)) == 0:
            name = draw(st.sampled_from(GenAIEvents.FIRST_CHUNK))
            events = ((name, T0 + cs + draw(times)), (name, T0 + cs + draw(times)))
        parent = tb.add(kind, cs, cs + draw(times), parent=parent, ns=True,
                        service="agent", attrs=cattrs, events=events)  # fmt: skip
    client = parent
    if draw(st.integers(0, 6)) == 0:  # the server's parent: stored, not a client
        parent = tb.add(SpanKind.INTERNAL, 0, 10, parent=parent, ns=True, service="agent")
    elif not chain and draw(st.booleans()):  # a remote parent that was not stored
        parent = "00000000000000ff"
    ss = draw(times) + skew
    sattrs: dict = {}
    for key in (GenAIAttributes.REQUEST_MODEL, GenAIAttributes.RESPONSE_MODEL,
                GenAIAttributes.OPERATION_NAME, "http.route", GenAIAttributes.USAGE_INPUT_TOKENS,
                GenAIAttributes.USAGE_PROMPT_TOKENS, GenAIAttributes.USAGE_OUTPUT_TOKENS,
                GenAIAttributes.USAGE_COMPLETION_TOKENS):  # fmt: skip
        if draw(st.integers(0, 2)) == 0:
            sattrs[key] = draw(st.sampled_from(["m2", "chat", "/v1/chat"]) | NUMBERS)
    if draw(st.integers(0, 6)) == 0:
        sattrs[VllmAttributes.E2E] = draw(NUMBERS)
    status = draw(st.sampled_from(["Ok", "Error", "STATUS_CODE_ERROR", ""]))
    server = tb.add(SpanKind.SERVER, ss, ss + draw(times), parent=parent, ns=True,
                    service="model", attrs=sattrs, resource={"k8s.pod.name": "pod-1"},
                    status=status)  # fmt: skip
    holder = server
    if draw(st.integers(0, 5)) == 0:
        holder = tb.add(SpanKind.INTERNAL, ss, ss + 10, parent=server, ns=True, service="model")
    if draw(st.integers(0, 6)) == 0:  # the ASGI instrumentation's response messages
        _asgi_sends(draw, tb, server, ss, "model")
    for _ in range(draw(st.integers(0, 5))):
        ps = ss + draw(st.integers(-100_000_000, 2_000_000_000))
        name = draw(st.sampled_from(Phase.ALL))
        pattrs: dict = {}
        if name == Phase.DECODE and draw(st.integers(0, 3)) > 0:
            offs = sorted(draw(st.lists(st.integers(0, 900_000), min_size=1, max_size=30)))
            pattrs[LatscopeAttributes.TOKEN_OFFSETS_US] = draw(
                st.just(str(offs).replace(" ", "")) | st.sampled_from(OFFSETS_EDGES)
            )
            if draw(st.booleans()):
                pattrs[LatscopeAttributes.TOKEN_COUNT] = draw(NUMBERS)
        if name in (Phase.PREFILL, Phase.DECODE) and draw(st.booleans()):
            for key in GPU_KEYS_DRAWN:
                if draw(st.booleans()):
                    pattrs[key] = draw(NUMBERS)
        where = draw(st.sampled_from([server, server, server, holder, client]))
        tb.phase(name, ps, ps + draw(st.integers(0, 1_000_000_000)), parent=where or server,
                 ns=True, attrs=pattrs, service="model")  # fmt: skip
    spans = tb.spans
    if draw(st.integers(0, 8)) == 0:  # a span stored twice
        spans = [*spans, draw(st.sampled_from(spans))]
    return spans


@pytest.mark.slow
def test_the_single_call_path_agrees_with_the_general_one_and_the_reference(store: Store) -> None:
    """sql_check runs both statements: every trace the single-call path answers gets the general
    path's row, and both the reference engine's; with the token figures stored as latscope's
    collector stores them, or without, as other writers leave them. Not vacuous: over the
    examples the single-call path takes some traces and leaves the others."""
    from tests.attribution_support import SIMPLE_ANSWERED

    taken: list[tuple[int, int]] = []

    # The same examples every run: that they reach both paths is then a fact about the
    # strategy, not a draw.
    @settings(max_examples=examples(8), derandomize=True, database=None)
    @given(st.lists(single_calls(), min_size=1, max_size=12), st.booleans())
    def check(batch: list, figures: bool) -> None:
        before = len(SIMPLE_ANSWERED)
        traces_ = {f"t{i}": spans for i, spans in enumerate(batch)}
        reference = {k: _as_loaded(v) for k, v in traces_.items()}
        sql_check(store, traces_, reference=reference, figures=figures)
        taken.append((len(SIMPLE_ANSWERED) - before, len(batch)))

    check()
    took, total = map(sum, zip(*taken, strict=True))
    assert max(1, 0.05 * total) <= took < total, (took, total)


@pytest.mark.parametrize("figures", [True, False], ids=["figures stored", "no figures"])
@pytest.mark.parametrize("stall_ns", [DEFAULT_STALL_NS, 10 * MS])
def test_the_single_call_path_counts_stalls_at_its_threshold(
    store: Store, stall_ns: int, figures: bool
) -> None:
    """A call of the common shape whose token gaps (5, 15, 280 and 1 ms) straddle both
    thresholds: the single-call path takes it, and counts 1 stall at the default threshold
    (250 ms) and 2 at 10 ms, as the general path and the reference do, whether the collector
    stored the span's token figures (at 250 ms) or not."""
    from tests.attribution_support import SIMPLE_ANSWERED

    before = set(SIMPLE_ANSWERED)
    call = {"stalls": stalls_call()}
    (got,) = sql_check(store, call, stall_threshold_ns=stall_ns, figures=figures)["stalls"]
    assert len(SIMPLE_ANSWERED - before) == 1
    assert got.stalls == (1 if stall_ns == DEFAULT_STALL_NS else 2)


@pytest.mark.parametrize("figures", [True, False], ids=["figures stored", "no figures"])
@pytest.mark.parametrize("offsets", OFFSETS_EDGES)
def test_attribute_values_read_as_numbers_the_same_in_sql_and_the_reference(
    store: Store, offsets: str, figures: bool
) -> None:
    """A value is a number, or a list of them, in both engines or in neither: a final newline
    makes a count absent in both (Python's `$` alone matched before it, RE2's does not), and the
    reference reads a list JSON refuses as none instead of failing on it."""
    tb = TraceBuilder()
    c = tb.client(0, 100, attrs={GenAIAttributes.USAGE_OUTPUT_TOKENS: "5\n"})
    s = tb.server(10, 90, parent=c, attrs={GenAIAttributes.USAGE_INPUT_TOKENS: "7\n"})
    tb.phase(Phase.PREFILL, 10, 20, parent=s)
    tb.phase(Phase.DECODE, 20, 80, parent=s, attrs={LatscopeAttributes.TOKEN_OFFSETS_US: offsets})
    (got,) = sql_check(store, {"edge": tb.spans}, figures=figures)["edge"]
    assert got.input_tokens is None
    valid = {"[ 0 ,\n1000 ,\t2500\r]": 3, "[-0,7]": 2}
    assert got.output_tokens == valid.get(offsets), (offsets, got.output_tokens)


#: Integers at the edge of what parse_int reads exactly: the Int64 range's ends and one past
#: them, signs, leading zeros, whitespace, and numbers that are not integers.
INTEGER_EDGES = [
    "0", "-0", "7", "+7", "007", "-007", " 7", "7 ", "7\n", "", "-", "x7", "1e3", "1.9", "-1.9",
    "9223372036854775807", "9223372036854775808", "-9223372036854775808",
    "-9223372036854775809", "99999999999999999999", "1" * 19, "0" * 20 + "1", "1e19", "-1e19",
    "9.2e18", "12.0", "１２",
]  # fmt: skip


@settings(max_examples=examples(60), deadline=None)
@given(extra=st.lists(st.from_regex(r"[-+ 0-9.eE]{0,21}", fullmatch=True), max_size=40))
def test_integers_read_the_same_in_sql_and_the_reference(store: Store, extra: list[str]) -> None:
    """The statements' integer parse (sql.parse_int, with its fast path for an integer written
    as ClickHouse writes it) reads every value as model.parse_int does."""
    from latscope.attribution.model import parse_int
    from latscope.attribution.sql import parse_int as sql_parse_int

    values = INTEGER_EDGES + extra
    (got,) = store.query_rows(
        f"SELECT arrayMap(raw -> {sql_parse_int('raw')}, {{v:Array(String)}})", {"v": values}
    )[0]
    assert dict(zip(values, got, strict=True)) == {v: parse_int(v) for v in values}


def _as_loaded(spans: list[SpanRecord]) -> list[SpanRecord]:
    """What the reference reads (load_trace): each span once, current spellings."""
    once = {s.span_id: s for s in reversed(spans)}
    return normalized(s for s in spans if once.pop(s.span_id, None) is not None)


@pytest.mark.slow
def test_the_single_call_path_takes_its_shape_and_leaves_the_rest(store: Store) -> None:
    """Hand-built: the common shape is taken, each near miss is left to the general path (and
    still attributed right: sql_check compares both with the reference). "system": the server is
    a serving system's request span by its name and an event (TensorRT-LLM's disaggregated
    proxy), which the rules read on the general path."""
    from tests.attribution_support import SIMPLE_ANSWERED

    def build(variant: str) -> list[SpanRecord]:
        tb = TraceBuilder()
        top = tb.add(SpanKind.SERVER, 0, 100, service="app") if variant == "app" else ""
        c = tb.client(10, 90, parent=top, attrs={ClientAttributes.LAST_BYTE_NS: T0 + 90 * MS})
        if variant == "client-phase":
            tb.spans[-1].attributes[LatscopeAttributes.PHASE] = Phase.QUEUE
        parent = tb.add(SpanKind.INTERNAL, 11, 12, parent=c) if variant == "internal" else c
        if variant == "system":
            s = tb.server(15, 85, parent=parent, name="llm_request",
                          events=(("ctx_server.selected", T0 + 16 * MS),))  # fmt: skip
        else:
            s = tb.server(15, 85, parent=parent)
        if variant == "latency":
            tb.spans[-1].attributes[VllmAttributes.E2E] = "not a number"
        tb.phase(Phase.PREFILL, 20, 30, parent=s)
        holder = tb.add(SpanKind.INTERNAL, 30, 80, parent=s) if variant == "deep" else s
        tb.phase(Phase.DECODE, 30, 80, parent=holder,
                 attrs={LatscopeAttributes.TOKEN_OFFSETS_US: "[0,1000,2500]"})  # fmt: skip
        spans = tb.spans
        return [*spans, spans[-1]] if variant == "twice" else spans

    variants = ["common", "app", "client-phase", "internal", "latency", "deep", "twice", "system"]
    traces_ = {v: build(v) for v in variants}
    before = set(SIMPLE_ANSWERED)
    sql_check(store, traces_, reference={k: _as_loaded(v) for k, v in traces_.items()})
    taken = SIMPLE_ANSWERED - before
    assert len(taken) == 1  # only "common"; the stored ids are fresh, the order is the dict's
    assert sorted(taken)[0].endswith(f"{0:024x}")


@pytest.mark.slow
def test_the_single_call_path_takes_phases_that_name_the_operation(store: Store) -> None:
    """Instrumentation that copies the request's gen_ai.* attributes onto every span gives the
    phases a GenAI operation: such a phase is below the server, no link of its client chain, so
    the single-call path takes the trace (the same rows as the general path and the reference).
    Left to the general path: such a span that is not a phase, and a phase that the client's
    parents run back to (a cycle), where the reference walks the chain through it."""
    from dataclasses import replace

    from tests.attribution_support import SIMPLE_ANSWERED

    chat = {GenAIAttributes.OPERATION_NAME: "chat", GenAIAttributes.REQUEST_MODEL: "m"}

    def build(variant: str) -> list[SpanRecord]:
        tb = TraceBuilder()
        c = tb.client(10, 90, attrs={**chat, ClientAttributes.LAST_BYTE_NS: T0 + 90 * MS})
        s = tb.server(15, 85, parent=c, attrs=chat)
        p = tb.phase(Phase.PREFILL, 20, 30, parent=s, attrs=chat)
        tb.phase(Phase.DECODE, 30, 80, parent=s,
                 attrs={**chat, LatscopeAttributes.TOKEN_OFFSETS_US: "[0,1000,2500]"})  # fmt: skip
        if variant == "internal":
            tb.add(SpanKind.INTERNAL, 40, 50, parent=s, attrs=chat)
        spans = tb.spans
        if variant == "cycle":
            spans = [replace(x, parent_span_id=p) if x.span_id == c else x for x in spans]
        return spans

    variants = ["phases", "internal", "cycle"]
    traces_ = {v: build(v) for v in variants}
    before = set(SIMPLE_ANSWERED)
    sql_check(store, traces_, reference={k: _as_loaded(v) for k, v in traces_.items()})
    taken = SIMPLE_ANSWERED - before
    assert len(taken) == 1  # only "phases"; the stored ids are fresh, the order is the dict's
    assert sorted(taken)[0].endswith(f"{0:024x}")
