"""``latscope top``: attributed requests live, as they complete, with a rolling budget per
service and model.

Three feeds give the same rows (the API's attribution JSON, with the ``request_id`` that
``latscope explain`` takes):

- by default, the REST API of a running latscope (``--url`` / ``LATSCOPE_URL``), polled through
  ``GET /v1/live``: it works wherever the API is reachable (behind a proxy, with a token), and
  the gRPC port need not be;
- ``--grpc HOST:PORT``: the gRPC ``Watch`` stream on a running latscope's OTLP/gRPC port (pushed,
  no polling);
- ``--store DSN``: the store itself, read directly.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import grpc
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from latscope.cmd import _render as r
from latscope.cmd._source import (
    DEFAULT_TIMEOUT_S,
    HttpSource,
    SourceError,
    _token,
    default_url,
    open_store,
)
from latscope.semconv import BUCKETS

HELP = "live: requests as they complete, with a rolling latency budget per service/model"

#: How many recent requests the screen keeps (the rolling figures use the same ones).
RECENT = 500
#: How long to wait for the server's gRPC port before saying it is not there.
CONNECT_TIMEOUT_S = 5.0
#: How often the REST feed asks for what is new, and how many it takes per answer.
POLL_S = 0.5
POLL_LIMIT = 500
#: Rows of the "latest" table.
LATEST = 15


def add_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--url",
        help="a running latscope API, polled over REST [env LATSCOPE_URL, default "
        "http://127.0.0.1:8080]",
    )
    where.add_argument(
        "--grpc",
        metavar="HOST:PORT",
        help="stream from a running latscope's gRPC Watch instead (its OTLP/gRPC port, e.g. "
        "127.0.0.1:4317)",
    )
    where.add_argument("--store", metavar="DSN", help="poll the store directly instead")
    parser.add_argument("--token-file", metavar="PATH", help="bearer token [env LATSCOPE_TOKEN]")
    parser.add_argument("--service", default="", help="only this service")
    parser.add_argument("--model", default="", help="only this model")
    parser.add_argument(
        "--min-e2e-ms", type=float, default=0.0, help="only requests at least this slow"
    )
    parser.add_argument("--count", type=int, default=0, help="stop after this many requests")
    parser.add_argument("--duration", type=float, default=0.0, help="stop after this many s")
    parser.add_argument(
        "--json", action="store_true", help="print one JSON line per request instead"
    )


class Feed:
    """Attributed requests as they come. ``connect()`` fails with SourceError before anything
    is drawn; iterating yields requests until the deadline (``--duration``) or the end."""

    description = ""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.deadline = time.monotonic() + args.duration if args.duration else None

    def alive(self) -> bool:
        return self.deadline is None or time.monotonic() < self.deadline

    @property
    def note(self) -> str:
        """Anything the screen should say about the feed itself."""
        return ""

    def connect(self) -> None:
        raise NotImplementedError

    def __iter__(self) -> Iterator[dict[str, Any]]:
        raise NotImplementedError

    def close(self) -> None:
        return None


def _live_request(request: Any) -> dict[str, Any]:
    """One live request through its model (``schemas.LiveRequest``): every feed renders the
    same keys, whether it came from /v1/live, Watch or the store."""
    from latscope.api.schemas import LiveRequest

    return LiveRequest.model_validate(request).json_dict()


class RestFeed(Feed):
    """Polls ``GET /v1/live`` with the cursor of each answer."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.source = HttpSource(args.url or default_url(), _token(args), DEFAULT_TIMEOUT_S)
        self.description = self.source.url
        self.cursor: int | None = None
        self.epoch: str | None = None
        self.missed = 0

    def _ask(self) -> list[dict[str, Any]]:
        body = self.source.get(
            "/v1/live",
            after=self.cursor,
            epoch=self.epoch,
            service=self.args.service,
            model=self.args.model,
            min_e2e_ms=self.args.min_e2e_ms or None,
            limit=POLL_LIMIT,
        )
        self.cursor, self.epoch = body["cursor"], body["epoch"]
        self.missed += body["missed"]
        return [_live_request(r) for r in body["requests"]]

    def connect(self) -> None:
        self._ask()  # the cursor to start from: requests attributed from now on

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while self.alive():
            requests = self._ask()
            yield from requests
            if len(requests) < POLL_LIMIT:
                time.sleep(POLL_S if self.deadline is None else min(POLL_S, self._left()))

    @property
    def note(self) -> str:
        if not self.missed:
            return ""
        return f"{self.missed} requests came faster than top read them and are not shown"

    def _left(self) -> float:
        return max(0.0, (self.deadline or 0.0) - time.monotonic())

    def close(self) -> None:
        self.source.close()


