"""The load generator: users calling an OpenAI-compatible server through an instrumented httpx.

A closed loop of ``concurrency`` users (each sends its next request when the last one is done)
or Poisson arrivals at ``rate`` requests per second, with log-normal prompt and output lengths.
Every request carries an ``x-request-id`` (to join it with the server's and the proxy's ground
truth) and a CLIENT span from ``latscope.sdk.client_call`` (with the first byte and the first
streamed token marked). The client's own truth is the end-to-end time read on
``time.monotonic_ns`` around the whole call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from latscope import sdk
from latscope.demo.scenarios import Lengths, LoadConfig, Scenario

_VOCABULARY = (
    "what", "where", "does", "the", "time", "go", "when", "a", "model", "answers", "latency",
    "prompt", "tokens", "please", "summarize", "this", "document", "about", "serving", "gpus",
)  # fmt: skip

CHAT_PATH = "/v1/chat/completions"
#: Results kept at most; later calls are counted in ``LoadGenerator.not_kept``.
MAX_RESULTS = 100_000


@dataclass
class RequestResult:
    """One call as the client saw it. ``e2e_ns`` is read on the monotonic clock, as a bracket
    around the SDK's own readings (see ``latscope.demo.truth``)."""

    request_id: str
    stream: bool
    prompt_words: int
    max_tokens: int
    trace_id: str | None = None
    #: The CLIENT span's id (from ``traceparent``): with the trace id, latscope's request id.
    span_id: str | None = None
    status: int | None = None
    error: str | None = None
    e2e_ns: tuple[int, int] = (0, 0)
    #: Brackets of the CLIENT span's start and end readings on this process's monotonic clock
    #: (an agent run's truth places its calls with them).
    start_ns: tuple[int, int] = (0, 0)
    end_ns: tuple[int, int] = (0, 0)
    ttft_ns: int | None = None
    output_tokens: int = 0
    prompt_tokens: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    @property
    def latscope_id(self) -> str | None:
        """The id latscope names this call by (``/v1/requests/{id}``)."""
        if not self.trace_id or not self.span_id:
            return self.trace_id
        return f"{self.trace_id}-{self.span_id}"

    def to_json(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "trace_id": self.trace_id,
            "span_id": self.span_id,
            "status": self.status,
            "error": self.error,
            "stream": self.stream,
            "e2e_ns": list(self.e2e_ns),
            "ttft_ns": self.ttft_ns,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
        }


@dataclass
class PendingCall:
    """A call whose CLIENT span has started and whose request has not gone out yet."""

    result: RequestResult
    call: sdk.ClientCall
    url: str
    body: dict[str, Any]
    headers: dict[str, str]


def sample_length(rng: random.Random, dist: Lengths) -> int:
    """A log-normal length around ``dist.median``, clipped to [low, high]."""
    value = round(dist.median * math.exp(rng.gauss(0.0, dist.sigma)))
    return max(dist.low, min(dist.high, value))


def trace_id_of(headers: dict[str, str]) -> str | None:
    """The trace id the SDK put in ``traceparent`` (``00-<trace>-<span>-01``)."""
    parts = headers.get("traceparent", "").split("-")
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else None


def span_id_of(headers: dict[str, str]) -> str | None:
    """The calling span's id in ``traceparent``: the SDK's CLIENT span."""
    parts = headers.get("traceparent", "").split("-")
    return parts[2] if len(parts) == 4 and len(parts[2]) == 16 else None


