"""Conversations across traces, end to end: agent runs (tests/agent_traces.py) sent over OTLP to
a real ``latscope serve``, three of them one conversation named three ways (the GenAI
convention's ``gen_ai.conversation.id``, OpenInference's ``session.id`` on an inner span only,
traceloop's session association property); the REST answer against each turn's own run, the
listing, the CLI and the web page."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openinference.semconv.trace import SpanAttributes as OpenInference
from playwright.sync_api import Browser

from latscope.cli import main
from latscope.semconv import BUCKETS, CONVERSATION_KEYS
from tests.agent_surfaces import export, recent_run, wait_stored
from tests.agent_traces import AgentRun
from tests.serve_support import Server, start_serve
from tests.web_support import screenshot

pytestmark = pytest.mark.subprocess

DDL = Path(__file__).resolve().parents[1] / "deploy/clickhouse/013_conversations.sql"
TALK, OTHER = "conv-7f3a", "conv/other 2"


def _tag(run: AgentRun, key: str, value: str, *, root: bool = True) -> None:
    """Put ``key=value`` on the run's root span, or (``root=False``) on one span under it."""
    span = next(s for s in run.built.spans if (s.span_id.hex() == run.root_span_id) == root)
    kv = span.attributes.add()
    kv.key = key
    kv.value.string_value = value


@pytest.fixture(scope="module")
def talk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, list[AgentRun]]]:
    """Three turns of ``TALK`` (one run of them named on an inner span only), a run of ``OTHER``
    and one of no conversation."""
    server = start_serve(tmp_path_factory.mktemp("conversations") / "store")
    try:
        turns = [recent_run(seed, ago_s=ago) for seed, ago in ((0, 300), (16, 200), (23, 100))]
        _tag(turns[0], "gen_ai.conversation.id", TALK)
        _tag(turns[1], OpenInference.SESSION_ID, TALK, root=False)
        _tag(turns[2], "traceloop.association.properties.session_id", TALK)
        other, alone = recent_run(5, ago_s=150), recent_run(7, ago_s=120)
        _tag(other, "gen_ai.conversation.id", OTHER)
        for run in [*turns, other, alone]:
            export(server.grpc, run)
        for run in [*turns, other, alone]:
            wait_stored(server, run)
        yield server, turns
    finally:
        server.stop()


def _get(server: Server, path: str, **params: object) -> httpx.Response:
    return httpx.get(server.url(path), params=params, timeout=60)


def test_the_conversation_keys_are_upstreams_and_the_stores() -> None:
    assert CONVERSATION_KEYS[1] == OpenInference.SESSION_ID
    read = re.findall(r"SpanAttributes\['([^']+)'\]", DDL.read_text())
    assert list(dict.fromkeys(read)) == list(CONVERSATION_KEYS)  # the same keys, in order


def test_a_conversation_of_several_traces_shows_as_one(talk) -> None:
    server, turns = talk
    body = _get(server, f"/v1/conversations/{TALK}").json()
    assert body["conversation_id"] == TALK
    assert body["turn_count"] == 3 and body["truncated"] is False
    assert [t["trace_id"] for t in body["turns"]] == [r.trace_id for r in turns]
    runs = [_get(server, f"/v1/traces/{r.trace_id}/run").json() for r in turns]
    for turn, run in zip(body["turns"], runs, strict=True):
        # Each turn's critical path is its trace's run, as /v1/traces/{id}/run explains it.
        assert turn["critical_path_ms"] == run["critical_path_ms"]
        assert (turn["e2e_ms"], turn["root"], turn["path"]) == (
            run["e2e_ms"], run["root"], run["path"],
        )  # fmt: skip
        assert (turn["calls"], turn["tools"]) == (len(run["calls"]), len(run["tools"]))
    first = body["turns"][0]
    assert first["offset_ms"] == 0.0 and first["gap_ms"] is None
    for before, after in zip(body["turns"], body["turns"][1:], strict=False):
        assert after["gap_ms"] == pytest.approx(
            after["offset_ms"] - before["offset_ms"] - before["e2e_ms"], abs=1e-3
        )
    # The conversation's time by bucket, tool and app: the turns' critical paths added up.
    total = body["critical_path_ms"]
    for part in ("llm", "tool", "app"):
        assert total[part] == pytest.approx(sum(r["critical_path_ms"][part] for r in runs))
    for b in BUCKETS:
        want = sum(r["critical_path_ms"]["llm_buckets"][b] for r in runs)
        assert total["llm_buckets"][b] == pytest.approx(want)
    assert body["busy_ms"] == pytest.approx(sum(r["e2e_ms"] for r in runs))
    assert total["llm"] + total["tool"] + total["app"] == pytest.approx(body["busy_ms"])
    tools = {t["tool"]: t for t in body["tools"]}
    for name in {t["tool"] or t["name"] for r in runs for t in r["tools"]}:
        used = [t for r in runs for t in r["tools"] if (t["tool"] or t["name"]) == name]
        assert tools[name]["calls"] == len(used)
        assert tools[name]["on_critical_path_ms"] == pytest.approx(
            sum(t["on_critical_path_ms"] for t in used)
        )


