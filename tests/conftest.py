"""Fixtures shared across test modules, the test tiers' markers and the hypothesis profiles.

Tiers (markers in pyproject.toml): ``scripts/test --fast`` is the inner loop, under a minute on
two cores (``-m "not slow and not subprocess and not browser"``); the full suite is CI's.
Profiles: ``ci`` (the default) runs every property at full strength, ``dev`` at a tenth; pick one
with ``HYPOTHESIS_PROFILE=dev`` or ``--hypothesis-profile=dev``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

# Test modules import these from tests.serve_support; re-exported for older imports.
from tests.serve_support import (  # noqa: F401
    Server,
    embedded_store,
    release_embedded_store,
    start_serve,
)
from tests.web_support import CHROMIUM, CHROMIUM_ARGS

if TYPE_CHECKING:  # the SDK tests also run where the server extra is not installed
    from playwright.sync_api import Browser

    from latscope.storage import Store
    from tests.surfaces import RequestSpec

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # the SDK-floor run installs no hypothesis
    pass
else:
    from tests.hypothesis_support import CI_EXAMPLES

    # Examples are whole traces, exports or HTTP calls through real parts: seconds, not
    # microseconds, so no deadline and no complaint about slow generation.
    settings.register_profile(
        "ci",
        max_examples=CI_EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    settings.register_profile("dev", settings.get_profile("ci"), max_examples=CI_EXAMPLES // 10)
    # --hypothesis-profile (hypothesis' own pytest option) overrides this at configure time.
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """The process's embedded store (chDB allows one data directory per process); tests keep
    apart by their own service names and trace ids."""
    return embedded_store(tmp_path_factory)


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """An empty ``latscope serve`` of the module's own (tests send their own trace ids)."""
    server = start_serve(tmp_path_factory.mktemp("serve") / "store")
    try:
        yield server
    finally:
        server.stop()


class _Serving:
    """The serve of ``served`` and the dataset build it serves a copy of, kept across modules."""

    def __init__(self) -> None:
        self.built: Path | None = None
        self.server: Server | None = None

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


@pytest.fixture(scope="session")
def _serving() -> Iterator[_Serving]:
    serving = _Serving()
    try:
        yield serving
    finally:
        serving.stop()


@pytest.fixture(scope="module")
def served(
    _serving: _Serving, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Server, list[RequestSpec]]:
    """``latscope serve`` over a copy of ``surfaces.dataset()``, shared by the modules that only
    read it; the built store stays free for tests that open it themselves (``dataset_store``).

    The tests ask windows relative to now of requests placed relative to the build: when
    ``dataset_store`` builds again (its build passed ``DATASET_MAX_AGE_S``: a long run on a
    loaded machine), the next module gets a serve of the new build."""
    from tests.surfaces import dataset_store

    built, specs = dataset_store()
    if _serving.server is None or _serving.built != built:
        _serving.stop()
        copy = tmp_path_factory.mktemp("served") / "store"
        shutil.copytree(built, copy, symlinks=True)  # chDB's table links are relative
        _serving.built, _serving.server = built, start_serve(copy)
    return _serving.server, specs


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Headless Debian chromium driven by Playwright (no browser download). One per module,
    not per session: Playwright's sync API keeps an event loop running in the main thread
    while it is open, and a later module's ``asyncio.run`` on the same worker would fail."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (see scripts/test)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()
