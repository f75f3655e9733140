"""A continuous-batching scheduler, as vLLM and SGLang run one, with the GPU replaced by sleeps.

Each step of the loop is either a prefill step (admit waiting requests into free batch slots and
run their prompts; every admitted request gets its first token) or a decode step (every running
sequence gets one more token). Prefill steps go first, so a long prompt holds every running
stream back: the inter-token stall that chunked prefill exists to avoid.

The cost of each step comes from ``EngineConfig``; time passes in ``asyncio.sleep`` so the
simulation needs no CPU, and a busy machine only adds scheduling jitter (recorded by the ground
truth, which measures where each request is rather than trusting the cost model).
"""

from __future__ import annotations

import asyncio
import logging
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
        self.peak_running = 0
        self.peak_waiting = 0

    def submit(self, seq: Sequence, *, force: bool = False) -> Sequence:
        """Queue ``seq`` for a batch slot; raises Overloaded when the waiting queue is full
        (unless ``force``: the caller checked ``full()`` before its own work)."""
        if not force and self.full():
            self.rejected += 1
            raise Overloaded(f"{len(self.waiting)} requests already waiting")
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
        admitted: list[Sequence] = []
        while self.waiting and len(self.running) + len(admitted) < self.config.max_batch:
            seq = self.waiting.popleft()
            if seq.cancelled:
                continue
            seq.admitted.set()
            admitted.append(seq)
        return admitted

    async def _prefill(self, admitted: list[Sequence]) -> None:
        self.prefill_steps += 1
        cost = self.config.prefill_cost_ms(sum(s.prompt_tokens for s in admitted))
        await self._sleep(cost / 1000)
        for seq in admitted:
            if seq.done:
                continue
            self.running.append(seq)
            self._emit(seq)
        self.peak_running = max(self.peak_running, len(self.running))

    async def _decode(self) -> None:
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
