"""The agent scenario's ground truth: the critical path of a run computed from the agent's own
readings and each call's true buckets (latscope.demo.agent.run_truth), and the run check's
arithmetic (latscope.demo.check.compare_runs)."""

from __future__ import annotations

import pytest

from latscope.demo.agent import AgentRun, Step, run_truth
from latscope.demo.check import compare_runs, whole_calls_on_path
from latscope.demo.load import RequestResult
from latscope.semconv import BUCKETS

MS = 1_000_000
US = 1_000
TRACE = "ab" * 16


def _bracket(t_ms: float, width_us: int = 4) -> tuple[int, int]:
    t = round(t_ms * MS)
    return (t - width_us * US // 2, t + width_us * US // 2)


def _llm(span: str, start_ms: float, end_ms: float) -> Step:
    result = RequestResult(request_id=span, stream=True, prompt_words=10, max_tokens=10)
    result.trace_id, result.span_id = TRACE, span
    result.start_ns, result.end_ns = _bracket(start_ms), _bracket(end_ms)
    result.e2e_ns = (result.end_ns[0] - result.start_ns[1], result.end_ns[1] - result.start_ns[0])
    return Step("llm", result.start_ns, result.end_ns, result=result)


def _tool(span: str, start_ms: float, end_ms: float) -> Step:
    return Step("tool", _bracket(start_ms), _bracket(end_ms), "search", span_id=span)


def _buckets(step: Step) -> dict[str, tuple[int, int]]:
    """Made-up true buckets adding up to the call's e2e bracket: network 10 %, decode the rest."""
    assert step.result is not None
    lo, hi = step.result.e2e_ns
    out = dict.fromkeys(BUCKETS, (0, 0))
    out["network"] = (lo // 10, hi // 10)
    out["decode"] = (lo - lo // 10, hi - hi // 10)
    return out


def _run() -> AgentRun:
    """Root 0..1000 ms: plan call, tool, three calls in parallel (A first, B 0.5 ms later and
    finishing last, C), a short tool, the final call; the app's own time between."""
    steps = [
        _llm("01" * 8, 5, 105),
        _tool("a1" * 8, 110, 160),
        _llm("0a" * 8, 170, 400),
        _llm("0b" * 8, 170.5, 600),
        _llm("0c" * 8, 170.8, 350),
        _tool("a2" * 8, 610, 612),
        _llm("0f" * 8, 620, 900),
    ]
    return AgentRun("r1", TRACE, "ee" * 8, _bracket(0), _bracket(1000), steps)


def test_the_critical_path_takes_the_last_finishing_call_of_a_group() -> None:
    run = _run()
    steps = {s.result.span_id if s.result else s.span_id: s for s in run.steps}
    truth = run_truth(run, {s.result.latscope_id: _buckets(s) for s in run.steps if s.result})
    assert truth.calls_on_path == [f"{TRACE}-{'01' * 8}", f"{TRACE}-{'0b' * 8}",
                                   f"{TRACE}-{'0f' * 8}"]  # fmt: skip
    assert truth.tools_on_path == ["a1" * 8, "a2" * 8]
    # A started first: the path counts it from its start to B's start (0.5 ms), C not at all.
    assert truth.partial_calls == 1
    assert truth.partial_max_ns == pytest.approx(0.5 * MS, abs=10 * US)
    whole = [steps["01" * 8], steps["0b" * 8], steps["0f" * 8]]
    for bucket in BUCKETS:
        lo = sum(_buckets(s)[bucket][0] for s in whole)
        hi = sum(_buckets(s)[bucket][1] for s in whole)
        # Each bucket's bracket also holds the cut-off piece (it could be in any of them).
        assert truth.llm[bucket][0] == lo
        assert truth.llm[bucket][1] == pytest.approx(hi + 0.5 * MS, abs=10 * US)
    assert truth.tool[0] <= 52 * MS <= truth.tool[1]
    # The app: the root's time minus the calls and tools on the path (100 + 429.5 + 280 +
    # 0.5 + 52 ms); the brackets hold it.
    app = 1000 - (100 + 429.5 + 280 + 0.5 + 52)
    assert truth.app[0] <= app * MS <= truth.app[1]
    assert truth.app[1] - truth.app[0] < 100 * US
    assert truth.e2e[0] <= 1000 * MS <= truth.e2e[1]


def test_a_call_started_last_and_finishing_last_leaves_no_piece() -> None:
    run = _run()
    run.steps[3] = _llm("0b" * 8, 169.0, 600)  # B now starts first
    truth = run_truth(run, {s.result.latscope_id: _buckets(s) for s in run.steps if s.result})
    assert truth.partial_calls == 0


def _answer(figures: dict[str, float], whole: list[str]) -> dict:
    """A /v1/traces/{id}/run answer with these figures (ms) and these calls taken whole."""
    calls = [{"request_id": rid, "e2e_ms": 100.0, "on_critical_path_ms": 100.0} for rid in whole]
    calls.append({"request_id": "cut", "e2e_ms": 100.0, "on_critical_path_ms": 0.4})
    return {
        "e2e_ms": figures["e2e"],
        "critical_path_ms": {
            "llm_buckets": {b: figures[f"llm.{b}"] for b in BUCKETS},
            "tool": figures["tool"],
            "app": figures["app"],
        },
        "calls": calls,
    }


def test_run_check_grades_each_part_and_the_calls_on_the_path() -> None:
    truth = {"e2e": (1000 * MS, 1000 * MS + 10 * US), "tool": (50 * MS, 50 * MS),
             "app": (150 * MS, 150 * MS)}  # fmt: skip
    truth |= {f"llm.{b}": (0, 0) for b in BUCKETS}
    truth["llm.decode"] = (800 * MS, 800 * MS)
    good = {k: (lo + hi) / 2 / MS for k, (lo, hi) in truth.items()}
    result = compare_runs([("t1", truth, _answer(good, ["c1", "c2"]), ["c1", "c2"])])
    assert result.ok and result.calls == 3
    assert {p.part for p in result.parts} == set(truth)
    # 2 % of 800 ms is 16 ms: decode 20 ms off fails, and the app that took the difference too.
    bad = {**good, "llm.decode": 780.0, "app": 170.0}
    result = compare_runs([("t1", truth, _answer(bad, ["c1", "c2"]), ["c1", "c2"])])
    assert not result.ok
    assert {p.part for p in result.parts if not p.ok} == {"llm.decode", "app"}
    assert [w[1] for w in result.worst] == ["app", "llm.decode"]  # 20 ms over 1 ms first
    # Another call taken whole than the truth's.
    result = compare_runs([("t1", truth, _answer(good, ["c1", "c3"]), ["c1", "c2"])])
    assert not result.ok and result.path_mismatch == ["t1"]
    assert not compare_runs([], missing=["t2"]).ok


def test_whole_calls_on_path_leave_out_cut_off_pieces() -> None:
    answer = {"calls": [
        {"request_id": "c1", "e2e_ms": 500.0, "on_critical_path_ms": 499.5},
        {"request_id": "c2", "e2e_ms": 500.0, "on_critical_path_ms": 3.0},
        {"request_id": "c3", "e2e_ms": 500.0, "on_critical_path_ms": 0.0},
    ]}  # fmt: skip
    assert whole_calls_on_path(answer) == ["c1"]
