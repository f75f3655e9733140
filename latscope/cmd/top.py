"""``latscope top``: attributed requests live, as they complete, with a rolling budget per
service and model. Streams from the gRPC ``Watch`` of a running server (``--grpc``) or reads
the store directly (``--store``)."""

from __future__ import annotations

import argparse
import itertools
import json
import os
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
from latscope.cmd._source import SourceError, _token, open_store
from latscope.semconv import BUCKETS

HELP = "live: requests as they complete, with a rolling latency budget per service/model"

#: How many recent requests the screen keeps (the rolling figures use the same ones).
RECENT = 500
#: How long to wait for the server's gRPC port before saying it is not there.
CONNECT_TIMEOUT_S = 5.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--grpc",
        metavar="HOST:PORT",
        help="a running latscope's gRPC port [env LATSCOPE_OTLP_GRPC, default 127.0.0.1:4317]",
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


def _grpc_stream(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    from latscope.api.grpc_service import attribution_dict
    from latscope.v1 import query_pb2, query_pb2_grpc

    target = args.grpc or os.environ.get("LATSCOPE_OTLP_GRPC", "127.0.0.1:4317")
    token = _token(args)
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    channel = grpc.insecure_channel(target)
    try:  # fail before the screen is drawn, not with the error glued under an empty table
        grpc.channel_ready_future(channel).result(timeout=CONNECT_TIMEOUT_S)
    except grpc.FutureTimeoutError:
        channel.close()
        raise SourceError(
            f"no latscope gRPC at {target} — start it with `latscope serve`, "
            "or pass --grpc HOST:PORT (the OTLP/gRPC port, not the HTTP --url)"
        ) from None
    stub = query_pb2_grpc.QueryServiceStub(channel)
    request = query_pb2.WatchRequest(
        service=args.service, model=args.model, min_e2e_ms=args.min_e2e_ms
    )
    timeout = args.duration or None
    stream = stub.Watch(request, metadata=metadata, timeout=timeout)
    try:
        for message in stream:
            yield attribution_dict(message)
    except grpc.RpcError as exc:
        code = exc.code()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return
        if code == grpc.StatusCode.UNAVAILABLE:
            raise SourceError(
                f"no latscope gRPC at {target} — start it with `latscope serve`, "
                "or pass --grpc HOST:PORT"
            ) from None
        if code == grpc.StatusCode.UNAUTHENTICATED:
            raise SourceError(
                f"{target} needs a token: pass --token-file PATH or set LATSCOPE_TOKEN"
            ) from None
        raise SourceError(f"Watch failed: {code.name}: {exc.details()}") from None
    finally:
        stream.cancel()
        channel.close()


def _store_stream(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    from latscope.api.live import LiveHub, TablePoller, WatchFilter, iter_subscription

    store = open_store(args.store)
    hub = LiveHub()
    sub = hub.subscribe(WatchFilter(args.service, args.model, args.min_e2e_ms))
    assert sub is not None  # a private hub has room
    poller = TablePoller(store, interval_s=0.5, hub=hub)
    poller.start()
    deadline = time.monotonic() + args.duration if args.duration else None
    try:
        yield from iter_subscription(
            sub, alive=lambda: deadline is None or time.monotonic() < deadline
        )
    finally:
        poller.stop(time.monotonic() + 5)
        store.close()


def _screen(recent: deque[dict[str, Any]], seen: int, source: str) -> Group:
    head = Text("latscope top", style="bold").append(f"  {source}  {seen} requests seen", style="")
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for req in recent:
        groups.setdefault((req["service"], req["model"]), []).append(req)
    budget = Table(header_style="bold", box=None, pad_edge=False, title_justify="left")
    for col in ("service", "model", "n", "p50", "p99", "budget"):
        budget.add_column(col, justify="right" if col in ("n", "p50", "p99") else "left")
    for (service, model), reqs in sorted(groups.items()):
        e2e = sorted(q["e2e_ms"] for q in reqs)
        totals = {b: sum(q["buckets_ms"].get(b) or 0.0 for q in reqs) for b in BUCKETS}
        p99 = e2e[min(len(e2e) - 1, int(0.99 * len(e2e)))]
        budget.add_row(
            service, model, str(len(reqs)), r.ms(statistics.median(e2e)), r.ms(p99),
            r.stacked_bar(totals, 30),
        )  # fmt: skip
    latest = Table(header_style="bold", box=None, pad_edge=False)
    for col in ("trace", "service", "model", "e2e", "ttft", "budget"):
        latest.add_column(col, justify="right" if col in ("e2e", "ttft") else "left")
    for req in list(recent)[-15:][::-1]:
        latest.add_row(
            req["trace_id"], req["service"], req["model"], r.ms(req["e2e_ms"]),
            r.ms(req.get("ttft_ms")), r.stacked_bar(req["buckets_ms"], 30),
        )  # fmt: skip
    return Group(head, budget, r.legend(), Text("latest", style="bold"), latest)


def main(args: argparse.Namespace) -> int:
    try:
        stream = _store_stream(args) if args.store else _grpc_stream(args)
        # Generators run nothing until the first next(): connect (or fail) before drawing.
        first = next(stream, None)
        if first is not None:
            stream = itertools.chain([first], stream)
        recent: deque[dict[str, Any]] = deque(maxlen=RECENT)
        seen = 0
        source = args.store or args.grpc or os.environ.get("LATSCOPE_OTLP_GRPC", "127.0.0.1:4317")
        if args.json:
            for req in stream:
                sys.stdout.write(json.dumps(req) + "\n")
                sys.stdout.flush()
                seen += 1
                if args.count and seen >= args.count:
                    break
            return 0
        with Live(_screen(recent, seen, source), refresh_per_second=4, transient=False) as live:
            for req in stream:
                recent.append(req)
                seen += 1
                live.update(_screen(recent, seen, source))
                if args.count and seen >= args.count:
                    break
        return 0
    except SourceError as exc:
        print(f"latscope: {exc}", file=sys.stderr)
        return exc.exit_code
