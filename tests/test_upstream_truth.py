"""The ground truth is self-consistent and agrees with the spans it comes with.

Each builder's truth is checked against figures read back from its own spans by the rules
(docs/attribution.md): request ids from inference server spans and their clients (the outermost
GenAI operation of the call, else the nearest CLIENT ancestor),
headers-only arithmetic from the two spans' durations, vLLM and SGLang buckets from their
attributes and stage slices; agent runs' critical paths by walking the spans' true extents.
No attribution engine is involved here.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from hypothesis import given, settings

from latscope.attribution.model import SpanRecord
from tests.agent_traces import AgentRun, Parallel, agent_run, agent_runs, path_by_walk, summary
from tests.hypothesis_support import examples
from tests.upstream_traces import (
    BUILDERS,
    MS,
    SECOND,
    Built,
    Truth,
    httpx_stream,
    openai_v2_chat,
    sdk_request,
    sglang_request,
    single_call,
    span_records,
    vllm_parallel_request,
    vllm_v0_request,
    vllm_v1_request,
)

REQUEST_ID = re.compile(r"^[0-9a-f]{32}-[0-9a-f]{16}$")
SEEDS = range(6)
SGLANG_BUCKET_OF = {
    "tokenize": "preprocess",
    "prefill_waiting": "queue",
    "decode_waiting": "queue",
    "prefill_forward": "prefill",
    "chunked_prefill": "prefill",
    "decode_forward": "decode",
    "decode_loop": "decode",
}


def _ns(seconds: str) -> int:
    return round(float(seconds) * SECOND)


def _inference_servers(spans: list[SpanRecord]) -> list[SpanRecord]:
    """By the rule: SERVER spans owning phase spans or carrying gen_ai.latency.*, and any span
    carrying gen_ai.latency.* (SGLang's root has no kind)."""
    owners = {s.parent_span_id for s in spans if "latscope.phase" in s.attributes}
    return [
        s
        for s in spans
        if any(k.startswith("gen_ai.latency.") for k in s.attributes)
        or (s.kind == "Server" and s.span_id in owners)
    ]


def _genai_operation(span: SpanRecord) -> bool:
    return span.kind != "Server" and (
        span.attributes.get("gen_ai.operation.name") == "chat"
        or span.attributes.get("openinference.span.kind") == "LLM"
    )


def _nearest_client(span: SpanRecord, by_id: dict[str, SpanRecord]) -> SpanRecord | None:
    """The call's client: the nearest CLIENT ancestor, or the outermost GenAI operation of the
    spans of the call directly above it."""
    parent = by_id.get(span.parent_span_id)
    while parent is not None and parent.kind != "Client":
        parent = by_id.get(parent.parent_span_id)
    if parent is None:
        return None
    client, node = parent, by_id.get(parent.parent_span_id)
    while node is not None and (node.kind == "Client" or _genai_operation(node)):
        if _genai_operation(node):
            client = node
        node = by_id.get(node.parent_span_id)
    return client


def _request_ids(built: Built) -> set[str]:
    """Every request id the spans define, by the rule."""
    ids = set()
    for trace_id, spans in span_records(built.resource_spans).items():
        by_id = {s.span_id: s for s in spans}
        for server in _inference_servers(spans):
            client = _nearest_client(server, by_id)
            ids.add(f"{trace_id}-{(client or server).span_id}")
    return ids


def _truth_spans(built: Built, truth: Truth) -> tuple[SpanRecord, list[SpanRecord]]:
    """The span the request id names, and the inference server spans under it."""
    spans = span_records(built.resource_spans)[truth.trace_id]
    by_id = {s.span_id: s for s in spans}
    named = by_id[truth.request_id.split("-")[1]]
    servers = [
        s
        for s in _inference_servers(spans)
        if s is named or (_nearest_client(s, by_id) or s) is named
    ]
    return named, servers


@pytest.mark.parametrize(("label", "build"), BUILDERS, ids=[b[0] for b in BUILDERS])
@pytest.mark.parametrize("seed", SEEDS)
def test_truth_adds_up_and_names_the_requests_the_spans_define(
    label: str, build: Callable[[int], Built], seed: int
) -> None:
    built = build(seed)
    for truth in built.truths:
        truth.check()
        assert REQUEST_ID.match(truth.request_id), truth.request_id
        named, servers = _truth_spans(built, truth)
        assert servers, label
        has_client = named.kind == "Client" or _genai_operation(named)
        assert (truth.buckets["network"] is None) is not has_client, label
        if has_client and not truth.headers_only:
            assert truth.e2e_ns == named.duration_ns
    assert {t.request_id for t in built.truths} == _request_ids(built), label


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    "build",
    [
        lambda s: httpx_stream(s, server="sdk"),
        lambda s: httpx_stream(s, server="vllm_v1", semconv="new", skew_ns=4 * SECOND),
        lambda s: httpx_stream(s, server="sglang", skew_ns=-3 * SECOND),
    ],
)
def test_headers_only_truth_from_the_two_spans(build: Callable[[int], Built], seed: int) -> None:
    built = build(seed)
    truth = built.truth
    client, (server,) = _truth_spans(built, truth)
    # The signal: the server span does not fit in the client span whatever the skew, and the
    # client does not say it saw the last byte.
    assert truth.headers_only
    assert client.duration_ns < server.duration_ns
    assert "latscope.last_byte_ns" not in client.attributes
    assert truth.e2e_ns == client.duration_ns + server.duration_ns
    assert truth.buckets["network"] == client.duration_ns


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    "build",
    [
        lambda s: openai_v2_chat(s, server="sglang", skew_ns=-3 * SECOND),
        lambda s: single_call(s, client="openinference", server="vllm_v0"),
    ],
)
def test_a_genai_operation_is_the_call_over_its_headers_only_http_span(
    build: Callable[[int], Built], seed: int
) -> None:
    built = build(seed)
    truth = built.truth
    client, (server,) = _truth_spans(built, truth)
    # The GenAI operation around the HTTP exchange is the call as the app made it: its span is
    # the request's end to end, the HTTP span under it ended at the headers.
    assert _genai_operation(client) and not truth.headers_only
    (http,) = [s for s in span_records(built.resource_spans)[truth.trace_id] if s.name == "POST"]
    assert http.parent_span_id == client.span_id
    assert http.duration_ns < server.duration_ns
    assert truth.e2e_ns == client.duration_ns
    assert truth.buckets["network"] == client.duration_ns - server.duration_ns


