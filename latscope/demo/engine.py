"""A continuous-batching scheduler, as vLLM and SGLang run one, with the GPU replaced by sleeps.

Each step of the loop is either a prefill step (admit waiting requests into free batch slots and
run their prompts; every admitted request gets its first token) or a decode step (every running
sequence gets one more token). Prefill steps go first, so a long prompt holds every running
stream back: the inter-token stall that chunked prefill exists to avoid. With a bounded KV cache,
a batch that outgrows it has its newest sequences preempted (vLLM's recompute policy): they go
back to the head of the queue and their streams stall until they are recomputed.

The cost of each step comes from ``EngineConfig``; time passes in ``asyncio.sleep`` so the
simulation needs no CPU, and a busy machine only adds scheduling jitter (recorded by the ground
truth, which measures where each request is rather than trusting the cost model).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from latscope.demo.scenarios import EngineConfig

log = logging.getLogger("latscope.demo.engine")

#: Stands in for the end of a sequence in its token queue.
END = None

_WORDS = (
    "the", "latency", "of", "a", "request", "is", "spent", "in", "queue", "prefill",
    "decode", "and", "network", "time", "token", "batch", "model", "server", "fast", "slow",
)  # fmt: skip


class Overloaded(Exception):
    """The waiting queue is full; the server answers 503 and the client may retry."""


@dataclass(eq=False)
class Sequence:
    """One request inside the engine."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    generated: int = 0
    #: Times the engine preempted it for KV-cache space (its stream stalled each time).
    preempted: int = 0
    cancelled: bool = False
    finished: bool = False
    admitted: asyncio.Event = field(default_factory=asyncio.Event)
    #: Tokens as they are produced, then END. Holds at most max_tokens + 1 items.
    tokens: asyncio.Queue[str | None] = field(default_factory=asyncio.Queue)

    @property
    def done(self) -> bool:
        return self.cancelled or self.finished

    @property
    def context(self) -> int:
        return self.prompt_tokens + self.generated


Sleep = Callable[[float], Awaitable[object]]


class Engine:
    """The scheduler loop; ``submit`` a sequence, then read its ``tokens``.

    Example::

        engine = Engine(EngineConfig())
        task = asyncio.create_task(engine.run())
        seq = engine.submit(Sequence("r1", prompt_tokens=100, max_tokens=20))
        await seq.admitted.wait()
        first = await seq.tokens.get()
    """

    def __init__(self, config: EngineConfig, *, sleep: Sleep = asyncio.sleep) -> None:
        if config.max_batch < 1 or config.max_waiting < 0:
            raise ValueError("max_batch must be >= 1 and max_waiting >= 0")
        self.config = config
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._sleep = sleep
        self._wake = asyncio.Event()
        self._stopped = False
        #: Counters for /demo/stats: steps run, requests rejected as overloaded.
        self.prefill_steps = 0
        self.decode_steps = 0
        self.rejected = 0
        self.preemptions = 0
        self.peak_running = 0
        self.peak_waiting = 0
        self.cold_prefill_steps = 0
        #: When the first request came (monotonic s): the replica's cold period runs from here,
        #: as kernels compile and caches fill on first use (and as latscope counts a replica's
        #: warm-up from its first request).
        self.started: float | None = None

    def cold(self) -> bool:
        """Whether the engine is still in its cold period (``EngineConfig.cold_s``); before its
        first request it is."""
        if not self.config.cold_s:
            return False
        return self.started is None or time.monotonic() - self.started < self.config.cold_s

    def submit(self, seq: Sequence, *, force: bool = False) -> Sequence:
        """Queue ``seq`` for a batch slot; raises Overloaded when the waiting queue is full
        (unless ``force``: the caller checked ``full()`` before its own work)."""
        if not force and self.full():
            self.rejected += 1
            raise Overloaded(f"{len(self.waiting)} requests already waiting")
        if self.started is None:
            self.started = time.monotonic()
        self.waiting.append(seq)
        self.peak_waiting = max(self.peak_waiting, len(self.waiting))
        self._wake.set()
        return seq

    def full(self) -> bool:
        return len(self.waiting) >= self.config.max_waiting

    def cancel(self, seq: Sequence) -> None:
        """Drop ``seq`` (its client went away); frees its slot at the next step."""
        seq.cancelled = True

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()

    async def run(self) -> None:
        """Run steps until ``stop()``."""
        while not self._stopped:
            self.running = [s for s in self.running if not s.done]
            if not self.waiting and not self.running:
                self._wake.clear()
                await self._wake.wait()
                continue
            admitted = self._admit()
            if admitted:
                await self._prefill(admitted)
            elif self.running:
                await self._decode()

    def _admit(self) -> list[Sequence]:
        """FIFO into free slots, within the prefill-token budget and the KV cache."""
        config = self.config
        admitted: list[Sequence] = []
        tokens = 0
        kv_used = sum(s.context for s in self.running)
        while self.waiting and len(self.running) + len(admitted) < config.max_batch:
            seq = self.waiting[0]
            if seq.cancelled:
                self.waiting.popleft()
                continue
            if admitted and tokens + seq.context > config.max_prefill_tokens:
                break
            over_kv = config.kv_cache_tokens and kv_used + seq.context + 1 > config.kv_cache_tokens
            if over_kv and (self.running or admitted):
                break  # wait for running sequences to finish and free their cache
            self.waiting.popleft()
            seq.admitted.set()
            admitted.append(seq)
            tokens += seq.context
            kv_used += seq.context
        return admitted

    def _preempt(self) -> None:
        """Make room for one more token per running sequence, newest out first (recompute)."""
        limit = self.config.kv_cache_tokens
        if not limit:
            return
        need = sum(s.context + 1 for s in self.running)
        while need > limit and len(self.running) > 1:
            victim = self.running.pop()
            need -= victim.context + 1
            victim.preempted += 1
            self.preemptions += 1
            self.waiting.appendleft(victim)

    async def _prefill(self, admitted: list[Sequence]) -> None:
        self.prefill_steps += 1
        # A preempted sequence recomputes its whole context, generated tokens included.
        cost = self.config.prefill_cost_ms(sum(s.context for s in admitted))
        if self.cold():
            cost += self.config.cold_prefill_ms
            self.cold_prefill_steps += 1
        await self._sleep(cost / 1000)
        for seq in admitted:
            if seq.done:
                continue
            self.running.append(seq)
            self._emit(seq)
        self.peak_running = max(self.peak_running, len(self.running))

    async def _decode(self) -> None:
        self._preempt()
        self.decode_steps += 1
        batch = self.running
        cost = self.config.decode_cost_ms(len(batch), sum(s.context for s in batch))
        await self._sleep(cost / 1000)
        for seq in batch:
            if not seq.done:
                self._emit(seq)

    def _emit(self, seq: Sequence) -> None:
        seq.tokens.put_nowait(_WORDS[(seq.generated * 7 + seq.prompt_tokens) % len(_WORDS)])
        seq.generated += 1
        if seq.generated >= seq.max_tokens:
            seq.tokens.put_nowait(END)
            seq.finished = True  # leaves the batch at the next step
