"""Ground truth: how long each request really spent in each phase, measured where the work is.

The simulator reads ``time.monotonic_ns`` at the same points where the SDK opens and closes its
phase spans, but on its own clock and in its own records, so the comparison with latscope's
attribution checks the whole path (SDK clock, export, collector, storage, attribution) and not
the cost model: scheduling jitter on a busy machine lands in the truth as it lands in the spans.

Each boundary is read right before and right after the SDK's call, so the SDK's own reading lies
between the two: a duration is known as a bracket ``[low, high]``. Usually the bracket is a few
microseconds wide; when the machine preempts the process inside the SDK's call it widens, and the
truth says so instead of pretending to a precision it does not have.
"""

from __future__ import annotations

import contextvars
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from latscope.semconv import BUCKETS

#: Requests remembered at most; the oldest are forgotten first (and counted).
DEFAULT_CAPACITY = 100_000


@dataclass
class RequestTruth:
    """One request as the server saw it. Times are ``time.monotonic_ns`` readings; each
    boundary is read before and after the SDK's own reading of it."""

    request_id: str
    arrived_ns: int = 0
    arrived_after_ns: int = 0
    ended_ns: int | None = None
    ended_after_ns: int | None = None
    #: phase -> [low, high] bracket of the time spent in it (summed over its spans).
    phases_ns: dict[str, list[int]] = field(default_factory=dict)
    prompt_tokens: int = 0
    output_tokens: int = 0
    status: int = 200
    #: The replica was still in its cold period when the request arrived.
    cold: bool = False
    #: The longest time between two tokens of its stream (read next to the SDK's record_token):
    #: whether the stream really stalled, on a machine too busy to keep the designed pace.
    max_token_gap_ns: int = 0
    last_token_ns: int | None = None

    def token(self) -> None:
        """A token of its stream, now: its gap since the one before counts to the longest."""
        now = time.monotonic_ns()
        if self.last_token_ns is not None:
            self.max_token_gap_ns = max(self.max_token_gap_ns, now - self.last_token_ns)
        self.last_token_ns = now

    def add(self, phase: str, low: int, high: int) -> None:
        bracket = self.phases_ns.setdefault(phase, [0, 0])
        bracket[0] += low
        bracket[1] += high

    @property
    def complete(self) -> bool:
        return self.ended_ns is not None and self.ended_after_ns is not None

    def to_json(self) -> dict[str, Any]:
        server = None
        if self.ended_ns is not None and self.ended_after_ns is not None:
            server = [
                self.ended_ns - (self.arrived_after_ns or self.arrived_ns),
                self.ended_after_ns - self.arrived_ns,
            ]
        return {
            "request_id": self.request_id,
            "server_ns": server,
            "phases_ns": {k: list(v) for k, v in self.phases_ns.items()},
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "status": self.status,
            "cold": self.cold,
            "max_token_gap_ns": self.max_token_gap_ns,
        }


class TruthRecorder:
    """Bounded map request id -> RequestTruth; forgets the oldest beyond ``capacity``."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self.forgotten = 0
        self._records: OrderedDict[str, RequestTruth] = OrderedDict()

    def begin(self, request_id: str) -> RequestTruth:
        record = RequestTruth(request_id)
        self._records[request_id] = record
        while len(self._records) > self.capacity:
            self._records.popitem(last=False)
            self.forgotten += 1
        return record

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": [r.to_json() for r in self._records.values() if r.complete],
            "forgotten": self.forgotten,
        }


#: The request the current task is serving (set by TruthMiddleware).
current: contextvars.ContextVar[RequestTruth | None] = contextvars.ContextVar(
    "latscope_demo_truth", default=None
)


class TruthMiddleware:
    """ASGI middleware around the SDK's ``TraceparentMiddleware``, which reads the arrival time
    the server span starts at: the outer one (``after=False``) notes the time right before it,
    keyed by ``x-request-id``, the inner one (``after=True``) right after it."""

    def __init__(self, app: Any, recorder: TruthRecorder, *, after: bool = False) -> None:
        self.app = app
        self.recorder = recorder
        self.after = after

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if self.after:
            record = current.get()
            if record is not None:
                record.arrived_after_ns = time.monotonic_ns()
            await self.app(scope, receive, send)
            return
        request_id = None
        if scope.get("type") == "http":
            for k, v in scope.get("headers") or ():
                if k == b"x-request-id":
                    request_id = v.decode("latin-1")
        if request_id is None:
            await self.app(scope, receive, send)
            return
        record = self.recorder.begin(request_id)
        token = current.set(record)
        try:
            # Read last, after every allocation of ours: a garbage collection they set off
            # would otherwise fall between this reading and the SDK's.
            record.arrived_ns = time.monotonic_ns()
            await self.app(scope, receive, send)
        finally:
            current.reset(token)


def truth_buckets(
    client_e2e_ns: tuple[int, int], server: dict[str, Any]
) -> dict[str, tuple[int, int]]:
    """The seven true buckets of one request as ``(low, high)`` brackets in ns, from the
    client's bracket of its end-to-end time and the server's record.

    ``network`` is what the client waited beyond the server's own time (proxy delay included);
    ``other`` is server time no phase covered.
    """
    server_lo, server_hi = (int(v) for v in server["server_ns"])
    phases = server.get("phases_ns") or {}
    out: dict[str, tuple[int, int]] = {}
    for bucket in BUCKETS:
        if bucket not in ("network", "other"):
            low, high = phases.get(bucket, (0, 0))
            out[bucket] = (int(low), int(high))
    out["network"] = (client_e2e_ns[0] - server_hi, client_e2e_ns[1] - server_lo)
    out["other"] = (
        server_lo - sum(h for b, (_, h) in out.items() if b != "network"),
        server_hi - sum(lo for b, (lo, _) in out.items() if b != "network"),
    )
    return {b: out[b] for b in BUCKETS}
