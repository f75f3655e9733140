"""One trace's state, worked out once and shared by every answer about it.

An answer about a trace (``latscope.api.trace``) first reads the trace's state: its spans
counted up to the cap and a fingerprint of which are stored (``_reading``); its spans are read
up to a byte budget (``SHOWN_BYTES_PER_SPAN`` a span of the cap), ClickHouse refusing past it.
Everything worked out from that state (the spans, their index, the calls, each call's
attribution, the run) is a piece of a ``_Trace``, computed once under the state's lock while other
askers wait, each until its own query deadline; so is the JSON of each answer askers share
(``json_of``). The last traces answered are kept (``_Kept``), up to the span cap and
``KEPT_TEXT`` together; ``_Gate`` bounds how many answers are worked out at once and how many
wait, and ``_CyclesLater`` pauses Python's cyclic garbage collector while answers run.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from latscope.api.errors import NotFound, QueryError
from latscope.api.schemas import Answer
from latscope.attribution import (
    Request,
    RequestAttribution,
    SpanRecord,
    attribute_request,
    explain_run,
    find_requests,
    load_trace,
    rules,
)
from latscope.attribution.engine import Timeline, TraceIndex, ranked_pieces, timeline
from latscope.attribution.queries import ATTRIBUTE_CHARS
from latscope.attribution.runs import RunExplanation
from latscope.config import DEFAULT_MAX_TRACE_SPANS
from latscope.storage import SPANS_TABLE, Store, StoreResultTooLarge


def _cores() -> int:
    """The cores this process may run on (its affinity where the platform says)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


