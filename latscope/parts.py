"""How the stages plug into a latscope process.

Each stage (collector, attributor, query services) contributes a ``Parts``: gRPC servicers to
register, HTTP routers to mount, and background components to start and stop. ``serve``,
``collector`` and ``api`` compose the parts they run, so no stage edits another's wiring.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import grpc
from fastapi import APIRouter

from latscope.storage import StoreUnavailable

log = logging.getLogger(__name__)


class Component(Protocol):
    """A background worker. ``stop`` must finish (drain, flush) by ``deadline`` (monotonic s)."""

    name: str

    def start(self) -> None: ...

    def stop(self, deadline: float) -> None: ...


class Poller:
    """A ``Component`` that calls ``run_until_idle()`` on its own thread every ``poll_s`` seconds
    until stopped. A pass that fails (the store down, or a fault) is logged, reported to
    ``failed`` and tried again at the next poll: a background stage never dies of one bad pass.
    A subclass can wake more often than it passes (``poll`` and ``next_wake_s``).
    """

    name = "poller"

    def __init__(self, poll_s: float) -> None:
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_until_idle(self) -> int:
        raise NotImplementedError

    def poll(self) -> None:
        """One wake-up of the loop: a pass."""
        self.run_until_idle()

    def next_wake_s(self) -> float:
        """Seconds from now to the next wake-up."""
        return self.poll_s

    def failed(self, exc: Exception) -> None:
        """Called for every failed pass, before it is logged (count it here)."""

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, deadline: float) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()))

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except StoreUnavailable as exc:
                self.failed(exc)
                log.warning("%s paused, store unavailable: %s", self.name, exc)
            except Exception as exc:
                self.failed(exc)
                log.exception("%s pass failed; retrying", self.name)
            self._stop.wait(self.next_wake_s())


@dataclass
class Parts:
    grpc_servicers: list[Callable[[grpc.Server], None]] = field(default_factory=list)
    http_routers: list[APIRouter] = field(default_factory=list)
    components: list[Component] = field(default_factory=list)

    def __add__(self, other: Parts) -> Parts:
        return Parts(
            self.grpc_servicers + other.grpc_servicers,
            self.http_routers + other.http_routers,
            self.components + other.components,
        )