@pytest.mark.parametrize("seed", SEEDS)
def test_retried_request_counts_every_attempt(seed: int) -> None:
    built = sdk_request(seed, retries=2, skew_ns=seed * 500 * MS)
    truth = built.truth
    client, attempts = _truth_spans(built, truth)
    assert truth.attempts == len(attempts) == 3
    assert [a.status for a in sorted(attempts, key=lambda a: a.start_ns)] == [
        "Error",
        "Error",
        "Unset",
    ]
    assert truth.e2e_ns == client.duration_ns
    assert truth.buckets["network"] == client.duration_ns - sum(a.duration_ns for a in attempts)


@pytest.mark.parametrize("seed", SEEDS)
def test_vllm_v1_buckets_are_its_latency_attributes(seed: int) -> None:
    built = vllm_v1_request(seed)
    (server,) = _truth_spans(built, built.truth)[1]
    a, b = server.attributes, built.truth.buckets
    assert server.name == "llm_request" and server.kind == "Server"
    assert "gen_ai.request.model" not in a and "gen_ai.response.model" not in a
    assert b["queue"] == _ns(a["gen_ai.latency.time_in_queue"])
    assert b["prefill"] == _ns(a["gen_ai.latency.time_in_model_prefill"])
    assert b["decode"] == _ns(a["gen_ai.latency.time_in_model_decode"])
    assert built.truth.server_ttft_ns == _ns(a["gen_ai.latency.time_to_first_token"])
    assert _ns(a["gen_ai.latency.e2e"]) == server.duration_ns


