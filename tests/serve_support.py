"""A real ``latscope serve`` process on free loopback ports, and the process's embedded store."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

if TYPE_CHECKING:  # the SDK tests also run where the server extra is not installed
    from latscope.storage import Store

_EMBEDDED: list[Store] = []


def embedded_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """The test process's one embedded store, schema applied.

    chDB opens one data directory per process, so every in-process test shares this store (tests
    keep apart by their own service names and trace ids); tests that need a store of their own
    start a ``latscope serve`` process, or call ``release_embedded_store`` first.
    """
    if not _EMBEDDED:
        from latscope.storage import Store

        store = Store.open(f"chdb://{tmp_path_factory.mktemp('embedded-store')}")
        store.apply_schema()
        _EMBEDDED.append(store)
    return _EMBEDDED[0]


def release_embedded_store() -> None:
    """Close the shared store so this process can open another data directory.

    The next ``embedded_store`` call opens a fresh one, so fixtures that hold it are module-scoped.
    """
    while _EMBEDDED:
        _EMBEDDED.pop().close()


#: The tests' spans are recorded at fixed times (T0), not relative to the clock: ``latscope
#: serve`` takes spans of any time unless a test sets the window (issue 44's tests do).
WINDOW_OFF = {"LATSCOPE_MAX_SPAN_AGE_S": "0", "LATSCOPE_MAX_SPAN_FUTURE_S": "0"}


@dataclass
class Server:
    proc: subprocess.Popen
    grpc: str
    http: str
    store_dir: Path
    output: list[str]
    _reader: threading.Thread

    def text(self) -> str:
        return "\n".join(self.output)

    def url(self, path: str) -> str:
        return f"{self.http}{path}"

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            self._reader.join(5)
            if self.proc.stdout:
                self.proc.stdout.close()


def serve_temp_dir(store_dir: Path) -> Path:
    """The temporary directory ``start_serve`` gives a serve of ``store_dir``."""
    return store_dir.with_name(f"{store_dir.name}-tmp")


def start_serve(
    store_dir: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> Server:
    """Start ``latscope serve`` on port 0 and wait for it to print the addresses it bound.

    Its temporary directory (``TMPDIR``) is ``<store_dir>-tmp``, beside the store: whatever a
    serve leaves there (``serve_temp_files``) stays in the test's own directory, not in /tmp.
    """
    temp = serve_temp_dir(store_dir)
    temp.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "latscope.cli", "serve",
        "--store", f"chdb://{store_dir}",
        "--otlp-grpc", "127.0.0.1:0",
        "--http", "127.0.0.1:0",
        *args,
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **WINDOW_OFF, "TMPDIR": str(temp), **(env or {})},
    )
    lines: list[str] = []
    grpc_addr = http_addr = None
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline and not (grpc_addr and http_addr):
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip())
        if m := re.search(r"OTLP/gRPC\s+(\S+)", line):
            grpc_addr = m.group(1)
        if m := re.search(r"HTTP\s+(http://\S+)", line):
            http_addr = m.group(1)
    if not (grpc_addr and http_addr):
        proc.kill()
        proc.wait()
        proc.stdout.close()
        raise RuntimeError("latscope serve did not start:\n" + "\n".join(lines))
    # Keep draining the pipe so a chatty server never blocks on a full pipe.
    reader = threading.Thread(
        target=lambda: lines.extend(line.rstrip() for line in proc.stdout), daemon=True
    )
    reader.start()
    server = Server(proc, grpc_addr, http_addr, store_dir, lines, reader)
    httpx.get(server.url("/healthz"), timeout=10).raise_for_status()
    return server


def metric(server: Server, name: str) -> float:
    """The first sample of ``name`` (labels may be part of it) on the server's /metrics."""
    for line in httpx.get(server.url("/metrics"), timeout=10).text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not on /metrics")


def store_sql(store_dir: Path, *statements: str, params: dict[str, Any] | None = None) -> list:
    """Run statements (with ``params``) on an embedded store in a process of their own (this
    one may hold another, and chDB takes one store per process); the last one's rows."""
    code = (
        "import json, sys; from latscope.storage import Store\n"
        "s = Store.open(sys.argv[1]); s.apply_schema(); params = json.loads(sys.argv[2]) or None\n"
        "rows = [s.query_rows(q, params) for q in sys.argv[3:]][-1]\n"
        "print(json.dumps([list(r) for r in rows], default=str))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, f"chdb://{store_dir}", json.dumps(params or {}), *statements],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]
