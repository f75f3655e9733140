"""The web page on traces with several inference calls, in headless Debian chromium: a multi-call
trace shows the run's budget bar (LLM buckets, tool, app) and its waterfall with each call marked;
a call opened from it shows its own buckets and spans; the token timeline has an axis and labels
that never overlap. Screenshots of each."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page

from tests.agent_surfaces import (
    PARALLEL_SEEDS,
    SINGLE_CALL_SEED,
    send_runs,
    wait_runs_attributed,
)
from tests.agent_traces import AgentRun
from tests.serve_support import Server, start_serve
from tests.surfaces import FAST_ATTRIBUTION
from tests.web_support import screenshot

pytestmark = [pytest.mark.subprocess, pytest.mark.browser]

RUN_PARTS = ("network", "queue", "preprocess", "prefill", "decode", "postprocess", "other",
             "tool", "app")  # fmt: skip


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, list[AgentRun]]]:
    server = start_serve(Path(tmp_path_factory.mktemp("web-traces")) / "store", *FAST_ATTRIBUTION)
    try:
        runs = send_runs(server, (PARALLEL_SEEDS[1], SINGLE_CALL_SEED))
        # Every call attributed before a page opens: the page's counts and the API's asked a
        # moment later would differ by a row written in between.
        wait_runs_attributed(server, runs)
        yield server, runs
    finally:
        server.stop()


def api(server: Server, path: str) -> dict:
    response = httpx.get(server.url(path), timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    assert errors == []
    page.close()


def _open(page: Page, server: Server, fragment: str) -> None:
    page.evaluate("document.body && document.body.removeAttribute('data-request')")
    page.goto(server.url(f"/#{fragment}"))
    page.wait_for_selector("body[data-request=ok], body[data-request=error]", timeout=30_000)
    assert page.get_attribute("body", "data-request") == "ok", page.inner_text("#error")
    # The charts above the card may still be drawing: the card is where it stays once they are.
    page.wait_for_selector("body[data-settled=ok]", timeout=60_000)


def _num(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f}"


def overlapping_labels(page: Page, selector: str) -> list[tuple[str, str]]:
    """Pairs of text labels inside ``selector`` whose boxes intersect (as drawn), and labels that
    stick out of it."""
    return page.evaluate(
        """(selector) => {
          const svg = document.querySelector(selector);
          const frame = svg.getBoundingClientRect();
          const boxes = [...svg.querySelectorAll("text")]
            .map((t) => [t.textContent, t.getBoundingClientRect()]);
          const bad = [];
          for (const [text, b] of boxes) {
            const out = b.left < frame.left - 0.5 || b.right > frame.right + 0.5;
            if (out) bad.push([text, "outside"]);
          }
          for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
            const [ta, a] = boxes[i], [tb, b] = boxes[j];
            const across = a.left < b.right && b.left < a.right;
            const meet = across && a.top < b.bottom && b.top < a.bottom;
            if (meet) bad.push([ta, tb]);
          }
          return bad;
        }""",
        selector,
    )


def test_a_multi_call_trace_shows_its_run(served, page: Page, tmp_path: Path) -> None:
    server, runs = served
    agent = runs[0]
    _open(page, server, f"trace={agent.trace_id}")
    body = api(server, f"/v1/traces/{agent.trace_id}")
    run = body["run"]
    budget = run["critical_path_ms"]
    assert page.is_visible("#run") and page.inner_text("#run-id") == agent.trace_id
    assert f"{len(run['calls'])} inference call(s)" in page.inner_text("#run-summary")
    assert page.is_hidden("#request-body")
    # The budget bar and table: the seven LLM buckets, tool and app, as the API says.
    parts = {**budget["llm_buckets"], "tool": budget["tool"], "app": budget["app"]}
    total = sum(parts.values())
    for part in RUN_PARTS:
        cell = page.inner_text(f"#run-budget tr[data-part={part}] td.ms")
        assert cell == _num(parts[part]), part
        seg = page.locator(f"#run-bar .seg[data-bucket={part}]")
        if parts[part] > 0:
            assert float(seg.get_attribute("data-share")) == pytest.approx(
                parts[part] / total, abs=1e-4
            ), part
        else:
            assert seg.count() == 0
    assert page.inner_text("#run-budget tr[data-part=llm] td.ms") == _num(budget["llm"])
    assert page.inner_text("#run-budget tr[data-part=e2e] td.ms") == _num(run["e2e_ms"])
    # Every call: its request id, its time on the critical path.
    rows = page.locator("#run-calls tbody tr")
    assert rows.count() == len(run["calls"]) == len(agent.requests)
    for call in run["calls"]:
        row = page.locator(f"#run-calls tr[data-request='{call['request_id']}']")
        assert row.locator("a.call").inner_text() == call["request_id"]
        on_path = call["on_critical_path_ms"]
        assert row.locator("td.on-path").inner_text() == (_num(on_path) if on_path else "–")
    # The waterfall: every span, each call's span marked (and numbered as in the table).
    assert page.locator("#run-waterfall .span").count() == len(body["spans"])
    marked = page.locator("#run-waterfall .span.call")
    assert marked.count() == len(run["calls"])
    for n, call in enumerate(run["calls"], 1):
        span = page.locator(f"#run-waterfall .span[data-request='{call['request_id']}']")
        assert span.locator("a.mark").inner_text() == f"call {n}"
    screenshot(page, tmp_path, "latscope-run.png")


def test_a_call_opened_from_the_run_shows_its_own_buckets(
    served, page: Page, tmp_path: Path
) -> None:
    server, runs = served
    agent = runs[0]
    _open(page, server, f"trace={agent.trace_id}")
    run = api(server, f"/v1/traces/{agent.trace_id}/run")
    call = run["calls"][3]
    rid = call["request_id"]
    page.evaluate("document.body.removeAttribute('data-request')")
    page.locator(f"#run-calls tr[data-request='{rid}'] a.call").click()
    page.wait_for_selector("body[data-request=ok]", timeout=30_000)
    assert page.inner_text("#request-id") == rid
    assert page.is_visible("#run")  # the run stays above the call
    assert page.get_attribute(f"#run-calls tr[data-request='{rid}']", "class") == "open"
    explained = api(server, f"/v1/requests/{rid}")
    assert explained["attribution"] == call["attribution"]
    for bucket, value in explained["attribution"]["buckets_ms"].items():
        cell = page.inner_text(f"#request-buckets tr[data-bucket={bucket}] td.ms")
        assert cell == _num(value), bucket
    # Its own spans only: the marked span and everything under it.
    spans = explained["spans"]
    top = next(s for s in spans if s["request_id"] == rid)
    own, grew = {top["span_id"]}, True
    while grew:
        before = len(own)
        own |= {s["span_id"] for s in spans if s["parent_span_id"] in own}
        grew = len(own) > before
    assert page.locator("#waterfall .span").count() == len(own) < len(spans)
    assert f"its trace holds {len(run['calls'])} calls" in page.inner_text("#waterfall-note")
    assert overlapping_labels(page, "#tokens") == []
    screenshot(page, tmp_path, "latscope-run-call.png")
    # A waterfall mark opens its call too.
    other = run["calls"][0]["request_id"]
    page.evaluate("document.body.removeAttribute('data-request')")
    page.locator(f"#run-waterfall .span[data-request='{other}'] a.mark").click()
    page.wait_for_selector("body[data-request=ok]", timeout=30_000)
    assert page.inner_text("#request-id") == other


def test_a_single_call_trace_or_a_request_id_shows_the_request(served, page: Page) -> None:
    server, runs = served
    agent, single = runs
    _open(page, server, f"trace={single.trace_id}")
    (truth,) = single.requests
    assert page.inner_text("#request-id") == truth.request_id
    assert page.is_hidden("#run")
    rid = agent.requests[1].request_id
    _open(page, server, f"trace={rid}")
    assert page.inner_text("#request-id") == rid and page.is_hidden("#run")
    # The form takes a request id (49 characters) as well as a trace id.
    page.fill("#trace-input", agent.trace_id)
    page.evaluate("document.body.removeAttribute('data-request')")
    page.click("#request-form button")
    page.wait_for_selector("body[data-request=ok]", timeout=30_000)
    assert page.is_visible("#run") and page.inner_text("#run-id") == agent.trace_id


#: (request e2e ms, first token ms, token times ms): a first token at the very end, a short
#: request, one of seconds, sub-millisecond ticks, tokens far apart.
TOKEN_CASES = [
    (1000.0, 990.0, [990.0, 995.0, 999.0]),
    (460.0, 345.0, [345.0, 365.0, 385.0, 460.0]),
    (12_345.0, 20.0, [20.0 + 30 * i for i in range(400)]),
    (3.2, 0.4, [0.4, 1.0, 2.9]),
    (86.0, 2.0, [2.0, 80.0]),
]


def test_token_timeline_has_an_axis_and_labels_that_do_not_overlap(served, page: Page) -> None:
    server, runs = served
    _open(page, server, f"trace={runs[1].trace_id}")
    for width in (1400, 700):
        page.set_viewport_size({"width": width, "height": 1000})
        for total_ms, first_ms, times_ms in TOKEN_CASES:
            tokens = {"count": len(times_ms), "times_ms": times_ms, "first_token_ms": first_ms,
                      "stall_threshold_ms": 250.0, "stalls": []}  # fmt: skip
            page.evaluate("([t, total]) => renderTokens(t, total)", [tokens, total_ms])
            assert page.locator("#tokens line.axis").count() == 1
            assert page.locator("#tokens line.tok").count() == len(times_ms)
            ticks = [float(t) for t in page.locator("#tokens text.tick").evaluate_all(
                "(ts) => ts.map((t) => t.dataset.ms)")]  # fmt: skip
            assert len(ticks) >= 2 and ticks == sorted(ticks)
            assert ticks[0] == 0 and ticks[-1] == pytest.approx(total_ms)
            assert "first token" in (page.text_content("#tokens text.first-label") or "")
            assert overlapping_labels(page, "#tokens") == [], (width, total_ms)


def test_opening_a_trace_asks_the_right_routes_and_brings_it_into_view(served, page: Page) -> None:
    server, runs = served
    agent, single = runs
    failed: list[str] = []
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    # A multi-call trace: asked as a trace (no 409 for "several requests" first), shown in view.
    _open(page, server, f"trace={agent.trace_id}")
    assert page.is_visible("#run")
    assert _in_view(page, "#run")
    # A single-call trace by its trace id: its request, in view.
    _open(page, server, f"trace={single.trace_id}")
    assert page.is_visible("#request-body") and page.is_hidden("#run")
    assert page.inner_text("#request-id") == single.requests[0].request_id
    assert _in_view(page, "#request")
    # A request opened from the slowest list, at the top of a long page: brought into view.
    page.evaluate("window.scrollTo(0, 0)")
    page.evaluate("document.body.removeAttribute('data-request')")
    page.locator("#slowest-table a.trace").first.click()
    page.wait_for_selector("body[data-request=ok]", timeout=30_000)
    assert _in_view(page, "#request")
    assert failed == []


def _in_view(page: Page, selector: str) -> bool:
    return page.evaluate(
        """(selector) => {
          const top = document.querySelector(selector).getBoundingClientRect().top;
          return top >= -1 && top < window.innerHeight / 2;
        }""",
        selector,
    )


def test_the_page_opens_on_the_data(served, page: Page) -> None:
    # The runs were sent seconds ago: the page's default hour would show them as a sliver at its
    # right edge; it opens on their own span instead.
    server, _ = served
    page.goto(server.url("/"))
    page.wait_for_selector("body[data-loaded]", timeout=60_000)
    assert page.get_attribute("body", "data-loaded") == "ok", page.inner_text("#error")
    label = page.inner_text("#range-label")
    assert label.startswith("Showing "), label
    since, until = label.removeprefix("Showing ").rstrip(".").split(" → ")
    body = api(server, f"/v1/attribution/timeseries?since={since}&until={until}")
    window = body["window"]
    assert window["until_ns"] - window["since_ns"] < 30 * 60 * 10**9  # not the hour
    everything = api(server, "/v1/attribution/summary?since=1h")["count"]
    assert (
        api(server, f"/v1/attribution/summary?since={since}&until={until}")["count"] == everything
    )
    assert int(page.inner_text("#summary-count")) == everything
