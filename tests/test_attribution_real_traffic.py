"""Real traffic: every upstream trace shape (tests/upstream_traces.py) and random agent runs
(tests/agent_traces.py), attributed by the reference engine against the ground truth their
builders computed from what they built; and the SQL attributor against the reference on all of
them, a batch per statement (as the attributor runs it)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from latscope.attribution import attribute_requests, explain_run, find_requests
from latscope.attribution.model import RequestAttribution
from tests.agent_traces import AgentRun, agent_run, agent_runs, mixed_traces
from tests.attribution_support import sql_check
from tests.hypothesis_support import examples
from tests.serve_support import embedded_store
from tests.upstream_traces import BUILDERS, Truth, span_records

SEEDS = range(4)


_MODEL_KEYS = ("gen_ai.request.model", "gen_ai.response.model")


def assert_matches(truth: Truth, got: RequestAttribution, spans: list | None = None) -> None:
    assert got.request_id == truth.request_id
    assert got.e2e_ns == truth.e2e_ns, (truth.shape, got.e2e_ns, truth.e2e_ns)
    for bucket, ns in truth.buckets.items():
        assert got.buckets_ns[bucket] == ns, (truth.shape, bucket, got.buckets_ns, truth.buckets)
    assert got.attempts == truth.attempts
    assert got.headers_only == truth.headers_only
    if truth.server_ttft_ns is not None:
        assert got.ttft_server_ns == truth.server_ttft_ns, truth.shape
    if truth.client_ttft_ns is not None:
        assert got.ttft_client_ns == truth.client_ttft_ns, truth.shape
    if truth.input_tokens is not None:
        assert got.input_tokens == truth.input_tokens
    if truth.output_tokens is not None:
        assert got.output_tokens == truth.output_tokens, truth.shape
    # The truth names the server's model; latscope can know it only where a span says it
    # (vLLM v1 does not, and a bare httpx client does not either).
    named = spans is None or any(
        k in s.attributes
        for r in find_requests(spans)
        if r.span_id == got.request_span_id
        for s in (*r.client_chain, *r.attempts)
        for k in _MODEL_KEYS
    )
    if truth.model is not None and named:
        assert got.model == truth.model
    if truth.service is not None:
        assert got.service == truth.service


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("shape", "build"), BUILDERS, ids=[b[0] for b in BUILDERS])
def test_every_upstream_shape_is_attributed_as_its_truth(shape: str, build, seed: int) -> None:
    built = build(seed)
    traces = span_records(built.resource_spans)
    got = {a.request_id: a for t, spans in traces.items() for a in attribute_requests(t, spans)}
    assert sorted(got) == sorted(t.request_id for t in built.truths), shape
    for truth in built.truths:
        assert_matches(truth, got[truth.request_id], traces[truth.trace_id])


def _run_check(run: AgentRun) -> None:
    (trace_id,) = run.built.trace_ids
    spans = span_records(run.built.resource_spans)[trace_id]
    got = {a.request_id: a for a in attribute_requests(trace_id, spans)}
    assert sorted(got) == sorted(t.request_id for t in run.requests)
    for truth in run.requests:
        assert_matches(truth, got[truth.request_id], spans)
    explained = explain_run(trace_id, spans)
    assert explained is not None
    path = run.critical_path
    assert explained.e2e_ns == path.e2e_ns
    assert explained.llm_ns == path.llm_ns
    assert explained.tool_ns == path.tool_ns
    assert explained.app_ns == path.app_ns
    on_path = [c.attribution.request_id for c in explained.calls if c.on_path_ns > 0]
    assert sorted(on_path) == sorted(path.calls)


@pytest.mark.parametrize("seed", range(12))
def test_agent_runs_calls_and_critical_path(seed: int) -> None:
    _run_check(agent_run(seed, parallel=True, gateways=True, retries=True, skew=True))


@settings(max_examples=examples(30))
@given(agent_runs())
def test_random_agent_runs(run: AgentRun) -> None:
    _run_check(run)


@pytest.mark.slow
def test_the_sql_attributor_agrees_on_every_shape_and_agent_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The SQL attributor over one batch mixing every upstream shape (every seed above) and the
    agent runs above writes exactly the reference engine's rows."""
    sql_check(embedded_store(tmp_path_factory), mixed_traces(SEEDS, runs=12))
