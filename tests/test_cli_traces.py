"""``latscope explain`` and ``latscope top`` on traces with several inference calls, against a real
``latscope serve``: a multi-call trace id shows the run (critical path budget, the calls, the
waterfall with the calls marked), a request id or a single-call trace id shows the request, and
``top`` asks the REST API named by ``--url`` / ``LATSCOPE_URL`` and lists request ids that
``explain`` takes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from latscope.cli import main
from latscope.cmd.top import RestFeed
from tests.agent_surfaces import (
    PARALLEL_SEEDS,
    SINGLE_CALL_SEED,
    export,
    recent_run,
    send_runs,
    wait_live_caught_up,
    wait_runs_attributed,
)
from tests.agent_traces import AgentRun
from tests.serve_support import Server, start_serve

pytestmark = pytest.mark.subprocess

#: A settle window far longer than the collector's batches are apart (0.2 s): a run's spans are
#: in the store, client spans and all, before its trace settles, so every request is keyed by
#: its client span. The runs, with their tool calls, are attributed once settled.
ATTRIBUTION = ("--attribution-settle-s", "3", "--attribution-poll-s", "0.1")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, list[AgentRun]]]:
    server = start_serve(Path(tmp_path_factory.mktemp("cli-traces")) / "store", *ATTRIBUTION)
    try:
        runs = send_runs(server, (PARALLEL_SEEDS[1], SINGLE_CALL_SEED))
        wait_runs_attributed(server, runs)
        yield server, runs
    finally:
        server.stop()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def api(server: Server, path: str) -> dict:
    return httpx.get(server.url(path), timeout=30).json()


def test_explain_a_multi_call_trace_shows_its_run(served, capsys) -> None:
    server, runs = served
    agent = runs[0]
    code, out, err = run(capsys, "explain", agent.trace_id, "--url", server.http)
    assert code == 0, err
    body = api(server, f"/v1/traces/{agent.trace_id}/run")
    budget = body["critical_path_ms"]
    assert f"trace {agent.trace_id}" in out
    assert f"{len(agent.requests)} inference call(s)" in out
    assert "critical path" in out
    lines = out.splitlines()

    def row(label: str) -> str:
        return next(line for line in lines if line.strip().startswith(label))

    assert f"{budget['llm']:.1f} ms" in row("LLM calls")
    assert f"{budget['tool']:.1f} ms" in row("tool calls")
    assert f"{budget['app']:.1f} ms" in row("app (orchestration)")
    assert f"{budget['llm_buckets']['decode']:.1f} ms" in row("LLM decode")
    # Every call with its time on the path and its dominant bucket, its whole request id (what
    # explain takes), and its span marked in the waterfall.
    for n, call in enumerate(body["calls"], 1):
        figures, ids, marked = [x for x in lines if x.startswith(f"call {n} ")]
        buckets = call["attribution"]["buckets_ms"]
        top = max((b for b in buckets if buckets[b]), key=lambda b: buckets[b])
        assert figures.split()[-1] == top
        if call["on_critical_path_ms"]:
            assert f"{call['on_critical_path_ms']:.1f} ms" in figures
        else:
            assert "—" in figures
        assert ids.split() == ["call", str(n), call["request_id"]]
        assert "▇" in marked
    for t in body["tools"]:
        assert t["name"] in out


def test_explain_json_is_the_api_answer(served, capsys) -> None:
    server, runs = served
    agent, single = runs
    code, out, _ = run(capsys, "explain", agent.trace_id, "--url", server.http, "--json")
    assert code == 0 and json.loads(out) == api(server, f"/v1/traces/{agent.trace_id}")
    rid = agent.requests[3].request_id
    code, out, _ = run(capsys, "explain", rid, "--url", server.http, "--json")
    assert code == 0 and json.loads(out) == api(server, f"/v1/requests/{rid}")
    code, out, _ = run(capsys, "explain", single.trace_id, "--url", server.http, "--json")
    assert code == 0 and json.loads(out) == api(server, f"/v1/requests/{single.trace_id}")


def test_explain_a_request_of_the_trace_shows_that_call(served, capsys) -> None:
    server, runs = served
    agent = runs[0]
    truth = agent.requests[2]
    code, out, err = run(capsys, "explain", truth.request_id, "--url", server.http)
    assert code == 0, err
    assert f"request {truth.request_id}" in out
    for bucket, ns in truth.buckets.items():
        line = next(x for x in out.splitlines() if x.startswith(f"{bucket} "))
        assert f"{ns / 1e6:.1f} ms" in line, (bucket, line)
    assert f"its trace holds {len(agent.requests)} calls" in out
    # A single-call trace's id still names its request.
    single = runs[1]
    code, out, _ = run(capsys, "explain", single.trace_id, "--url", server.http)
    assert code == 0 and f"request {single.requests[0].request_id}" in out


def test_explain_an_unknown_call_names_the_calls(served, capsys) -> None:
    server, runs = served
    agent = runs[0]
    code, out, err = run(capsys, "explain", f"{agent.trace_id}-{'0' * 16}", "--url", server.http)
    assert code == 2 and out == ""
    assert "request_not_found" in err and agent.requests[0].request_id in err


def test_span_shows_one_span_whole_as_the_api_gives_it(served, capsys) -> None:
    server, runs = served
    agent = runs[0]
    rid = agent.requests[1].request_id
    span_id = rid.split("-")[1]
    code, out, _ = run(capsys, "span", agent.trace_id, span_id, "--url", server.http, "--json")
    stored = api(server, f"/v1/traces/{agent.trace_id}/spans/{span_id}")
    assert code == 0 and json.loads(out) == stored and stored["attributes"]
    code, out, err = run(capsys, "span", agent.trace_id, span_id, "--url", server.http)
    assert code == 0, err
    assert f"span {span_id}  {stored['name']}  Client" in out
    lines = out.splitlines()
    for key, value in stored["attributes"].items():
        assert any(line.split() == [key, value] for line in lines), (key, value)
    code, out, err = run(capsys, "span", agent.trace_id, "0" * 16, "--url", server.http)
    assert code == 2 and out == "" and "span_not_found" in err


def _top(
    monkeypatch: pytest.MonkeyPatch, run_: AgentRun, *argv: str
) -> tuple[threading.Thread, list[int]]:
    """``latscope top *argv`` on a thread, started once it has taken its cursor (requests
    attributed after that are news to it); the list gets its exit code. Its feed holds the
    requests of ``run_`` alone: the server is the module's, and a request of an earlier test's
    run may still reach the live feed (top has no flag for a trace)."""
    connected = threading.Event()
    connect, ask = RestFeed.connect, RestFeed._ask

    def connect_then_tell(feed: RestFeed) -> None:
        connect(feed)
        connected.set()

    def ask_for_the_run(feed: RestFeed) -> list[dict]:
        return [r for r in ask(feed) if r["trace_id"] == run_.trace_id]

    monkeypatch.setattr(RestFeed, "connect", connect_then_tell)
    monkeypatch.setattr(RestFeed, "_ask", ask_for_the_run)
    code: list[int] = []
    thread = threading.Thread(target=lambda: code.append(main(["top", *argv])), daemon=True)
    thread.start()
    assert connected.wait(60), "top never took its cursor"
    return thread, code


def test_top_follows_latscope_url_and_lists_request_ids_explain_takes(
    served, capsys, monkeypatch
) -> None:
    server, _ = served
    run_ = recent_run(1, ago_s=5)
    wait_live_caught_up(server)  # what top sees next is this run alone
    want = {t.request_id for t in run_.requests}
    # No --url: LATSCOPE_URL names the API (and no gRPC address is given anywhere).
    monkeypatch.setenv("LATSCOPE_URL", server.http)
    monkeypatch.setenv("LATSCOPE_OTLP_GRPC", "127.0.0.1:9")
    top, code = _top(monkeypatch, run_, "--json", "--count", str(len(want)), "--duration", "60")
    export(server.grpc, run_)
    top.join(90)
    out, err = capsys.readouterr()
    assert code == [0], err
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert {r["request_id"] for r in rows} == want
    for rid in sorted(want)[:2]:
        code, text, _ = run(capsys, "explain", rid, "--url", server.http)
        assert code == 0 and f"request {rid}" in text


def test_top_screen_shows_whole_request_ids(served, capsys, monkeypatch) -> None:
    server, _ = served
    run_ = recent_run(2, ago_s=5)
    wait_live_caught_up(server)  # what top sees next is this run alone
    want = {t.request_id for t in run_.requests}
    monkeypatch.setenv("COLUMNS", "100")
    top, code = _top(monkeypatch, run_, "--url", server.http, "--count", str(len(want)))
    export(server.grpc, run_)
    top.join(90)
    out, err = capsys.readouterr()
    assert code == [0], err
    assert f"{len(want)} requests seen" in out
    for rid in want:
        assert rid in out, out


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--url", "http://127.0.0.1:9"], {}, "no API at http://127.0.0.1:9"),
        ([], {"LATSCOPE_URL": "http://127.0.0.1:9"}, "no API at http://127.0.0.1:9"),
        (["--grpc", "127.0.0.1:9"], {}, "no latscope gRPC at 127.0.0.1:9"),
    ],
)
def test_top_without_a_server_says_so_and_draws_nothing(argv, env, message) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "latscope.cli", "top", *argv, "--duration", "10"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert proc.returncode == 1
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""  # no empty table with the error glued under it