#: Trace answers worked out at once in this process; more wait for a slot. Half the cores (one
#: on two): a wide trace's answers, asked for over and over, then leave the other half to ingest
#: (16 clients asking for a 39,601-span trace view on two cores: Exports acknowledged at p50
#: 48-58 ms with one slot, 77-79 with two, alone 26-33; docs/benchmarks.md).
TRACE_SLOTS = max(1, _cores() // 2)
#: Trace answers waiting for a slot at most; past that one is refused at once (503 ``busy``), so
#: requests for wide traces cannot take every thread of the HTTP server's pool.
TRACE_WAITING = 16
_T = TypeVar("_T")
_A = TypeVar("_A", bound=Answer)
#: A trace's state: its spans counted (to ``limit``) and a fingerprint of which are stored. Spans
#: are only ever added (or dropped with their day), so an answer worked out from a state holds
#: for as long as the trace counts and fingerprints the same.
_STATE = f"""
SELECT count(), sum(h) FROM (
    SELECT cityHash64(SpanId, Timestamp, Duration) AS h FROM {SPANS_TABLE}
    WHERE TraceId = {{trace_id:String}} LIMIT {{limit:UInt64}}
)
"""


class _Gate:
    """``TRACE_SLOTS`` answers at once, at most ``TRACE_WAITING`` waiting."""

    def __init__(self, slots: int, waiting: int) -> None:
        self._slots = threading.BoundedSemaphore(slots)
        self._waiting = waiting
        self._queued = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def slot(self, deadline: float, what: str) -> Iterator[None]:
        with self._lock:
            if self._queued >= self._waiting:
                raise QueryError(
                    503, "busy",
                    f"{self._queued} trace answers are waiting already; retry {what} later",
                )  # fmt: skip
            self._queued += 1
        try:
            got = self._slots.acquire(timeout=max(0.0, deadline - time.monotonic()))
        finally:
            with self._lock:
                self._queued -= 1
        if not got:
            raise _timed_out(what)
        try:
            yield
        finally:
            self._slots.release()


_GATE = _Gate(TRACE_SLOTS, TRACE_WAITING)


class _CyclesLater:
    """Python's cyclic garbage collector paused while any trace answer is worked out: an answer
    allocates an object or more per span and per field, which sets off collections of the whole
    heap again and again (a third of a wide trace's answer); what it leaves is freed by reference
    counting, and any cycles at the next collection after the last answer ends. Answers that
    follow one another without a gap (clients asking for a trace over and over) would keep it
    paused for good while the rest of the process makes cycles too: an answer ending more than
    ``most_s`` after the pause began collects them."""

    def __init__(self, most_s: float = 2.0) -> None:
        self._lock = threading.Lock()
        self._answers = 0
        self._was_enabled = True
        self._most_s = most_s
        self._since = 0.0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        with self._lock:
            if self._answers == 0:
                self._was_enabled = gc.isenabled()
                self._since = time.monotonic()
                gc.disable()
            self._answers += 1
        try:
            yield
        finally:
            with self._lock:
                self._answers -= 1
                if self._answers == 0 and self._was_enabled:
                    gc.enable()
                elif self._was_enabled and time.monotonic() - self._since > self._most_s:
                    gc.collect()
                    self._since = time.monotonic()


_CYCLES = _CyclesLater()


def _timed_out(what: str) -> QueryError:
    return QueryError(
        503, "query_timeout",
        f"answering {what} took longer than the query time limit (--query-timeout-s); retry "
        "when the server is less busy",
    )  # fmt: skip


def _elsewhere(trace_id: str, raising: str) -> str:
    """Where else a trace too large to answer is seen, and how to see it (``raising``: what
    raising ``--max-trace-spans`` costs or brings)."""
    return (
        "Its inference calls are attributed all the same: /v1/requests?since=...&service=... "
        "lists the slowest, and /v1/export/requests their rows. To see this trace, raise "
        f"--max-trace-spans ({raising}) or read its spans from ClickHouse ({SPANS_TABLE} WHERE "
        f"TraceId = '{trace_id}')."
    )


class TraceTooLarge(QueryError):
    """A trace holds more spans than this process answers a trace with."""

    def __init__(self, trace_id: str, spans: int, max_spans: int) -> None:
        super().__init__(
            422,
            "trace_too_large",
            f"trace {trace_id} holds more than {max_spans:,} spans, the most latscope answers a "
            f"trace with (--max-trace-spans; {spans:,} counted so far). "
            + _elsewhere(trace_id, "an answer takes 0.04-0.15 CPU s more per 1,000 spans"),
        )


#: Bytes of a trace's spans as its answers read them (``load_trace``: ids, names, times and the
#: attribute values cut), on average a span of ``--max-trace-spans``: 128 MiB at its default. A
#: span reads as about 1 KB (an LLM call's or a tool's, prompts cut); a trace whose spans carry
#: hundreds of values each, cut or not, is refused past it before Python holds any of it.
SHOWN_BYTES_PER_SPAN = 2_560


class TraceTooHeavy(QueryError):
    """A trace's spans read as more bytes than this process answers a trace with."""

    def __init__(self, trace_id: str, max_bytes: int, max_spans: int) -> None:
        super().__init__(
            422,
            "trace_too_large",
            f"trace {trace_id} reads as more than {max_bytes:,} bytes of spans and attribute "
            f"values (each value cut to {ATTRIBUTE_CHARS} characters), the most latscope answers "
            f"a trace with ({SHOWN_BYTES_PER_SPAN:,} bytes a span at --max-trace-spans "
            f"{max_spans:,}). One span reads whole at /v1/traces/{trace_id}/spans/{{span_id}}. "
            + _elsewhere(
                trace_id, f"each span more lets a trace read {SHOWN_BYTES_PER_SPAN:,} bytes more"
            ),
        )


class _Worked:
    """One state of a trace (``_STATE``) and what is worked out of it, by name: its spans, their
    index, its calls, each call's attribution, the run, the answers built. Every answer about
    that state shares it: the first to need a piece works it out, and others needing it then
    wait for it (each until its own deadline) instead of working it out again."""

    def __init__(self, spans: int, rulebook: rules.Rulebook) -> None:
        self.spans = spans
        #: The rulebook the calls were found with (held, so that its id in the key stays its).
        self.rulebook = rulebook
        self.lock = threading.RLock()
        self.pieces: dict[Hashable, Any] = {}
        #: The characters of its spans' attribute values, once they are read.
        self.text = 0
        #: The bytes of its answers' JSON and gzip kept (``_kept_bytes``), by piece, the least
        #: recently asked for first (a few pieces a state).
        self.made: OrderedDict[Hashable, int] = OrderedDict()

    @property
    def kept(self) -> int:
        """What it holds, as ``KEPT_TEXT`` counts it: its spans' text and its answers' bytes."""
        return self.text + sum(self.made.values())

    def let_go_of_bytes(self, most: int) -> int:
        """Drop the answers' bytes least recently asked for until ``most`` are freed or none is
        left; the bytes freed. Under ``_SHARED.lock``."""
        freed = 0
        while self.made and freed < most:
            key, size = self.made.popitem(last=False)
            self.pieces.pop(key, None)
            freed += size
        return freed


#: The most characters of attribute values and bytes of answers' JSON and gzip the kept states
#: hold together. Past it the answers' bytes go first (they are written again from the answer
#: in a fraction of the time reading the trace again takes), the least recently asked for first,
#: then the oldest states; a trace whose spans alone carry more (prompts) is not kept past its
#: answers. So what stays in memory between answers is bounded whatever the spans carry.
KEPT_TEXT = 64 << 20


class _Kept:
    """The states of the traces answered last, the newest first, as many as hold at most
    ``budget`` spans (``--max-trace-spans``: one trace at the cap) and ``KEPT_TEXT`` together,
    so that the routes a trace's page asks one after the other, and askers of one trace at once,
    work it out once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: OrderedDict[Hashable, _Worked] = OrderedDict()

    def state(self, key: Hashable, spans: int, budget: int) -> _Worked:
        rulebook = rules.active()
        key = (key, id(rulebook))
        with self._lock:
            worked = self._states.get(key)
            if worked is None:
                worked = self._states[key] = _Worked(spans, rulebook)
            self._states.move_to_end(key, last=False)
            self._trim(budget, worked)
            return worked

    def trim(self, budget: int) -> None:
        """Let go of the states past the bounds (once an answer is done, its own too)."""
        with self._lock:
            self._trim(budget, None)

    def _trim(self, budget: int, keep: _Worked | None) -> None:
        spans = 0
        for k, w in list(self._states.items()):
            spans += w.spans
            if spans > budget and w is not keep:
                del self._states[k]
                spans -= w.spans
        over = sum(w.kept for w in self._states.values()) - KEPT_TEXT
        if over <= 0:
            return
        oldest_first = list(reversed(self._states.items()))
        with _SHARED.lock:
            for _, w in oldest_first:
                over -= w.let_go_of_bytes(over)
                if over <= 0:
                    return
        for k, w in oldest_first:
            if w is not keep:
                del self._states[k]
                over -= w.text
                if over <= 0:
                    return

    def clear(self) -> None:
        with self._lock:
            self._states.clear()


_KEPT = _Kept()


@dataclass
class _Trace:
    """One trace as an answer reads it: the state it was counted in (its pieces worked out at
    most once, ``_Worked``), and the deadline this answer keeps."""

    trace_id: str
    worked: _Worked
    deadline: float
    what: str
    store: Store | None = None
    #: ``--max-trace-spans``: with ``SHOWN_BYTES_PER_SPAN``, the most bytes its spans read as.
    max_spans: int = DEFAULT_MAX_TRACE_SPANS

    def piece(self, name: Hashable, work: Callable[[], _T]) -> _T:
        """The piece ``name`` of the trace's state: ``work()``'s, worked out once."""
        worked = self.worked
        if not worked.lock.acquire(timeout=max(0.0, self.deadline - time.monotonic())):
            raise _timed_out(self.what)
        try:
            if name not in worked.pieces:
                worked.pieces[name] = work()
                self.check()
            return worked.pieces[name]
        finally:
            worked.lock.release()

    def latest(self, name: Hashable, key: Hashable, work: Callable[[], _T]) -> _T:
        """The piece ``name`` as worked out for ``key``, only the latest ``key`` kept: for what
        each call of a trace has its own of (a call's waterfall), so that asking for every call
        in turn keeps one, not one per call."""

        worked = self.worked
        if not worked.lock.acquire(timeout=max(0.0, self.deadline - time.monotonic())):
            raise _timed_out(self.what)
        try:
            kept = worked.pieces.get(name)
            if kept is None or kept[0] != key:
                worked.pieces.pop(name, None)
                kept = self.piece(name, lambda: (key, work()))
            return kept[1]
        finally:
            worked.lock.release()

    def answer(self, name: Hashable, work: Callable[[], _A]) -> _A:
        """The answer ``name`` (a piece), shared by every asker of this state: its JSON is
        written once too (``json_of``)."""
        answer = self.piece(name, work)
        _SHARED.share(answer, self.worked, name)
        return answer

    @property
    def spans(self) -> list[SpanRecord]:
        assert self.store is not None
        store = self.store

        def work() -> list[SpanRecord]:
            spans = _load(store, self.trace_id, self.max_spans)
            self.worked.text = sum(
                sum(map(len, s.attributes.values())) + sum(map(len, s.resource.values()))
                for s in spans
            )
            return spans

        return self.piece("spans", work)

    @property
    def index(self) -> TraceIndex:
        return self.piece("index", lambda: TraceIndex(self.spans))

    @property
    def requests(self) -> list[Request]:
        return self.piece("requests", lambda: find_requests(self.spans, self.index))

    def check(self) -> None:
        """Stop once the deadline passed (between steps: each is bounded by the span cap)."""
        if time.monotonic() > self.deadline:
            raise _timed_out(self.what)

    @property
    def call_pieces(self) -> list[tuple[Timeline, list[tuple[int, int, int]]]]:
        """Each call's timeline cut into ranked pieces (``ranked_pieces``), in ``requests``'
        order: its attribution and the run both read them."""
        return self.piece("call pieces", lambda: [ranked_pieces(r) for r in self.requests])

    def attributions(self, stall_threshold_ms: float) -> list[RequestAttribution]:
        """Each call's attribution, in ``requests``' order: the run's when it is worked out."""

        def work() -> list[RequestAttribution]:
            run = self.worked.pieces.get(("run", stall_threshold_ms))
            if run is not None:
                return [c.attribution for c in run.calls]
            stall = _stall_ns(stall_threshold_ms)
            out = []
            for i, (r, pieces) in enumerate(zip(self.requests, self.call_pieces, strict=True)):
                out.append(
                    attribute_request(self.trace_id, r, stall_threshold_ns=stall, pieces=pieces)
                )
                if i % 256 == 255:
                    self.check()
            return out

        return self.piece(("attributions", stall_threshold_ms), work)

    def run(self, stall_threshold_ms: float) -> RunExplanation:
        """The trace as one run (``explain_run``), over the index, calls and attributions worked
        out already."""

        def work() -> RunExplanation:
            run = explain_run(
                self.trace_id, self.spans, stall_threshold_ns=_stall_ns(stall_threshold_ms),
                index=self.index, requests=self.requests,
                attributions=self.worked.pieces.get(("attributions", stall_threshold_ms)),
                call_pieces=self.call_pieces,
            )  # fmt: skip
            assert run is not None  # spans is not empty
            return run

        return self.piece(("run", stall_threshold_ms), work)

    def skews(self) -> dict[str, int]:
        """Request span id -> its server clock's skew (``clock_skew_ns``: ``-timeline.offset``),
        for every request whose server runs on another clock."""
        return self.piece(
            "skews",
            lambda: {r.span_id: -tl.offset for r in self.requests if (tl := timeline(r)).offset},
        )


class _Shared:
    """The answers kept as pieces of a trace's state (``_Trace.answer``), by ``id``: their JSON
    is a piece of that state too. Each entry goes when its answer is freed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.states: dict[int, tuple[weakref.ref[_Worked], Hashable]] = {}

    def share(self, answer: Answer, worked: _Worked, name: Hashable) -> None:
        key = id(answer)
        with self.lock:
            if key in self.states:
                return
            self.states[key] = (weakref.ref(worked), name)
        weakref.finalize(answer, self.states.pop, key, None)

    def state(self, answer: Answer) -> tuple[_Worked, Hashable] | None:
        entry = self.states.get(id(answer))
        if entry is None:
            return None
        worked = entry[0]()
        return None if worked is None else (worked, entry[1])


_SHARED = _Shared()


def json_of(answer: Answer) -> bytes:
    """``answer``'s JSON. An answer askers share (a trace's, ``_Trace.answer``) is written once
    and kept with its trace's state, its size counted with the state's text (``_Kept``): a wide
    trace's answer is tens of thousands of rows, and writing them again for every asker was most
    of a repeated answer's CPU, all of it holding the GIL that ingest needs too."""
    return _kept_bytes(answer, "json", lambda: answer.__pydantic_serializer__.to_json(answer))


def gzip_kept(answer: Answer) -> bytes | None:
    """``answer``'s JSON compressed with gzip, when an asker of this shared answer compressed it
    already (``keep_gzip``); else None."""
    return _kept(answer, "gzip")


def keep_gzip(answer: Answer, packed: bytes) -> None:
    """Keep ``packed`` (``answer``'s JSON compressed with gzip) with a shared answer's state as
    its JSON is (``json_of``), so its next askers are sent it as it is; nothing for an answer
    that is not shared."""
    _kept_bytes(answer, "gzip", lambda: packed)


def _kept(answer: Answer, kind: str) -> bytes | None:
    """The piece (``kind``, the answer's name) kept with a shared answer's state; None when there
    is none, or the answer is not shared."""
    shared = _SHARED.state(answer)
    if shared is None:
        return None
    worked, name = shared
    key = (kind, name)
    with _SHARED.lock:
        kept: bytes | None = worked.pieces.get(key)
        if kept is not None:
            worked.made.move_to_end(key)
        return kept


def _kept_bytes(answer: Answer, kind: str, make: Callable[[], bytes]) -> bytes:
    """``make()``; for an answer askers share, made once and kept with its trace's state as the
    piece (``kind``, the answer's name), its size counted with the state's text."""
    kept = _kept(answer, kind)
    if kept is not None:
        return kept
    made = make()
    shared = _SHARED.state(answer)
    if shared is None:
        return made
    worked, name = shared
    key = (kind, name)
    # Two askers may make it at once: the first kept is the one counted and served. Counted under
    # a lock: askers of two answers of one state add to its count at once, and trimming drops.
    with _SHARED.lock:
        kept = worked.pieces.setdefault(key, made)
        if kept is made:
            worked.made[key] = len(made)
    return kept


@contextlib.contextmanager
def _reading(store: Store, trace_id: str, what: str, max_spans: int) -> Iterator[_Trace]:
    """The trace in its current state, within the bounds (the module's docstring); NotFound
    when it has no spans."""
    deadline = time.monotonic() + store.query_timeout_s
    with _GATE.slot(deadline, what), _CYCLES.paused():
        counted, fingerprint = store.query_rows(
            _STATE, {"trace_id": trace_id, "limit": max_spans + 1}
        )[0]
        counted = int(counted)
        if counted > max_spans:
            raise TraceTooLarge(trace_id, counted, max_spans)
        if not counted:
            raise _not_found(trace_id)
        key = (weakref.ref(store), trace_id, counted, int(fingerprint))
        state = _KEPT.state(key, counted, max_spans)
        loaded = _Trace(trace_id, state, deadline, what, store, max_spans)
        try:
            loaded.check()
            yield loaded
        finally:
            _KEPT.trim(max_spans)


def _not_found(trace_id: str) -> NotFound:
    return NotFound("trace_not_found", f"no spans stored for trace {trace_id}")


def _load(store: Store, trace_id: str, max_spans: int) -> list[SpanRecord]:
    max_bytes = max_spans * SHOWN_BYTES_PER_SPAN
    try:
        spans = load_trace(store, trace_id, max_bytes=max_bytes)
    except StoreResultTooLarge:
        raise TraceTooHeavy(trace_id, max_bytes, max_spans) from None
    if not spans:
        raise _not_found(trace_id)
    return spans


def _stall_ns(stall_threshold_ms: float) -> int:
    return round(stall_threshold_ms * 1e6)
