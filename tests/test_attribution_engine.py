"""Attribution rules, golden cases: each checked on the per-request engine and the batch engine."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from latscope.attribution import sweep
from latscope.semconv import (
    ClientAttributes,
    GenAIAttributes,
    HttpAttributes,
    LatscopeAttributes,
    SpanKind,
    VllmAttributes,
)
from tests.attribution_support import MS, T0, TraceBuilder, both, check_sql_with
from tests.serve_support import embedded_store
from tests.skeleton_support import EXPECTED, LAYOUT


@pytest.fixture(
    autouse=True,
    scope="module",
    params=[
        pytest.param(False, id="engine"),
        # A statement of the SQL attributor per case: seconds a case, so the full suite's.
        pytest.param(True, id="sql", marks=pytest.mark.slow),
    ],
)
def _sql(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """Every golden case runs on the reference engine, and again through the SQL attributor,
    which must give the same rows."""
    check_sql_with(embedded_store(tmp_path_factory) if request.param else None)
    yield
    check_sql_with(None)


def _layout(tb: TraceBuilder, skew_ms: float = 0, client: bool = True) -> str:
    (cs, ce), (ss, se) = LAYOUT["client"], LAYOUT["server"]
    c = tb.client(cs, ce, attrs={"gen_ai.request.model": "from-client"}) if client else ""
    s = tb.server(
        ss + skew_ms,
        se + skew_ms,
        parent=c,
        attrs={"gen_ai.request.model": "llama-3-8b", "gen_ai.usage.input_tokens": 812},
        resource={"k8s.pod.name": "pod-1"},
    )
    for name, (ps, pe) in LAYOUT.items():
        if name in ("client", "server"):
            continue
        tb.phase(name, ps + skew_ms, pe + skew_ms, parent=s)
    return s


def _ms(a) -> dict[str, float | None]:
    return {k: None if v is None else v / MS for k, v in a.buckets_ns.items()}


def test_client_server_phases() -> None:
    tb = TraceBuilder()
    _layout(tb)
    a = both("t", tb.spans)
    assert _ms(a) == EXPECTED
    assert a.e2e_ns == 1000 * MS and a.start_ns == T0
    assert a.model == "llama-3-8b"  # the server's attribute wins over the client's
    assert a.input_tokens == 812
    assert a.clock_skew_ns == 0
    assert a.resource_attributes == {"k8s.pod.name": "pod-1"}


def test_server_only_network_is_unknown() -> None:
    tb = TraceBuilder()
    _layout(tb, client=False)
    a = both("t", tb.spans)
    assert _ms(a) == {**EXPECTED, "network": None}
    assert a.e2e_ns == 920 * MS and not a.has_client


@pytest.mark.parametrize("skew_ms", [-10_000, -3_000, -121, 121, 3_000, 10_000])
def test_clock_skew_is_estimated_and_buckets_stay(skew_ms: int) -> None:
    tb = TraceBuilder()
    _layout(tb, skew_ms=skew_ms)
    a = both("t", tb.spans)
    assert _ms(a) == EXPECTED
    assert a.clock_skew_ns == skew_ms * MS


@pytest.mark.parametrize("skew_ms", [-120, -41, 120])
def test_a_misfit_within_the_network_legs_is_no_skew(skew_ms: int) -> None:
    """The server span (920 ms) leaves 80 ms of the client's 1000 for the network: one that
    sticks out by at most that much (started before the client, or its phases running past the
    client's end) is moved the least that fits and reported as no skew (issue 48); a ms more
    is."""
    tb = TraceBuilder()
    _layout(tb, skew_ms=skew_ms)
    a = both("t", tb.spans)
    assert a.clock_skew_ns == 0
    assert _ms(a) == EXPECTED


@pytest.mark.parametrize("tail_ms", [1, 30, 150])
def test_a_server_span_closing_after_the_client_is_clipped_not_moved(tail_ms: int) -> None:
    """The server started after the client and its phases ended before the client did, on the
    client's clock as recorded; only its span ran on past the client's end (a stream's server
    closing its span after the last chunk went out, late on a busy host): that is teardown,
    whatever its length against the network legs' room. Nothing moves, no skew, and the tail
    is clipped: the time before the server's start stays network."""
    tb = TraceBuilder()
    (cs, ce), (ss, _) = LAYOUT["client"], LAYOUT["server"]
    c = tb.client(cs, ce)
    s = tb.server(ss, ce + tail_ms, parent=c)
    for name, (ps, pe) in LAYOUT.items():
        if name not in ("client", "server"):
            tb.phase(name, ps, pe, parent=s)
    a = both("t", tb.spans)
    assert a.clock_skew_ns == 0
    assert a.e2e_ns == (ce - cs) * MS
    # network: 0..40 only; other: 40-45, 145-150, and 950..1000 (the server's own, up to the
    # client's end).
    assert _ms(a) == {**EXPECTED, "network": 40, "other": 60}


def _stream(tb: TraceBuilder, sends: list[float]) -> None:
    """A streamed chat completion as the openai SDK under openai-v2 and a FastAPI server write
    it: the GenAI span from 0 to 1000 ms, the server's span from 40 ms to past its last
    message, and the ASGI instrumentation's ``http send`` spans of the response's body
    messages, each handed to the server at a time of ``sends`` (the last one Starlette's empty
    message closing the stream)."""
    c = tb.client(0, 1000, attrs={GenAIAttributes.OPERATION_NAME: "chat"})
    s = tb.server(
        40, max(sends) + 1, parent=c, attrs={HttpAttributes.ROUTE: "/v1/chat/completions"}
    )
    for at in sends:
        _body_sent(tb, s, at, at + 0.02)


def _body_sent(tb: TraceBuilder, server: str, start_ms: float, end_ms: float) -> None:
    """The ASGI instrumentation's ``http send`` span of a response-body message under
    ``server``: handed to the server at ``start_ms``, its write returned at ``end_ms``."""
    tb.add(
        SpanKind.INTERNAL,
        start_ms,
        end_ms,
        parent=server,
        attrs={HttpAttributes.ASGI_EVENT_TYPE: HttpAttributes.ASGI_RESPONSE_BODY},
        name="POST /v1/chat/completions http send",
    )


@pytest.mark.parametrize("close_ms", [1001, 1005, 1030, 1200])
def test_a_streams_closing_message_after_the_client_left_is_clipped_not_moved(
    close_ms: int,
) -> None:
    """The openai SDK closes a stream at its ``[DONE]`` event; the server's message closing the
    body can go out after the client's span ended (a busy server): the content fits as
    recorded, so nothing moves and the server's time is cut at the client's end."""
    tb = TraceBuilder()
    _stream(tb, [100, 500, 990, 995, close_ms])
    a = both("t", tb.spans)
    assert a.clock_skew_ns == 0
    assert a.e2e_ns == 1000 * MS
    assert _ms(a)["network"] == 40 and _ms(a)["other"] == 960


def test_a_streams_content_after_the_client_left_still_moves_the_server() -> None:
    """Only the closing message is left out: the ``[DONE]`` event itself past the client's end
    is the server's clock running ahead, and the server's time is moved to fit (here within the
    room the network legs leave: no skew reported)."""
    tb = TraceBuilder()
    _stream(tb, [100, 500, 1003, 1005])
    a = both("t", tb.spans)
    assert a.clock_skew_ns == 0
    assert _ms(a)["network"] == 35 and _ms(a)["other"] == 965


def test_a_response_ends_when_its_last_message_is_handed_to_the_server() -> None:
    """The ASGI instrumentation's ``http send`` span of the last body message starts when the
    app hands the message over and ends when the server's write returns: later on a busy
    host (a thread switch before the span ends), or while a slow reader keeps the socket full.
    Neither is the server's work on the response: the window ends at the span's start, so the
    request's server time is not stretched past the client's end and nothing moves."""
    tb = TraceBuilder()
    c = tb.client(0, 1000, attrs={GenAIAttributes.OPERATION_NAME: "chat"})
    # Work after the response (a background task) keeps the server's span open past the client.
    s = tb.server(40, 1150, parent=c, attrs={HttpAttributes.ROUTE: "/v1/chat/completions"})
    _body_sent(tb, s, 950, 1003)
    a = both("t", tb.spans)
    assert a.clock_skew_ns == 0
    assert a.e2e_ns == 1000 * MS
    assert _ms(a)["network"] == 90 and _ms(a)["other"] == 910


def test_small_skew_that_still_fits_is_not_adjusted() -> None:
    tb = TraceBuilder()
    _layout(tb, skew_ms=30)  # server at 70..990: fits inside 0..1000 as recorded
    a = both("t", tb.spans)
    assert a.clock_skew_ns == 0
    assert _ms(a) == EXPECTED


def test_work_after_the_client_got_its_last_byte_is_not_counted() -> None:
    tb = TraceBuilder()
    # latscope's client says it read the whole response (its last byte), so a longer server
    # span is work after the response, not a client span that ended at the headers.
    c = tb.client(0, 500, attrs={ClientAttributes.LAST_BYTE_NS: T0 + 500 * MS})
    s = tb.server(10, 700, parent=c)  # longer than the client: its tail is clipped
    tb.phase("prefill", 20, 100, parent=s)
    tb.phase("decode", 100, 480, parent=s)
    tb.phase("postprocess", 480, 650, parent=s)  # 480..500 counts; 500..650 is after the end
    a = both("t", tb.spans)
    assert a.e2e_ns == 500 * MS
    # It started after the client did: nothing moves (no skew), the excess is after the end.
    assert a.clock_skew_ns == 0
    assert _ms(a) == {
        "network": 10,
        "queue": 0,
        "preprocess": 0,
        "prefill": 80,
        "decode": 380,
        "postprocess": 20,
        "other": 10,
    }


def test_a_longer_server_that_started_first_is_aligned_at_the_start() -> None:
    tb = TraceBuilder()
    c = tb.client(0, 500, attrs={ClientAttributes.LAST_BYTE_NS: T0 + 500 * MS})
    s = tb.server(-30, 600, parent=c)  # on a clock 40 ms behind: aligned at the client's start
    tb.phase("prefill", -20, 60, parent=s)
    tb.phase("decode", 60, 440, parent=s)
    tb.phase("postprocess", 440, 590, parent=s)
    a = both("t", tb.spans)
    assert a.e2e_ns == 500 * MS and a.clock_skew_ns == -30 * MS
    assert _ms(a) == {
        "network": 0,
        "queue": 0,
        "preprocess": 0,
        "prefill": 80,
        "decode": 380,
        "postprocess": 30,
        "other": 10,
    }


def test_overlapping_phases_follow_the_priority() -> None:
    tb = TraceBuilder()
    s = tb.server(0, 100)
    tb.phase("queue", 0, 100, parent=s)  # wraps everything
    tb.phase("preprocess", 10, 40, parent=s)
    tb.phase("prefill", 30, 60, parent=s)
    tb.phase("decode", 50, 90, parent=s)
    tb.phase("postprocess", 85, 95, parent=s)
    a = both("t", tb.spans)
    assert _ms(a) == {
        "network": None,
        "queue": 15,  # 0..10, 95..100
        "preprocess": 20,  # 10..30
        "prefill": 20,  # 30..50
        "decode": 40,  # 50..90
        "postprocess": 5,  # 90..95
        "other": 0,
    }


def test_sweep_helper() -> None:
    got = sweep((0, 100), [("queue", 0, 50), ("prefill", 40, 70), ("bogus", 0, 100)])
    assert got == {
        "queue": 40,
        "preprocess": 0,
        "prefill": 30,
        "decode": 0,
        "postprocess": 0,
        "other": 30,
    }


def test_retries_each_attempt_counts_and_gaps_are_network() -> None:
    tb = TraceBuilder()
    c = tb.client(0, 1000)
    first = tb.server(50, 250, parent=c, status="Error")
    tb.phase("queue", 50, 250, parent=first)  # timed out in the queue
    second = tb.server(400, 950, parent=c, status="Ok")
    tb.phase("queue", 400, 450, parent=second)
    tb.phase("prefill", 450, 550, parent=second)
    tb.phase("decode", 550, 940, parent=second)
    a = both("t", tb.spans)
    assert a.attempts == 2
    assert a.status == "Ok"  # the last attempt's
    assert _ms(a) == {
        "network": 0 + 50 + 150 + 50,  # before, between and after the attempts
        "queue": 200 + 50,
        "preprocess": 0,
        "prefill": 100,
        "decode": 390,
        "postprocess": 0,
        "other": 10,
    }


def test_nested_frontend_server_is_not_the_request() -> None:
    # client -> frontend (SERVER, no phases) -> its client call -> llm server (phases)
    tb = TraceBuilder()
    root = tb.client(0, 1000)
    front = tb.server(10, 990, parent=root, service="gateway")
    call = tb.add(SpanKind.CLIENT, 20, 980, parent=front, service="gateway")
    llm = tb.server(30, 970, parent=call)
    mid = tb.add(SpanKind.INTERNAL, 30, 970, parent=llm)
    tb.phase("decode", 100, 900, parent=mid)  # two levels below its server
    a = both("t", tb.spans)
    assert a.service == "llm-server"
    assert a.e2e_ns == 960 * MS  # the gateway's client call is this request's client
    assert a.buckets_ns["decode"] == 800 * MS


def test_trace_without_server_span_is_not_attributed() -> None:
    tb = TraceBuilder()
    c = tb.client(0, 100)
    tb.phase("decode", 10, 90, parent=c)
    assert both("t", tb.spans) is None


def test_vllm_request_span_needs_no_phase_spans() -> None:
    tb = TraceBuilder()
    c = tb.client(0, 2000)
    tb.server(
        100,
        1900,
        parent=c,
        attrs={
            VllmAttributes.TIME_IN_QUEUE: 0.25,
            VllmAttributes.TIME_TO_FIRST_TOKEN: 0.4,
            VllmAttributes.TIME_IN_MODEL_PREFILL: 0.12,
            VllmAttributes.TIME_IN_MODEL_DECODE: 1.35,
            VllmAttributes.E2E: 1.8,
            "gen_ai.usage.prompt_tokens": 300,
            "gen_ai.usage.completion_tokens": 136,
            "gen_ai.response.model": "meta-llama/Llama-3-8B",
        },
    )
    a = both("t", tb.spans)
    assert _ms(a) == pytest.approx(
        {
            "network": 200,
            "queue": 250,
            "preprocess": 0,
            "prefill": 120,
            "decode": 1350,
            "postprocess": 0,
            "other": 80,  # scheduling between prefill and first token, and after the last
        }
    )
    assert a.ttft_server_ns == 400 * MS
    assert a.tpot_ns == pytest.approx(1350 * MS / 135)
    assert (a.input_tokens, a.output_tokens) == (300, 136)
    assert a.model == "meta-llama/Llama-3-8B"


def test_vllm_without_prefill_attribute_derives_it_from_ttft() -> None:
    tb = TraceBuilder()
    tb.server(
        0,
        1000,
        attrs={VllmAttributes.TIME_IN_QUEUE: 0.1, VllmAttributes.TIME_TO_FIRST_TOKEN: 0.3},
    )
    a = both("t", tb.spans)
    assert a.buckets_ns["queue"] == 100 * MS and a.buckets_ns["prefill"] == 200 * MS


def test_streaming_figures_and_stalls() -> None:
    tb = TraceBuilder()
    first_token = T0 + 300 * MS
    c = tb.client(0, 1000, attrs={LatscopeAttributes.FIRST_TOKEN_NS: first_token})
    s = tb.server(20, 980, parent=c)
    tb.phase("prefill", 30, 250, parent=s)
    offsets_us = [0, 20_000, 40_000, 60_000, 460_000, 480_000]  # one 400 ms gap
    tb.phase(
        "decode",
        250,
        740,
        parent=s,
        attrs={
            LatscopeAttributes.TOKEN_OFFSETS_US: str(offsets_us).replace(" ", ""),
            LatscopeAttributes.TOKEN_COUNT: 6,
        },
    )
    a = both("t", tb.spans, stall_threshold_ns=250 * MS)
    assert a.ttft_client_ns == 300 * MS
    assert a.ttft_server_ns == 230 * MS
    assert a.tpot_ns == pytest.approx(480 * MS / 5)
    assert a.itl_ns["p50"] == 20 * MS
    assert a.itl_ns["max"] == 400 * MS
    assert a.itl_ns["p99"] == pytest.approx((20 + 0.96 * 380) * MS)
    assert a.stalls == 1
    assert a.output_tokens == 6
    # A higher threshold sees no stall.
    assert both("t", tb.spans, stall_threshold_ns=500 * MS).stalls == 0


def test_client_first_token_as_event() -> None:
    tb = TraceBuilder()
    c = tb.client(0, 1000, events=((LatscopeAttributes.FIRST_TOKEN_EVENT, T0 + 420 * MS),))
    tb.server(10, 990, parent=c, attrs={"http.route": "/v1/chat/completions"})
    assert both("t", tb.spans).ttft_client_ns == 420 * MS


def test_gpu_figures_per_phase() -> None:
    tb = TraceBuilder()
    s = tb.server(0, 100)
    tb.phase(
        "prefill",
        0,
        30,
        parent=s,
        attrs={"latscope.gpu.utilization.mean": 91.5, "latscope.gpu.energy_mj": 1200},
    )
    tb.phase("decode", 30, 100, parent=s, attrs={"latscope.gpu.power.mean": 310.25})
    tb.phase("queue", 0, 1, parent=s, attrs={"latscope.gpu.power.mean": 1})  # not a GPU phase
    a = both("t", tb.spans)
    assert a.gpu == {
        "prefill": {"utilization_mean": 91.5, "energy_mj": 1200.0},
        "decode": {"power_mean": 310.25},
    }


def test_bad_attribute_values_do_not_break_the_request() -> None:
    tb = TraceBuilder()
    s = tb.server(
        0,
        100,
        attrs={"gen_ai.usage.input_tokens": "lots", "gen_ai.usage.output_tokens": -5},
    )
    tb.phase("decode", 10, 90, parent=s, attrs={LatscopeAttributes.TOKEN_OFFSETS_US: "[1,2,"})
    a = both("t", tb.spans)
    assert a.input_tokens is None and a.output_tokens is None and a.ttft_server_ns is None
    assert a.buckets_ns["decode"] == 80 * MS


def test_two_decode_phases_one_timed_give_the_same_tokens_everywhere() -> None:
    """Issue 17: the token timeline once read another decode span than attribution. With two
    decode phases and only the first carrying token times, attribution (Python and SQL), the
    token timeline and ``timed_decode`` all take the first one's tokens."""
    from latscope.api.trace import _select, _timeline
    from latscope.attribution.engine import attribute_request, timed_decode

    tb = TraceBuilder()
    s = tb.server(0, 1000)
    tb.phase("prefill", 10, 100, parent=s)
    offsets_us = [0, 10_000, 400_000]  # one 390 ms gap
    timed = tb.phase(
        "decode", 100, 600, parent=s,
        attrs={LatscopeAttributes.TOKEN_OFFSETS_US: str(offsets_us).replace(" ", "")},
    )  # fmt: skip
    tb.phase("decode", 600, 900, parent=s)  # a second decode phase without token times
    a = both("t", tb.spans, stall_threshold_ns=250 * MS)
    assert (a.output_tokens, a.stalls) == (3, 1)
    request = _select("t", None, tb.spans)
    found = timed_decode(request)
    assert found is not None and found[0].span_id == timed
    result = attribute_request("t", request, stall_threshold_ns=250 * MS)
    timeline = _timeline(request, result, 250.0)
    assert (timeline["count"], len(timeline["stalls"])) == (a.output_tokens, a.stalls)


def _sglang_worker(
    tb: TraceBuilder, role: str, parent: str, start: float, end: float, stages: dict
) -> str:
    """An SGLang worker's request root (``"<role> Req <rid>"``), its scheduler thread span and
    its stage slices (name -> (start, end) ms)."""
    latency = {VllmAttributes.TIME_TO_FIRST_TOKEN: 0.09, VllmAttributes.E2E: 0.2}
    root = tb.add(
        SpanKind.INTERNAL, start, end, parent=parent, service=f"sglang-{role}",
        attrs={**latency, "gen_ai.usage.completion_tokens": 1 if role == "prefill" else 24},
        name=f"{role} Req 8d1f0c5e",
    )  # fmt: skip
    thread = tb.add(SpanKind.INTERNAL, start, end, parent=root, service=f"sglang-{role}")
    for name, (s, e) in stages.items():
        tb.add(SpanKind.INTERNAL, s, e, parent=thread, service=f"sglang-{role}", name=name)
    return root


def test_a_disaggregated_request_is_one_with_its_kv_transfer_named() -> None:
    """SGLang's prefill worker and decode worker serve one request: prefill from the prefill
    side, decode from the decode side, queue from both, and the KV-cache transfer, where no
    phase covers it, counted in other and named on its own."""
    tb = TraceBuilder()
    c = tb.client(0, 300, attrs={ClientAttributes.LAST_BYTE_NS: T0 + 300 * MS})
    _sglang_worker(tb, "prefill", c, 10, 150, {
        "tokenize": (10, 14), "prefill_bootstrap": (14, 20), "prefill_waiting": (20, 40),
        "prefill_forward": (40, 100), "prefill_transfer_kv_cache": (100, 140),
    })  # fmt: skip
    _sglang_worker(tb, "decode", c, 10, 290, {
        "tokenize": (10, 14), "decode_bootstrap": (14, 20), "decode_transferred": (20, 140),
        "decode_waiting": (140, 150), "decode_forward": (150, 280),
    })  # fmt: skip
    a = both("t", tb.spans)
    assert a.attempts == 1 and a.output_tokens == 24
    assert _ms(a) == {
        "network": 20,
        "queue": 6 + 20 + 10,
        "preprocess": 4,
        "prefill": 60,
        "decode": 130,
        "postprocess": 0,
        "other": 40 + 10,
    }
    assert a.kv_transfer_ns == 40 * MS
    # The decode worker's first token, from the try's start.
    assert a.ttft_server_ns == 90 * MS


def test_no_kv_transfer_without_disaggregation() -> None:
    tb = TraceBuilder()
    _layout(tb)
    assert both("t", tb.spans).kv_transfer_ns is None
