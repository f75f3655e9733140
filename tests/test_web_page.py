"""The web page in headless Debian chromium (Playwright): real data from a running server, the
right numbers on screen, a screenshot."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page

from tests.serve_support import Server, start_serve
from tests.web_support import screenshot

pytestmark = [pytest.mark.subprocess, pytest.mark.browser]


def api(server: Server, path: str, **params: object) -> dict:
    return httpx.get(server.url(path), params=params, timeout=30).json()


def _cells(page: Page, selector: str) -> list[str]:
    return [c.strip() for c in page.locator(selector).all_inner_texts()]


def test_page_shows_the_numbers_of_the_api(served, browser: Browser, tmp_path: Path) -> None:
    server, specs = served
    stalled = next(s for s in specs if s.model == "llama-3-70b")
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(server.url(f"/#trace={stalled.trace_id}"))
    page.wait_for_selector("body[data-loaded]", timeout=30_000)
    # The request loads beside the rest of the page: wait until it is done either way.
    page.wait_for_selector("body[data-request]:not([data-request=loading])", timeout=30_000)
    assert page.get_attribute("body", "data-loaded") == "ok", page.inner_text("#error")
    assert page.get_attribute("body", "data-request") == "ok"

    summary = api(server, "/v1/attribution/summary", since="1h", group_by="model")
    assert page.inner_text("#summary-count") == str(summary["count"])
    for bucket, figures in summary["buckets_ms"].items():
        row = f"#percentile-table tr[data-bucket={bucket}] td"
        assert _cells(page, row)[1:4] == [
            f"{figures['p50']:.1f}",
            f"{figures['p95']:.1f}",
            f"{figures['p99']:.1f}",
        ], bucket
        share = page.get_attribute(
            f"#budget-bars .row[data-group=all] .seg[data-bucket={bucket}]", "data-share"
        )
        if figures["share"]:
            assert float(share) == pytest.approx(figures["share"], abs=1e-4), bucket
    groups = {g["key"]: g["count"] for g in summary["groups"]}
    for key, count in groups.items():
        assert page.inner_text(f"#budget-bars .row[data-group='{key}'] .n") == str(count)

    tail = api(server, "/v1/attribution/tail", since="1h")
    assert f"most of the extra is {tail['dominant']}" in page.inner_text("#tail-text")
    assert page.get_attribute(f"#tail-table tr[data-bucket={tail['dominant']}]", "class") == (
        "dominant"
    )
    assert page.locator("#verdicts li[data-verdict=queue_tail]").count() == 1

    gpu = api(server, "/v1/gpu", since="1h")["phases"]["prefill"]["utilization_mean"]
    row = "#gpu-table tr[data-phase=prefill][data-figure=utilization_mean]"
    assert page.inner_text(f"{row} td.mean") == f"{gpu['mean']:.1f}"

    slowest = api(server, "/v1/requests", since="1h", limit=15)["requests"]
    rows = page.locator("#slowest-table tbody tr")
    assert rows.count() == len(slowest)
    assert rows.first.get_attribute("data-trace") == slowest[0]["trace_id"]
    assert rows.first.locator("td.e2e").inner_text() == f"{slowest[0]['e2e_ms']:.1f}"

    # The chosen request: buckets, waterfall, tokens with the stall.
    explained = api(server, f"/v1/requests/{stalled.trace_id}")
    for bucket, value in explained["attribution"]["buckets_ms"].items():
        cell = page.inner_text(f"#request-buckets tr[data-bucket={bucket}] td.ms")
        assert cell == ("–" if value is None else f"{value:.1f}"), bucket
    # The only llama-3-70b request: no peers, no percentiles (one with peers is opened below).
    assert explained["standing"]["peers"] == 0
    assert "started in the hour before it: no percentiles" in page.inner_text("#request-standing")
    assert page.locator("#waterfall .span").count() == len(explained["spans"])
    assert page.locator("#tokens line.tok").count() == len(stalled.token_offsets_us)
    assert page.locator("#tokens rect.stall").count() == 1
    assert "token 10" in page.inner_text("#stalls")

    # Compare: the default windows are the last hour against the hour before.
    page.wait_for_selector("#compare-table tbody tr")
    compare = api(
        server, "/v1/attribution/compare",
        before_since="2h", before_until="1h", after_since="1h",
    )  # fmt: skip
    text = page.inner_text("#compare-text")
    assert f"before: {compare['before']['count']} requests" in text
    assert f"after: {compare['after']['count']} requests" in text
    assert f"biggest mover: {compare['mover']}" in text
    screenshot(page, tmp_path, "latscope-page.png")

    # Choosing a request in the slowest list opens it (shown by its request id).
    rows.first.locator("a.trace").click()
    opened = api(server, f"/v1/requests/{slowest[0]['trace_id']}/attribution")["request_id"]
    page.wait_for_function(
        f"document.querySelector('#request-id').textContent === '{opened}'", timeout=30_000
    )
    assert page.locator("#run").is_hidden()  # one call: no run to show
    queue = page.inner_text("#request-buckets tr[data-bucket=queue] td.ms")
    assert queue == f"{slowest[0]['buckets_ms']['queue']:.1f}"
    # Where it stands among its peers: each bucket's percentile, as the API ranks it.
    standing = api(server, f"/v1/requests/{opened}")["standing"]
    for bucket, rank in standing["percentiles"].items():
        if bucket in ("e2e", "ttft", "tpot"):
            continue
        cell = page.inner_text(f"#request-buckets tr[data-bucket={bucket}] td.rank")
        assert cell == ("–" if rank is None else f"p{rank:.1f}"), bucket
    text = page.inner_text("#request-standing")
    if standing["peers"]:
        assert text.startswith(f"Percentiles among the {standing['peers']} requests of ")
    else:
        assert "no percentiles" in text
    assert errors == []
    page.close()


def test_page_asks_for_the_token(tmp_path: Path, browser: Browser) -> None:
    server = start_serve(tmp_path / "store", env={"LATSCOPE_TOKEN": "web-token"})
    try:
        page = browser.new_page()
        page.goto(server.url("/"))
        page.wait_for_selector("#auth:not([hidden])", timeout=30_000)
        assert "needs a token" in page.inner_text("#auth")
        page.fill("#token", "web-token")
        page.click("#auth-form button")
        page.wait_for_selector("body[data-loaded=ok]", timeout=30_000)
        assert page.inner_text("#summary-count") == "0"
        screenshot(page, tmp_path, "latscope-page-token.png")
        page.close()
    finally:
        server.stop()
