"""The virtual environment of the old FastAPI instrumentation (0.41b0), which cannot share one
with the current OpenTelemetry: made from pyproject.toml's ``upstream-fastapi-0-41`` pins and
kept, rebuilt when they change. Standard library only, so that any Python 3.11 can build it:

    python3 -m tests.upstream_env     build it now (.ci/run does, beside its other installs)
"""

from __future__ import annotations

import hashlib
import subprocess
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OLD_ENV = ROOT / ".venv-fastapi-0.41"


def old_pins() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return list(project["project"]["optional-dependencies"]["upstream-fastapi-0-41"])


def old_python() -> Path:
    """The environment's python, made first when it is missing or its pins changed."""
    pins = old_pins()
    stamp = hashlib.sha256("\n".join(pins).encode()).hexdigest()
    python = OLD_ENV / "bin" / "python"
    marker = OLD_ENV / "pins.sha256"
    if not (python.exists() and marker.exists() and marker.read_text() == stamp):
        venv.create(OLD_ENV, with_pip=True, clear=True)
        done = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", *pins],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if done.returncode != 0:
            raise RuntimeError(f"installing {pins} failed:\n{done.stderr[-3000:]}")
        marker.write_text(stamp)
    return python


if __name__ == "__main__":
    print(f"upstream env: {old_python()}")