@dataclass
class LoadGenerator:
    """Drive ``base_url`` with the scenario's load for ``duration_s`` seconds.

    Example::

        results = await LoadGenerator("http://127.0.0.1:8000", scenario, duration_s=10).run()
    """

    base_url: str
    scenario: Scenario
    duration_s: float
    seed: int = 0
    progress: bool = True
    console: Console | None = None
    #: Seconds to let requests still in flight at the end finish before cancelling them.
    drain_s: float = 60.0
    #: Replicas' base URLs, called round-robin (default: ``base_url`` alone); may grow while
    #: the load runs (a scale-up).
    urls: list[str] = field(default_factory=list)
    results: list[RequestResult] = field(default_factory=list)
    skipped: int = 0
    _turn: int = 0
    not_kept: int = 0
    in_flight: int = 0

    @property
    def load(self) -> LoadConfig:
        return self.scenario.load

    async def run(self) -> list[RequestResult]:
        rng = random.Random(self.seed)
        limits = httpx.Limits(
            max_connections=self.load.max_in_flight + self.load.concurrency,
            max_keepalive_connections=self.load.max_in_flight + self.load.concurrency,
        )
        timeout = httpx.Timeout(300.0, connect=10.0)
        async with httpx.AsyncClient(
            base_url=self.base_url, limits=limits, timeout=timeout
        ) as client:
            deadline = time.monotonic() + self.duration_s
            with self._progress() as progress:
                ticker = asyncio.create_task(self._tick(progress, deadline))
                try:
                    if self.load.rate:
                        await self._open_loop(client, rng, deadline)
                    else:
                        await self._closed_loop(client, rng, deadline)
                finally:
                    ticker.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await ticker
                    self._show(progress, deadline)
        return self.results

    async def _closed_loop(
        self, client: httpx.AsyncClient, rng: random.Random, deadline: float
    ) -> None:
        async def user(n: int) -> None:
            user_rng = random.Random(rng.random() + n)
            while time.monotonic() < deadline:
                await self._call(client, user_rng)

        users = [asyncio.create_task(user(n)) for n in range(self.load.concurrency)]
        await self._drain(users, deadline)

    async def _open_loop(
        self, client: httpx.AsyncClient, rng: random.Random, deadline: float
    ) -> None:
        assert self.load.rate
        calls: set[asyncio.Task[None]] = set()
        # Arrival times are drawn on an absolute schedule, so a late wake-up (a busy event
        # loop) does not slow the offered rate down.
        arrival = time.monotonic()
        while True:
            arrival += rng.expovariate(self.load.rate)
            if arrival >= deadline:
                break
            await asyncio.sleep(max(0.0, arrival - time.monotonic()))
            if self.in_flight >= self.load.max_in_flight:
                self.skipped += 1  # open loop, bounded: a full client drops the arrival
                continue
            task = asyncio.create_task(self._call(client, random.Random(rng.random())))
            calls.add(task)
            task.add_done_callback(calls.discard)
        await self._drain(list(calls), deadline)

    async def _drain(self, tasks: list[asyncio.Task[None]], deadline: float) -> None:
        if not tasks:
            return
        _, pending = await asyncio.wait(
            tasks, timeout=max(0.0, deadline - time.monotonic()) + self.drain_s
        )
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def _next_url(self) -> str:
        if not self.urls:
            return self.base_url
        self._turn += 1
        return self.urls[self._turn % len(self.urls)]

    async def _call(self, client: httpx.AsyncClient, rng: random.Random) -> None:
        await self.call(client, rng)

    async def call(
        self,
        client: httpx.AsyncClient,
        rng: random.Random,
        *,
        words: int | None = None,
        max_tokens: int | None = None,
        stream: bool | None = None,
    ) -> RequestResult:
        """One chat call (lengths drawn from the scenario unless given); its result is kept."""
        return await self.send(client, self.open(rng, words=words, max_tokens=max_tokens,
                                                 stream=stream))  # fmt: skip

    def open(
        self,
        rng: random.Random,
        *,
        words: int | None = None,
        max_tokens: int | None = None,
        stream: bool | None = None,
    ) -> PendingCall:
        """Start a call's CLIENT span (the request goes out with ``send``): a fan-out opens all
        its spans at once, as an app does before it sends the requests together."""
        load = self.load
        base = self._next_url()
        words = sample_length(rng, load.prompt) if words is None else words
        result = RequestResult(
            request_id=uuid.uuid4().hex,
            stream=rng.random() >= load.non_stream_share if stream is None else stream,
            prompt_words=words,
            max_tokens=sample_length(rng, load.output) if max_tokens is None else max_tokens,
        )
        body = {
            "model": self.scenario.model,
            "messages": [{"role": "user", "content": " ".join(rng.choices(_VOCABULARY, k=words))}],
            "max_tokens": result.max_tokens,
            "stream": result.stream,
        }
        if result.stream:
            body["stream_options"] = {"include_usage": True}
        self.in_flight += 1
        headers = {"x-request-id": result.request_id}
        # The truth brackets the SDK's CLIENT span: read right before it starts and right
        # before it ends, on a clock of its own.
        start = time.monotonic_ns()
        call = sdk.client_call("POST", base + CHAT_PATH, headers=headers, model=self.scenario.model)
        result.start_ns = (start, time.monotonic_ns())
        result.trace_id = trace_id_of(headers)
        result.span_id = span_id_of(headers)
        return PendingCall(result, call, base + CHAT_PATH, body, headers)

    async def send(self, client: httpx.AsyncClient, pending: PendingCall) -> RequestResult:
        """Send an opened call and read its answer; ends its span."""
        result, call = pending.result, pending.call
        start, start_after = result.start_ns
        try:
            try:
                async with client.stream(
                    "POST", pending.url, json=pending.body, headers=pending.headers
                ) as response:
                    call.first_byte()
                    call.set_status_code(response.status_code)
                    result.status = response.status_code
                    if result.stream and response.status_code == 200:
                        await self._read_events(response, result, start, call)
                    else:
                        payload = json.loads(await response.aread() or b"{}")
                        call.first_token()
                        usage = payload.get("usage") or {}
                        result.output_tokens = int(usage.get("completion_tokens") or 0)
                        result.prompt_tokens = usage.get("prompt_tokens")
                end = time.monotonic_ns()
                call.finish()
                end_after = time.monotonic_ns()
                result.e2e_ns = (end - start_after, end_after - start)
                result.end_ns = (end, end_after)
            except BaseException as exc:
                end = time.monotonic_ns()
                call.finish(exc)
                end_after = time.monotonic_ns()
                result.e2e_ns = (end - start_after, end_after - start)
                result.end_ns = (end, end_after)
                raise
        except (httpx.HTTPError, ValueError) as exc:
            result.error = f"{type(exc).__name__}: {exc}"
        except asyncio.CancelledError:
            result.error = "cancelled at the end of the run"
            raise
        finally:
            self.in_flight -= 1
            if len(self.results) < MAX_RESULTS:
                self.results.append(result)
            else:
                self.not_kept += 1
        return result

    @staticmethod
    async def _read_events(
        response: httpx.Response, result: RequestResult, start: int, call: sdk.ClientCall
    ) -> None:
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                result.prompt_tokens = event["usage"].get("prompt_tokens")
            for choice in event.get("choices") or ():
                if (choice.get("delta") or {}).get("content"):
                    if result.ttft_ns is None:
                        result.ttft_ns = time.monotonic_ns() - start
                        call.first_token()
                    result.output_tokens += 1

    def _progress(self) -> Progress:
        console = self.console or Console(stderr=True)
        return Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[status]}"),
            TimeRemainingColumn(),
            console=console,
            transient=False,
            disable=not self.progress or not console.is_terminal,
        )

    async def _tick(self, progress: Progress, deadline: float) -> None:
        while True:
            self._show(progress, deadline)
            await asyncio.sleep(0.25)

    def _show(self, progress: Progress, deadline: float) -> None:
        if not progress.task_ids:
            progress.add_task(f"load: {self.scenario.name}", total=self.duration_s, status="")
        done = len(self.results) + self.not_kept
        errors = sum(1 for r in self.results if not r.ok)
        status = f"{done} done · {self.in_flight} in flight · {errors} errors"
        left = deadline - time.monotonic()
        description = f"load: {self.scenario.name}"
        if left <= 0 and self.in_flight:
            description = f"finishing: {self.scenario.name}"
        progress.update(
            progress.task_ids[0],
            completed=self.duration_s - max(0.0, left),
            status=status,
            description=description,
        )