def test_the_latest_turns_and_unknown_conversations(talk) -> None:
    server, turns = talk
    body = _get(server, f"/v1/conversations/{TALK}", limit_turns=2).json()
    assert body["turn_count"] == 3 and body["truncated"] is True
    assert [t["trace_id"] for t in body["turns"]] == [r.trace_id for r in turns[1:]]
    missing = _get(server, "/v1/conversations/no-such-talk")
    assert missing.status_code == 404
    assert missing.json()["error"] == "conversation_not_found"
    assert _get(server, f"/v1/conversations/{TALK}", limit_turns=0).status_code == 422


def test_the_window_lists_its_conversations(talk) -> None:
    server, _ = talk
    body = _get(server, "/v1/conversations", since="1h").json()
    seen = {c["conversation_id"]: c for c in body["conversations"]}
    assert set(seen) == {TALK, OTHER}
    assert seen[TALK]["traces"] == 3 and seen[OTHER]["traces"] == 1
    assert [c["conversation_id"] for c in body["conversations"]] == [TALK, OTHER]  # latest first
    # A conversation id with a slash and a space still names its conversation.
    assert _get(server, f"/v1/conversations/{OTHER}").json()["turn_count"] == 1
    old = _get(server, "/v1/conversations", since="2h", until="1h").json()
    assert old["conversations"] == []


def test_cli_shows_and_lists_conversations(talk, capsys) -> None:
    server, turns = talk
    code = main(["conversation", TALK, "--url", server.http])
    out = capsys.readouterr().out
    assert code == 0
    assert f"conversation {TALK}" in out and "3 turn(s)" in out
    for run in turns:
        assert run.trace_id in out
    assert main(["conversation", TALK, "--url", server.http, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == _get(server, f"/v1/conversations/{TALK}").json()
    assert main(["conversation", "--url", server.http]) == 0
    listed = capsys.readouterr().out
    assert TALK in listed and OTHER in listed
    assert main(["conversation", "nope", "--url", server.http]) == 2
    assert "conversation_not_found" in capsys.readouterr().err


@pytest.mark.browser
def test_the_web_page_shows_the_conversation(talk, browser: Browser, tmp_path: Path) -> None:
    server, turns = talk
    page = browser.new_page(viewport={"width": 1400, "height": 1200})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(server.url("/"))
    page.wait_for_selector("body[data-loaded]", timeout=60_000)
    listed = page.locator("#conversations-table tbody tr")
    assert {listed.nth(i).get_attribute("data-conversation") for i in range(listed.count())} == {
        TALK, OTHER,
    }  # fmt: skip
    page.locator(f"#conversations-table tr[data-conversation='{TALK}'] a").click()
    page.wait_for_selector("body[data-conversation=ok]", timeout=60_000)
    body = _get(server, f"/v1/conversations/{TALK}").json()
    rows = page.locator("#conversation-turns tbody tr")
    assert [rows.nth(i).get_attribute("data-trace") for i in range(rows.count())] == [
        r.trace_id for r in turns
    ]
    for row, turn in zip(body["turns"], range(rows.count()), strict=True):
        assert rows.nth(turn).locator("td.e2e").inner_text() == f"{row['e2e_ms']:.1f}"
        assert rows.nth(turn).locator("td.tool").inner_text() == (
            f"{row['critical_path_ms']['tool']:.1f}"
        )
    tool = page.inner_text("#conversation-budget tr[data-part=tool] td.ms")
    assert tool == f"{body['critical_path_ms']['tool']:.1f}"
    screenshot(page, tmp_path, "latscope-conversation.png")
    # A turn opens its run.
    rows.first.locator("a.turn").click()
    page.wait_for_selector("body[data-request=ok]", timeout=60_000)
    assert page.inner_text("#run-id") == turns[0].trace_id
    assert errors == []
    page.close()
