"""The traces the continuous attributor fails on alone (a value ClickHouse refuses, say): found by
cutting a refused batch in halves, set aside so the others go on, retried with a backoff, and
listed at ``GET /v1/attribution/set-aside``. In memory: after a restart, such a trace is
attributed again when a span of it arrives.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from prometheus_client import Counter, Gauge

from latscope.metrics import REGISTRY
from latscope.storage import StoreError, StoreUnavailable

log = logging.getLogger("latscope.attribution.attributor")

#: A trace set aside is retried after RETRY_FIRST_S, then twice as long each time, at most
#: RETRY_MAX_S; RETRY_BATCH of them in one statement.
RETRY_FIRST_S = 10.0
RETRY_MAX_S = 3600.0
RETRY_BATCH = 100

BATCH_ERRORS = Counter(
    "latscope_attribution_errors",
    "Attribution passes that failed; 'store' ones are retried, 'skipped' ones are dropped",
    ["kind"],
    registry=REGISTRY,
)
SET_ASIDE = Gauge(
    "latscope_attribution_set_aside_traces",
    "Traces attribution failed on alone, set aside and retried with a backoff "
    "(GET /v1/attribution/set-aside lists them)",
    registry=REGISTRY,
)


class SetAside(NamedTuple):
    """A trace the attributor failed on alone: why, how often, when it is tried again (unix
    seconds), and where its spans start and end (ns)."""

    trace_id: str
    error: str
    attempts: int
    retry_at: float
    around: tuple[int, int]


class SetAsideTraces(dict[str, SetAside]):
    """The traces set aside, by id."""

    def add(self, trace_id: str, error: StoreError, around: tuple[int, int] | None) -> None:
        """Set ``trace_id`` aside (again: it waits twice as long as the last time)."""
        old = self.get(trace_id)
        attempts = old.attempts + 1 if old is not None else 1
        wait_s = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (attempts - 1))
        if around is None and old is not None:
            around = old.around
        self[trace_id] = SetAside(
            trace_id, str(error)[:500], attempts, time.time() + wait_s, around or (0, 2**63 - 1)
        )
        if old is None:
            BATCH_ERRORS.labels("set_aside").inc()
            log.error("attribution fails on trace %s; set aside, retried in %.0f s: %s",
                      trace_id, wait_s, str(error)[:500])  # fmt: skip

    def any_due(self) -> bool:
        now = time.time()
        return any(s.retry_at <= now for s in self.values())

    def due(self) -> list[str]:
        """The traces whose backoff is over, at most ``RETRY_BATCH``, by id."""
        now = time.time()
        return sorted(t for t, s in self.items() if s.retry_at <= now)[:RETRY_BATCH]

    def cut(
        self,
        groups: list[tuple[list[str], str]],
        error: StoreError,
        run: Callable[[list[str], str, int], int],
        bounds: dict[str, tuple[int, int]],
        spare_marker: Callable[[], int | None],
    ) -> int:
        """Attribute ``groups`` of trace ids that a statement failed on, halving each group
        that fails again, until the traces that fail alone are found: those are set aside.
        ``run(ids, id_hi, marker)`` attributes a group with a marker ``spare_marker()`` gives
        (None: none is left, and the group is set aside). ``bounds``: where each trace's spans
        start and end (ns). Iterative: the number of traces in a batch is the client's to
        choose. Returns the rows written."""
        written = 0
        while groups:
            ids, id_hi = groups.pop()
            if len(ids) == 1:
                self.add(ids[0], error, bounds.get(ids[0]))
                continue
            mid = len(ids) // 2
            for part, part_hi in ((ids[:mid], ids[mid]), (ids[mid:], id_hi)):
                marker = spare_marker()
                if marker is None:
                    for trace_id in part:
                        self.add(trace_id, error, bounds.get(trace_id))
                    continue
                try:
                    written += run(part, part_hi, marker)
                except StoreUnavailable:
                    raise
                except StoreError as exc:
                    error = exc
                    groups.append((part, part_hi))
        SET_ASIDE.set(len(self))
        return written

    def retry(
        self,
        attribute: Callable[[list[str], tuple[int, int], int], int],
        spare_marker: Callable[[], int | None],
    ) -> int:
        """Attribute again the traces whose backoff is over (``RETRY_BATCH`` at a time):
        ``attribute(ids, around, marker)`` over the span starts ``around`` of them all, with a
        marker ``spare_marker()`` gives; those attributed leave, those that fail again wait
        longer. Returns the rows written."""
        due = self.due()
        if not due:
            return 0
        around = (min(self[t].around[0] for t in due), max(self[t].around[1] for t in due))

        def run(part: list[str], _id_hi: str, marker: int) -> int:
            before = {trace_id: self.get(trace_id) for trace_id in part}
            written = attribute(part, around, marker)
            for trace_id in part:
                # (unless ``attribute`` set it aside again on its own)
                if self.get(trace_id) is before[trace_id]:
                    self.pop(trace_id, None)
            return written

        bounds = {t: self[t].around for t in due}
        marker = spare_marker()
        if marker is None:
            return 0
        try:
            written = run(due, "", marker)
        except StoreUnavailable:
            raise
        except StoreError as exc:
            if len(due) == 1:
                self.add(due[0], exc, None)
                written = 0
            else:
                written = self.cut([(due, "")], exc, run, bounds, spare_marker)
        SET_ASIDE.set(len(self))
        return written


def set_aside_router(traces: SetAsideTraces, token: str) -> Any:
    """``GET /v1/attribution/set-aside``: the traces an attributor has set aside (``traces``)."""
    from fastapi import APIRouter, Header

    from latscope.api.errors import ApiError, error_responses
    from latscope.api.schemas import SetAsideTraces as SetAsideAnswer
    from latscope.auth import UNAUTHORIZED, bearer_ok

    router = APIRouter(tags=["attribution"])

    @router.get(
        "/v1/attribution/set-aside",
        response_model=SetAsideAnswer,
        responses=error_responses(401),  # no parameters: nothing else to refuse
    )
    def set_aside(
        # The bearer token, as on every /v1 route: not a parameter of this route's own.
        authorization: str | None = Header(default=None, include_in_schema=False),
    ) -> SetAsideAnswer:
        """Traces attribution failed on alone (a value ClickHouse refused, say): set aside so the
        others go on, and retried with a backoff. Empty when attribution is healthy."""
        if not bearer_ok(authorization, token):
            raise ApiError(401, "unauthorized", UNAUTHORIZED)
        now = time.time()
        return SetAsideAnswer.model_validate({"traces": [
            {"trace_id": s.trace_id, "error": s.error, "attempts": s.attempts,
             "retry_in_s": max(0.0, s.retry_at - now)}
            for s in sorted(traces.values())
        ]})  # fmt: skip

    return router
