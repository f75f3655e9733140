"""The web page's views over time and across dimensions in headless Debian chromium: the chart,
the heatmap and its brush, what is different and the cold starts show the API's numbers; dragging
picks a window or a set of requests; screenshots of each."""

from __future__ import annotations

import itertools
import shutil
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page

from tests import planted
from tests.serve_support import Server, start_serve
from tests.web_support import screenshot

pytestmark = [pytest.mark.subprocess, pytest.mark.browser]

S = 10**9


@pytest.fixture(scope="module")
def served() -> Iterator[Server]:
    path = planted.store_dir(time.time_ns() - 60 * S)
    server = start_serve(
        path, "--attributor", "off", "--warmup-requests", "0", "--warmup-s", str(planted.COLD_S)
    )
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(path.parent, ignore_errors=True)


def api(server: Server, path: str, **params: object) -> dict:
    response = httpx.get(server.url(path), params=params, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture
def page(served: Server, browser: Browser) -> Iterator[Page]:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(served.url("/"))
    page.wait_for_selector("body[data-loaded]", timeout=60_000)
    page.evaluate("document.body.removeAttribute('data-loaded')")
    page.select_option("#window", "6h")  # the planted requests span the last 3 hours
    page.wait_for_selector("body[data-loaded]", timeout=60_000)
    assert page.get_attribute("body", "data-loaded") == "ok", page.inner_text("#error")
    yield page
    assert errors == []
    page.close()


def _drag(page: Page, selector: str, x0: float, y0: float, x1: float, y1: float) -> None:
    """Press at (x0, y0) and release at (x1, y1), as fractions of the element's box."""
    box = page.locator(selector).bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] * x0, box["y"] + box["height"] * y0)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * x1, box["y"] + box["height"] * y1, steps=6)
    page.mouse.up()


def test_over_time_chart_and_dragging_a_window(served: Server, page: Page, tmp_path: Path) -> None:
    body = api(served, "/v1/attribution/timeseries", since="6h")
    points = body["series"][0]["points"]
    busy = [p for p in points if p["count"]]
    assert page.locator("#timeline-chart g.step").count() == len(busy)
    assert int(page.get_attribute("#timeline-chart", "data-points")) == len(points)
    first = page.locator("#timeline-chart g.step").first
    assert int(first.get_attribute("data-count")) == busy[0]["count"]
    assert float(first.get_attribute("data-mean")) == pytest.approx(
        busy[0]["e2e_ms"]["mean"], abs=1e-3
    )
    line = page.get_attribute("#timeline-chart polyline.p99", "data-count")
    assert int(line) == sum(1 for p in busy if p["e2e_ms"]["p99"] is not None)
    screenshot(page, tmp_path, "latscope-over-time.png")

    # Drag across the right half: the whole page now looks at that window.
    page.evaluate("document.body.removeAttribute('data-loaded')")
    _drag(page, "#timeline-chart", 0.55, 0.5, 0.95, 0.5)
    page.wait_for_selector("body[data-loaded]", timeout=60_000)
    label = page.inner_text("#range-label")
    assert label.startswith("Showing ")
    since, until = label.removeprefix("Showing ").rstrip(".").split(" → ")
    summary = api(served, "/v1/attribution/summary", since=since, until=until)
    assert page.inner_text("#summary-count") == str(summary["count"])
    assert 0 < summary["count"] < sum(p["count"] for p in points)
    page.click("#range-reset")
    page.wait_for_function("document.querySelector('#range-label').textContent === ''")


def test_heatmap_brush_selects_those_requests(served: Server, page: Page, tmp_path: Path) -> None:
    heat = api(served, "/v1/attribution/heatmap", since="6h")
    cells = sum(1 for column in heat["counts"] for n in column if n)
    assert page.locator("#heat-chart rect.cell").count() == cells
    assert int(page.get_attribute("#heat-chart", "data-count")) == heat["count"]
    # The slow requests of the last hours: the top third of the latency axis, right half.
    _drag(page, "#heat-chart", 0.6, 0.05, 0.97, 0.45)
    page.wait_for_function("document.querySelector('#why-selection').value === 'region'")
    page.wait_for_function(
        "document.querySelector('#why').dataset.count === "
        "document.querySelector('#heat-chart').dataset.brushed",
        timeout=30_000,
    )
    brushed = int(page.get_attribute("#heat-chart", "data-brushed"))
    assert brushed > 0
    assert f"Selected {brushed} requests" in page.inner_text("#heat-selected")
    assert page.locator("#why .dimension").count() >= 3
    screenshot(page, tmp_path, "latscope-heatmap-brushed.png")


