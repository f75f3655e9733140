"""Child processes of the demo: ``latscope serve`` and the simulated LLM server.

Each runs in its own process, as it would in production: ``serve`` owns the embedded store, and
the simulator has its own SDK configuration (service name, clock) apart from the client's.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field

#: Lines of a child's output kept for error messages.
KEEP_LINES = 200


class ChildFailed(RuntimeError):
    """A child process did not start; the message carries the end of its output."""


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[str]
    found: dict[str, str]
    output: deque[str] = field(default_factory=lambda: deque(maxlen=KEEP_LINES))
    _reader: threading.Thread | None = None

    def tail(self) -> str:
        return "\n".join(self.output)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, wait up to ``timeout``, then SIGKILL; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._reader is not None:
            self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode


def start(
    name: str,
    args: list[str],
    patterns: dict[str, str],
    *,
    timeout: float = 90.0,
    env: dict[str, str] | None = None,
) -> Child:
    """Run ``python -m <args>``; wait until every regex in ``patterns`` matched a line.

    ``found`` maps each pattern's key to its first group.
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
        # Own process group: Ctrl-C in the terminal reaches the demo, which stops its children
        # in order (simulator first, so its spans are flushed to serve before serve stops).
        start_new_session=True,
    )
    child = Child(name, proc, {})
    compiled = {k: re.compile(p) for k, p in patterns.items()}
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline and len(child.found) < len(compiled):
        line = proc.stdout.readline()
        if not line:
            break
        child.output.append(line.rstrip())
        for key, regex in compiled.items():
            if key not in child.found and (m := regex.search(line)):
                child.found[key] = m.group(1)
    if len(child.found) < len(compiled):
        child.stop(5)
        raise ChildFailed(f"{name} did not start:\n{child.tail()}")
    stdout = proc.stdout
    child._reader = threading.Thread(
        target=lambda: child.output.extend(line.rstrip() for line in stdout),
        name=f"{name}-output",
        daemon=True,
    )
    child._reader.start()
    return child


#: The demo knows when its traffic ends, so its serve need not wait long for late spans.
DEMO_SETTLE_S = 1.0


def start_serve(store: str, http: str, otlp_grpc: str, *extra: str) -> Child:
    """``latscope serve`` on ``store`` (``extra``: more flags); ``found`` has ``grpc``
    (host:port) and ``http`` (URL)."""
    return start(
        "latscope serve",
        [
            *("latscope.cli", "serve", "--store", store, "--http", http),
            *("--otlp-grpc", otlp_grpc, "--attribution-settle-s", str(DEMO_SETTLE_S)),
            *("--log-level", "warning", *extra),
        ],
        {"grpc": r"OTLP/gRPC\s+(\S+)", "http": r"HTTP\s+(http://\S+)"},
    )


def start_simulator(
    scenario: str,
    otlp: str,
    clock_skew_s: float,
    *,
    env: dict[str, str] | None = None,
    instance_id: str = "",
    warm: bool = False,
) -> Child:
    """The simulated LLM server (one replica: ``instance_id`` is its service.instance.id;
    ``warm``: serving before the run, no cold period); ``found["url"]`` is its base URL."""
    return start(
        f"demo LLM server {instance_id}".strip(),
        [
            "latscope.demo.server",
            "--scenario",
            scenario,
            "--otlp",
            otlp,
            "--clock-skew",
            repr(clock_skew_s),
            *(("--instance-id", instance_id) if instance_id else ()),
            *(("--warm",) if warm else ()),
        ],
        {"url": r"latscope demo server: (http://\S+)"},
        env=env,
    )