class GrpcFeed(Feed):
    """The gRPC ``Watch`` stream."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.target = args.grpc
        self.description = f"gRPC {self.target}"
        token = _token(args)
        self.metadata = (("authorization", f"Bearer {token}"),) if token else None
        self.channel = grpc.insecure_channel(self.target)

    def _absent(self) -> SourceError:
        return SourceError(
            f"no latscope gRPC at {self.target} — start it with `latscope serve`, pass the "
            "OTLP/gRPC port as --grpc HOST:PORT, or leave --grpc out to ask the REST API (--url)"
        )

    def connect(self) -> None:
        try:
            grpc.channel_ready_future(self.channel).result(timeout=CONNECT_TIMEOUT_S)
        except grpc.FutureTimeoutError:
            raise self._absent() from None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        from latscope.api.grpc_service import attribution_dict
        from latscope.v1 import query_pb2, query_pb2_grpc

        stub = query_pb2_grpc.QueryServiceStub(self.channel)
        request = query_pb2.WatchRequest(
            service=self.args.service, model=self.args.model, min_e2e_ms=self.args.min_e2e_ms
        )
        stream = stub.Watch(request, metadata=self.metadata, timeout=self.args.duration or None)
        try:
            for message in stream:
                yield _live_request(attribution_dict(message))
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                return
            if code == grpc.StatusCode.UNAVAILABLE:
                raise self._absent() from None
            if code == grpc.StatusCode.UNAUTHENTICATED:
                raise SourceError(
                    f"{self.target} needs a token: pass --token-file PATH or set LATSCOPE_TOKEN"
                ) from None
            raise SourceError(f"Watch failed: {code.name}: {exc.details()}") from None
        finally:
            stream.cancel()

    def close(self) -> None:
        self.channel.close()


class StoreFeed(Feed):
    """The store read directly: newly attributed rows, as the server's own live feed reads."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.description = args.store
        self.store: Any = None
        self.poller: Any = None

    def connect(self) -> None:
        from latscope.api.live import LiveHub, TablePoller, WatchFilter

        self.store = open_store(self.args.store)
        self.hub = LiveHub()
        sub = self.hub.subscribe(
            WatchFilter(self.args.service, self.args.model, self.args.min_e2e_ms)
        )
        assert sub is not None  # a private hub has room
        self.sub = sub
        self.poller = TablePoller(self.store, poll_s=0.5, hub=self.hub)
        self.poller.start()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        from latscope.api.live import iter_subscription

        for request in iter_subscription(self.sub, alive=self.alive):
            yield _live_request(request)

    def close(self) -> None:
        if self.poller is not None:
            self.poller.stop(time.monotonic() + 5)
        if self.store is not None:
            self.store.close()


def open_feed(args: argparse.Namespace) -> Feed:
    if args.store:
        return StoreFeed(args)
    if args.grpc:
        return GrpcFeed(args)
    return RestFeed(args)


def _ended_ns(request: dict[str, Any]) -> float:
    return request["start_unix_nano"] + request["e2e_ms"] * 1e6


def _screen(recent: deque[dict[str, Any]], seen: int, source: str, note: str = "") -> Group:
    head = Text("latscope top", style="bold").append(f"  {source}  {seen} requests seen", style="")
    if note:
        head.append(f"  ({note})", style="yellow")
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for req in recent:
        groups.setdefault((req["service"], req["model"]), []).append(req)
    budget = Table(header_style="bold", box=None, pad_edge=False, title_justify="left")
    for col in ("service", "model", "n", "p50", "p99", "budget"):
        names = col in ("service", "model")  # these wrap; the figures and bars never do
        budget.add_column(col, justify="left" if names or col == "budget" else "right",
                          no_wrap=not names)  # fmt: skip
    for (service, model), reqs in sorted(groups.items()):
        e2e = sorted(q["e2e_ms"] for q in reqs)
        totals = {b: sum(q["buckets_ms"].get(b) or 0.0 for q in reqs) for b in BUCKETS}
        p99 = e2e[min(len(e2e) - 1, int(0.99 * len(e2e)))]
        budget.add_row(
            service, model, str(len(reqs)), r.ms(statistics.median(e2e)), r.ms(p99),
            r.stacked_bar(totals, 30),
        )  # fmt: skip
    latest = Table(header_style="bold", box=None, pad_edge=False)
    # The whole request id: what `latscope explain` takes (trace id '-' span id).
    latest.add_column("request id (latscope explain ID)", no_wrap=True, min_width=49)
    for col in ("service", "model", "e2e", "ttft", "budget"):
        names = col in ("service", "model")
        latest.add_column(col, justify="right" if col in ("e2e", "ttft") else "left",
                          no_wrap=not names)  # fmt: skip
    # Newest first by when each request ended: a poll brings a batch in no time order.
    for req in sorted(recent, key=_ended_ns)[-LATEST:][::-1]:
        latest.add_row(
            req.get("request_id") or req["trace_id"], req["service"], req["model"],
            r.ms(req["e2e_ms"]), r.ms(req.get("ttft_ms")), r.stacked_bar(req["buckets_ms"], 24),
        )  # fmt: skip
    r.fit(budget, drop=("p50", "model"))
    r.fit(latest, drop=("budget", "model", "ttft"))
    parts: list[Any] = [head, budget, r.legend(), Text("latest", style="bold"), latest]
    if not seen:
        parts.append(Text("waiting for requests to be attributed…", style="italic"))
    return Group(*parts)


def main(args: argparse.Namespace) -> int:
    feed = open_feed(args)
    try:
        # Connect (or fail with a sentence) before anything is drawn.
        feed.connect()
        seen = 0
        if args.json:
            for req in feed:
                sys.stdout.write(json.dumps(req) + "\n")
                sys.stdout.flush()
                seen += 1
                if args.count and seen >= args.count:
                    break
            return 0
        recent: deque[dict[str, Any]] = deque(maxlen=RECENT)
        with Live(
            _screen(recent, seen, feed.description), refresh_per_second=4, transient=False
        ) as live:
            try:
                for req in feed:
                    recent.append(req)
                    seen += 1
                    live.update(_screen(recent, seen, feed.description, feed.note))
                    if args.count and seen >= args.count:
                        break
            except SourceError as exc:
                # Lost mid-run: say so after the last screen, on a line of its own.
                live.stop()
                print(f"\nlatscope: after {seen} requests: {exc}", file=sys.stderr)
                return exc.exit_code
        return 0
    except SourceError as exc:
        print(f"latscope: {exc}", file=sys.stderr)
        return exc.exit_code
    finally:
        feed.close()
