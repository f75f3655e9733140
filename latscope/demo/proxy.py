"""A TCP proxy that delays every chunk by a fixed time in each direction: a slow network.

Chunks are held, in order, until ``delay`` after they arrived, then forwarded; the proxy reads
on while it holds, so delay adds latency without capping bandwidth (like ``tc netem delay``).
It records the hold each request really got: the hold of the last chunk of the request going
up and of the last chunk of its response coming down, which together are what it added to the
request's end-to-end time. Requests are told apart by their ``x-request-id`` header (HTTP/1.1
keeps one request at a time per connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import OrderedDict
from dataclasses import dataclass, field

log = logging.getLogger("latscope.demo.proxy")

_REQUEST_ID = re.compile(rb"\r\nx-request-id:[ \t]*([^\r\n]+)", re.IGNORECASE)

#: Chunks in flight per direction at most; reading pauses beyond it (backpressure).
MAX_HELD_CHUNKS = 1024
READ_SIZE = 64 * 1024
#: Requests remembered at most; the oldest are forgotten first (and counted).
MAX_RECORDS = 100_000


@dataclass
class _Connection:
    request_id: str | None = None


@dataclass
class ProxyRecord:
    """What the proxy added to one request, in ns (monotonic holds)."""

    up_ns: int = 0
    down_ns: int = 0

    @property
    def added_ns(self) -> int:
        return self.up_ns + self.down_ns


@dataclass
class DelayProxy:
    """``await start()``, point clients at ``address``, ``await stop()``.

    Example::

        proxy = DelayProxy(("127.0.0.1", 8000), delay_s=0.05)
        host, port = await proxy.start()
    """

    upstream: tuple[str, int]
    delay_s: float
    listen: tuple[str, int] = ("127.0.0.1", 0)
    records: OrderedDict[str, ProxyRecord] = field(default_factory=OrderedDict)
    forgotten: int = 0
    connections: int = 0
    address: tuple[str, int] | None = None
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> tuple[str, int]:
        if self.delay_s < 0:
            raise ValueError("delay_s must be >= 0")
        self._server = await asyncio.start_server(self._handle, *self.listen)
        host, port = self._server.sockets[0].getsockname()[:2]
        self.address = (host, port)
        return host, port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            await self._server.wait_closed()

    def record(self, request_id: str) -> ProxyRecord:
        rec = self.records.get(request_id)
        if rec is None:
            rec = self.records[request_id] = ProxyRecord()
            while len(self.records) > MAX_RECORDS:
                self.records.popitem(last=False)
                self.forgotten += 1
        return rec

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            try:
                server_r, server_w = await asyncio.open_connection(*self.upstream)
            except OSError as exc:
                log.warning("proxy: cannot reach %s:%s: %s", *self.upstream, exc)
                return
            conn = _Connection()
            up = asyncio.create_task(self._pipe(client_r, server_w, conn, upstream=True))
            down = asyncio.create_task(self._pipe(server_r, client_w, conn, upstream=False))
            try:
                await asyncio.gather(up, down)
            finally:
                for t in (up, down):
                    t.cancel()
                server_w.close()
        except asyncio.CancelledError:
            # stop() cancels connections still open. The task ends normally instead of as
            # cancelled: Python 3.11's start_server callback calls task.exception() on it, which
            # raises for a cancelled task and logs a traceback per connection (3.12 checks first).
            return
        finally:
            client_w.close()
            self._tasks.discard(task)

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        conn: _Connection,
        *,
        upstream: bool,
    ) -> None:
        held: asyncio.Queue[tuple[int, bytes, str | None] | None] = asyncio.Queue(MAX_HELD_CHUNKS)
        delay_ns = round(self.delay_s * 1e9)

        async def forward() -> None:
            while (item := await held.get()) is not None:
                received, data, request_id = item
                wait = (received + delay_ns - time.monotonic_ns()) / 1e9
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                hold = time.monotonic_ns() - received
                if request_id is not None:
                    rec = self.record(request_id)
                    if upstream:
                        rec.up_ns = hold
                    else:
                        rec.down_ns = hold
                await writer.drain()
            if writer.can_write_eof():
                with contextlib.suppress(OSError):
                    writer.write_eof()

        sender = asyncio.create_task(forward())
        try:
            while True:
                try:
                    data = await reader.read(READ_SIZE)
                except (ConnectionError, OSError):
                    data = b""
                received = time.monotonic_ns()
                if not data:
                    break
                if upstream and (m := _REQUEST_ID.search(data)):
                    conn.request_id = m.group(1).strip().decode("latin-1")
                await held.put((received, data, conn.request_id))
            await held.put(None)
            await sender
        finally:
            sender.cancel()