@pytest.mark.parametrize("seed", SEEDS)
def test_vllm_v0_buckets_follow_the_no_split_rule(seed: int) -> None:
    built = vllm_v0_request(seed)
    (server,) = _truth_spans(built, built.truth)[1]
    a, b = server.attributes, built.truth.buckets
    assert "gen_ai.latency.time_in_model_prefill" not in a
    assert "gen_ai.latency.time_in_model_decode" not in a
    queue, ttft = (
        _ns(a["gen_ai.latency.time_in_queue"]),
        _ns(a["gen_ai.latency.time_to_first_token"]),
    )
    e2e = _ns(a["gen_ai.latency.e2e"])
    assert (b["queue"], b["prefill"], b["decode"]) == (queue, ttft - queue, e2e - ttft)
    assert b["other"] == server.duration_ns - e2e
    assert a["gen_ai.response.model"] == built.truth.model


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n", [2, 4])
def test_vllm_parallel_sampling_is_one_request(seed: int, n: int) -> None:
    built = vllm_parallel_request(seed, n=n)
    truth = built.truth
    client, servers = _truth_spans(built, truth)
    assert len(servers) == n and truth.attempts == 1
    assert len({s.start_ns for s in servers}) == 1, "children share the arrival"
    assert len({s.end_ns for s in servers}) == n
    assert {s.attributes["gen_ai.request.id"] for s in servers} == {
        servers[0].attributes["gen_ai.request.id"]
    }
    assert {s.attributes["gen_ai.request.n"] for s in servers} == {"1"}
    last = max(servers, key=lambda s: s.end_ns)
    assert truth.buckets["decode"] == _ns(last.attributes["gen_ai.latency.time_in_model_decode"])
    assert truth.buckets["network"] == client.duration_ns - last.duration_ns
    assert truth.output_tokens == sum(
        int(s.attributes["gen_ai.usage.completion_tokens"]) for s in servers
    )


def _union(intervals: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for lo, hi in sorted(intervals):
        if end is None or lo > end:
            total += hi - lo
            end = hi
        elif hi > end:
            total += hi - end
            end = hi
    return total


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("tp", "level", "chunks"), [(1, 3, 1), (2, 3, 3), (1, 1, 2), (2, 2, 1)])
def test_sglang_buckets_are_its_stage_slices(seed: int, tp: int, level: int, chunks: int) -> None:
    built = sglang_request(seed, client="sdk", tp=tp, slice_level=level, chunks=chunks)
    truth = built.truth
    client, (root,) = _truth_spans(built, truth)
    spans = span_records(built.resource_spans)[truth.trace_id]
    assert root.name.startswith(" Req ") and root.kind == "Internal"
    assert root.parent_span_id == client.span_id, "the root is the caller's span's child"
    assert {s.kind for s in spans if s.span_id != client.span_id} == {"Internal"}
    threads = [s for s in spans if s.parent_span_id == root.span_id]
    assert len(threads) == 1 + tp
    assert all(re.search(r"\(host:[0-9a-f]{8} \| pid:\d+\)$", t.name) for t in threads)
    per_bucket: dict[str, list[tuple[int, int]]] = {}
    for s in spans:
        if s.name in SGLANG_BUCKET_OF:
            per_bucket.setdefault(SGLANG_BUCKET_OF[s.name], []).append((s.start_ns, s.end_ns))
    for bucket in ("preprocess", "queue", "prefill", "decode"):
        assert truth.buckets[bucket] == _union(per_bucket.get(bucket, [])), bucket
    assert truth.buckets["other"] == root.duration_ns - sum(
        truth.buckets[b] for b in ("preprocess", "queue", "prefill", "decode")
    )
    names = {s.name for s in spans}
    assert ("decode_loop" in names) is (level >= 3)
    assert ("request_process" in names) is (level >= 2)


