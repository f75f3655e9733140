"""Headless Debian chromium for the web tests (the ``browser`` fixture lives in conftest.py), and
their screenshots."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import Page

CHROMIUM = os.environ.get("LATSCOPE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
#: Where the screenshots go (CI keeps them as artifacts when it sets this).
SHOTS = os.environ.get("LATSCOPE_SCREENSHOTS")


def screenshot(page: Page, tmp_path: Path, name: str) -> Path:
    """The whole page as a PNG in ``tmp_path`` (and in ``LATSCOPE_SCREENSHOTS`` when set)."""
    path = tmp_path / name
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(SHOTS) / name)
    return path
