"""The web page served at ``/``: static HTML, CSS and JavaScript shipped in the package.

No build step: the files here are what the browser gets. The page calls the ``/v1`` API.
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

_FILES = resources.files(__name__)


def mount_web(app: FastAPI) -> None:
    """Serve the page at ``/`` and its assets under ``/static``."""
    index = (_FILES / "index.html").read_text(encoding="utf-8")

    @app.get("/", include_in_schema=False, response_class=HTMLResponse)
    def page() -> HTMLResponse:
        return HTMLResponse(index, headers={"Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=str(_FILES / "static")), name="static")
