"""How the stages plug into a latscope process.

Each stage (collector, attributor, query services) contributes a ``Parts``: gRPC servicers to
register, HTTP routers to mount, and background components to start and stop. ``serve``,
``collector`` and ``api`` compose the parts they run, so no stage edits another's wiring.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import grpc
from fastapi import APIRouter


class Component(Protocol):
    """A background worker. ``stop`` must finish (drain, flush) by ``deadline`` (monotonic s)."""

    name: str

    def start(self) -> None: ...

    def stop(self, deadline: float) -> None: ...


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