@pytest.mark.parametrize("seed", SEEDS)
def test_sglang_without_slices_reads_its_latency_attributes(seed: int) -> None:
    built = sglang_request(seed, client=None, slice_level=0)
    truth = built.truth
    assert truth.trace_id.startswith("0" * 16), "SGLang's own trace ids are 64-bit"
    (root,) = _truth_spans(built, truth)[1]
    a = root.attributes
    assert "gen_ai.latency.time_in_queue" not in a
    assert truth.buckets["prefill"] == _ns(a["gen_ai.latency.time_in_model_prefill"])
    assert truth.buckets["decode"] == _ns(a["gen_ai.latency.time_in_model_decode"])
    assert truth.e2e_ns == root.duration_ns == _ns(a["gen_ai.latency.e2e"])
    assert truth.buckets["queue"] == 0


@pytest.mark.parametrize("seed", SEEDS)
def test_skew_moves_spans_not_the_truth(seed: int) -> None:
    plain = openai_v2_chat(seed, server="sdk")
    skewed = openai_v2_chat(seed, server="sdk", skew_ns=7 * SECOND + 3)
    assert skewed.truth.skew_ns == 7 * SECOND + 3
    assert {**vars(skewed.truth), "skew_ns": 0} == {**vars(plain.truth), "skew_ns": 0}
    moved = [
        (a.start_time_unix_nano, b.start_time_unix_nano)
        for a, b in zip(plain.spans, skewed.spans, strict=True)
        if a.start_time_unix_nano != b.start_time_unix_nano
    ]
    assert moved and all(b - a == 7 * SECOND + 3 for a, b in moved)


# -- agent runs -----------------------------------------------------------------------------------


def _assert_run(run: AgentRun) -> None:
    run.check()
    cp = run.critical_path
    walked = path_by_walk(run)
    assert (walked.llm_ns, walked.tool_ns, walked.app_ns) == (cp.llm_ns, cp.tool_ns, cp.app_ns), (
        summary(run)
    )
    assert (walked.calls, walked.tools) == (cp.calls, cp.tools)
    assert {t.request_id for t in run.requests} == _request_ids(run.built)
    spans = span_records(run.built.resource_spans)[run.trace_id]
    (root,) = [s for s in spans if not s.parent_span_id]
    assert root.duration_ns == cp.e2e_ns, "the root is on the agent's clock"
    assert set(cp.calls) <= {t.request_id for t in run.requests}


@settings(max_examples=examples(80))
@given(agent_runs())
def test_agent_run_truth_is_consistent(run: AgentRun) -> None:
    _assert_run(run)


@settings(max_examples=examples(30))
@given(agent_runs(skew=False, gateways=False, headers_only=False, retries=False))
def test_plain_agent_runs_are_consistent(run: AgentRun) -> None:
    _assert_run(run)


def test_parallel_group_puts_only_its_longest_branch_on_the_path() -> None:
    groups = 0
    for seed in range(150):
        run = agent_run(seed)
        t = run.start_ns + run.plan.wrap[0]
        for gap, element in run.plan.items:
            t += gap
            if isinstance(element, Parallel):
                groups += 1
                branches = [n for n in run.nodes if n.parent == run.body_span_id and n.start == t]
                assert len(branches) == len(element.branches)
                longest = max(branches, key=lambda n: n.end)
                assert longest.end - longest.start == element.duration()
                for node in branches:
                    if node.kind == "llm":
                        assert node.truth is not None
                        on_path = node.truth.request_id in run.critical_path.calls
                    else:
                        on_path = node.span_id in run.critical_path.tools
                    assert on_path is (node is longest), summary(run)
            t += element.duration()
    assert groups >= 20
