"""``/docs`` works offline: Swagger UI's files come from a local package, never a CDN.

Headless Debian chromium loads the page with every request outside the server aborted (as on
a machine with no internet) and must render the API's operations.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser

from latscope.api.app import create_app
from latscope.config import Settings
from tests.sdk_support import run_app
from tests.serve_support import embedded_store

pytestmark = pytest.mark.browser


def test_docs_render_offline(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, browser: Browser
) -> None:
    app = create_app(embedded_store(tmp_path_factory), Settings())
    outside: list[str] = []
    with run_app(app) as base:
        html = httpx.get(f"{base}/docs", timeout=10).text
        assert "cdn" not in html.lower() and "/docs/static/swagger-ui-bundle.js" in html
        assert httpx.get(f"{base}/docs/static/swagger-ui.css", timeout=10).status_code == 200
        page = browser.new_page()
        try:

            def offline(route) -> None:
                if route.request.url.startswith(base):
                    route.continue_()
                else:
                    outside.append(route.request.url)
                    route.abort()

            page.route("**/*", offline)
            page.goto(f"{base}/docs")
            page.wait_for_selector(".swagger-ui .info .title", timeout=20_000)
            assert "latscope" in page.inner_text(".swagger-ui .info .title")
            page.wait_for_selector('[data-path="/v1/attribution/summary"]', timeout=20_000)
            page.screenshot(path=str(tmp_path / "docs.png"))
        finally:
            page.close()
    assert outside == []