def test_what_is_different_and_cold_starts(served: Server, page: Page, tmp_path: Path) -> None:
    body = api(served, "/v1/attribution/why", since="6h")
    top = body["top"]
    assert top["value"] == planted.SLOW_POD
    text = page.inner_text("#why-text")
    assert f"{top['dimension']} = {top['value']}" in text and "mostly queue" in text
    first = page.locator("#why .dimension").first
    assert first.get_attribute("data-dimension") == body["dimensions"][0]["dimension"]
    row = first.locator(f"tr[data-value='{planted.SLOW_POD}']")
    assert row.locator("td.extra").inner_text() == f"{top['extra_ms']:.1f} ms"
    segments = row.locator(".seg")
    assert segments.first.get_attribute("data-bucket") in ("queue", "network")

    cold = api(served, "/v1/attribution/coldstart", since="6h")
    assert page.get_attribute("#cold", "data-appeared") == str(cold["appeared"])
    for name in planted.NEW_REPLICAS:
        replica = next(r for r in cold["replicas"] if r["replica"] == name)
        cell = page.inner_text(f"#cold-table tr[data-replica='{name}'] td.warmup")
        assert cell == f"{replica['warmup_e2e_mean_ms']:.1f}"
        assert replica["warmup_e2e_mean_ms"] > replica["warm_e2e_mean_ms"]
    # The diagnosis says where the queue problem sits.
    assert f"where: resource.k8s.pod.name = {planted.SLOW_POD}" in page.inner_text("#verdicts")
    page.locator("#why").scroll_into_view_if_needed()
    screenshot(page, tmp_path, "latscope-why-cold.png")

    # The slowest selected requests open in the request view.
    links = page.locator("#why-examples a.trace")
    assert links.count() == len(body["examples"]) > 0
    assert links.first.get_attribute("data-trace") == body["examples"][0]["trace_id"]

    # A span attribute named on the page is ranked too: the tenant with long prompts, on TTFT.
    page.fill("#why-attributes", "tenant.id")
    page.click("#why-form button")
    page.wait_for_selector("#why .dimension[data-dimension='attribute.tenant.id']")

    # This window against the one before: the page asks the API the same question.
    page.select_option("#why-selection", "before")
    page.wait_for_function("document.querySelector('#why-text').textContent.includes('before')")
    before = api(served, "/v1/attribution/why", since="6h", selection="before")
    assert page.get_attribute("#why", "data-count") == str(before["selection"]["count"])


def test_an_alert_link_opens_its_window(served: Server, browser: Browser) -> None:
    """The SLO alerts' link (deploy/prometheus/latscope-slo.rules.yml: ``#since=&until=`` in
    RFC 3339, ``&service=``) opens the page on that window and service."""
    now = time.time_ns() - 60 * S
    since, until = (
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t // S)) for t in (now - 3600 * S, now)
    )
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(served.url(f"/#since={since}&until={until}&service=chat&model="))
    page.wait_for_selector("body[data-loaded]", timeout=60_000)
    assert page.get_attribute("body", "data-loaded") == "ok", page.inner_text("#error")
    assert page.input_value("#service") == "chat"
    assert page.inner_text("#range-label") == f"Showing {since} → {until}."
    summary = api(served, "/v1/attribution/summary", since=since, until=until, service="chat")
    assert summary["count"] > 0
    assert page.inner_text("#summary-count") == str(summary["count"])
    assert page.inner_text("#summary-window") == f"{since} → {until}"
    page.close()


def _value_ticks(page: Page, selector: str) -> list[str]:
    return page.eval_on_selector_all(
        f"{selector} text.tick.value", "nodes => nodes.map(n => n.textContent)"
    )


def _ms_of(label: str) -> float:
    value, unit = label.split(" ")
    return float(value) * (1000 if unit == "s" else 1)


def test_axes_are_round_and_the_heatmap_lines_up_with_the_chart(served: Server, page: Page) -> None:
    # Value ticks: a 1, 2 or 5 x 10^k step on the chart; 1, 2, 5 x 10^k ms on the heatmap's
    # log scale.
    values = [_ms_of(t) for t in _value_ticks(page, "#timeline-chart")]
    steps = {round(b - a, 6) for a, b in itertools.pairwise(values)}
    assert len(steps) == 1, values
    step = steps.pop()
    assert f"{step:e}"[0] in "125" and values[0] == 0, values
    for label in _value_ticks(page, "#heat-chart"):
        assert f"{_ms_of(label):e}"[0] in "1235" and f"{_ms_of(label):e}"[1:5] == ".000", label
    # Each heatmap column spans its step on the window's axis, as the chart's bar does.
    bars = page.eval_on_selector_all(
        "#timeline-chart g.step",
        "gs => gs.map(g => [g.dataset.start, +g.querySelector('rect').getAttribute('x')])",
    )
    cells = dict(
        page.eval_on_selector_all(
            "#heat-chart rect.cell",
            "cs => cs.map(c => [c.dataset.start, +c.getAttribute('x')])",
        )
    )
    shared = [(start, x) for start, x in bars if start in cells]
    assert len(shared) > 10
    for start, x in shared:
        assert cells[start] == pytest.approx(x, abs=0.5), start


def test_zoomed_in_the_time_axis_shows_seconds(served: Server, page: Page) -> None:
    body = api(served, "/v1/attribution/timeseries", since="6h")
    busy = [p for p in body["series"][0]["points"] if p["count"]]
    lo = busy[len(busy) // 2]["start_ns"]
    since = datetime.fromtimestamp(lo / 1e9, UTC).isoformat()
    until = datetime.fromtimestamp(lo / 1e9 + 240, UTC).isoformat()
    page.evaluate("document.body.removeAttribute('data-loaded')")
    page.goto(served.url(f"/#since={since}&until={until}"))
    page.wait_for_selector("body[data-loaded]", timeout=60_000)
    labels = page.eval_on_selector_all(
        "#timeline-chart text.tick:not(.value)", "ts => ts.map(t => t.textContent)"
    )
    times = [t for t in labels if t.count(":") == 2]
    assert len(times) == 7 and len(set(times)) == 7, labels
