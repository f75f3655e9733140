"""The SDK is light: ``import latscope.sdk`` loads no server package, the console script says
which extra to install when the server extra is missing, and the type hints ship.

``scripts/test --sdk-floor`` checks the same in a venv holding the SDK alone (no server
packages installed at all), on the lowest declared dependency versions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import resources

import pytest

SERVER_PACKAGES = {
    "chdb", "clickhouse_connect", "pyarrow", "polars", "fastapi", "starlette", "uvicorn",
    "prometheus_client", "rich", "httpx", "openai",
}  # fmt: skip


def _run(code: str, tmp_path) -> subprocess.CompletedProcess:
    # From another directory: the checkout's latscope/ folder must not stand in for the package.
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )


@pytest.mark.subprocess
def test_importing_the_sdk_loads_no_server_package(tmp_path) -> None:
    proc = _run(
        "import json, sys\n"
        "import latscope.sdk\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))",
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    loaded = set(json.loads(proc.stdout))
    assert "latscope" in loaded and "opentelemetry" in loaded
    assert not loaded & SERVER_PACKAGES
    if os.environ.get("LATSCOPE_SDK_ONLY"):  # the SDK-only venv: not even installed
        import importlib.util

        assert [p for p in SERVER_PACKAGES - {"httpx", "starlette", "fastapi", "uvicorn",
                                              "openai"}
                if importlib.util.find_spec(p)] == []  # fmt: skip


@pytest.mark.subprocess
@pytest.mark.parametrize("missing", ["clickhouse_connect", "pyarrow"])
def test_console_script_names_the_extra_when_the_server_is_missing(tmp_path, missing) -> None:
    # A None entry in sys.modules makes that import fail as if the package were absent.
    proc = _run(
        f"import sys; sys.modules[{missing!r}] = None\n"
        "from latscope.cli import main\n"
        "sys.exit(main(['report']))",
        tmp_path,
    )
    assert proc.returncode == 2
    assert 'pip install "latscope[server]"' in proc.stderr
    assert "Traceback" not in proc.stderr


def test_type_hints_ship() -> None:
    assert (resources.files("latscope.sdk") / "py.typed").is_file()
    assert (resources.files("latscope") / "py.typed").is_file()
