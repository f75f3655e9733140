"""Ingest benchmark: OTLP/gRPC load on loopback into the collector and the embedded ClickHouse.

    .venv/bin/python -m bench.ingest.run [--exports 400] [--streams 8] [--requests 64]

A load generator (a separate process, so its CPU is not the collector's) sends pre-built
Exports of realistic LLM request traces (7 spans per request, ~15 attributes each) over N
concurrent gRPC streams. The same run first measures a parse-only receiver (it decodes the
protobuf and answers) as the baseline, then the real collector end to end: every span
acknowledged and queryable in ClickHouse. Printed: spans/s, collector CPU seconds per 100k
spans, spans per collector CPU-second, p99 Export latency, the ratio to the baseline and bytes
per span on disk after OPTIMIZE FINAL.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from bench.ingest.traces import make_batch

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
T0 = 1_763_000_000_000_000_000


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _timed_cpu(fn: object) -> float:
    cpu0 = _cpu()
    fn()  # type: ignore[operator]
    return _cpu() - cpu0


def loadgen(addr: str, exports: int, streams: int, requests: int, seed: int) -> None:
    """Child process: build unique Exports, then send each once over ``streams`` threads."""
    rng = random.Random(seed)
    payloads = [
        make_batch(rng, T0 + i * 10**9, requests).SerializeToString() for i in range(exports)
    ]
    spans = exports * requests * 7
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.readline()  # go
    channel = grpc.insecure_channel(addr, options=[("grpc.max_send_message_length", 64 << 20)])
    call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
    latencies: list[float] = []
    lock = threading.Lock()
    it = iter(payloads)

    def worker() -> None:
        while True:
            with lock:
                payload = next(it, None)
            if payload is None:
                return
            while True:
                t = time.perf_counter()
                try:
                    call(payload, timeout=60)
                    break
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                        raise
                    time.sleep(0.05)
            with lock:
                latencies.append(time.perf_counter() - t)

    started = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(streams)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - started
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99) - 1]
    print(json.dumps({"spans": spans, "seconds": elapsed, "p99_ms": p99 * 1000}), flush=True)


class ParseOnly(trace_service_pb2_grpc.TraceServiceServicer):
    """The baseline: gRPC decodes the request into protobuf objects; nothing else happens."""

    def Export(self, request, context):  # type: ignore[no-untyped-def]
        return trace_service_pb2.ExportTraceServiceResponse()


def _drive(addr: str, args: argparse.Namespace) -> tuple[dict, float]:
    """Run the load generator against ``addr``; returns its figures and this process's CPU s."""
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.ingest.run", "--loadgen", addr,
         "--exports", str(args.exports), "--streams", str(args.streams),
         "--requests", str(args.requests)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdin and child.stdout
    json.loads(child.stdout.readline())  # ready: payloads are built
    cpu0 = _cpu()
    result_go = time.perf_counter()
    child.stdin.write("go\n")
    child.stdin.flush()
    result = json.loads(child.stdout.readline())
    child.wait()
    result["go"] = result_go
    return result, cpu0


def bench(args: argparse.Namespace) -> None:
    from latscope.collector.mapping import SpanColumns
    from latscope.collector.service import collector_parts
    from latscope.config import Settings
    from latscope.serve import start_grpc, stop_components
    from latscope.storage import SPANS_TABLE, Store

    # The hot path alone, in this process on one thread: decode vs decode + map to Arrow.
    rng = random.Random(args.seed + 1)
    sample = [make_batch(rng, T0 + i * 10**9, args.requests).SerializeToString() for i in range(20)]
    request_type = trace_service_pb2.ExportTraceServiceRequest
    sample_spans = len(sample) * args.requests * 7

    def decode() -> None:
        for payload in sample:
            request_type.FromString(payload)

    def decode_map() -> None:
        for payload in sample:
            cols = SpanColumns()
            cols.add(request_type.FromString(payload).resource_spans)
            cols.table()

    decode_map()  # warm-up: first use of Arrow and protobuf paths
    decode_cpu = min(_timed_cpu(decode) for _ in range(3))
    map_cpu = min(_timed_cpu(decode_map) for _ in range(3))

    # Baseline: the parse-only receiver.
    settings = Settings(otlp_grpc="127.0.0.1:0", grpc_max_message_bytes=64 << 20,
                        grpc_workers=args.streams * 2)  # fmt: skip
    server = grpc.server(futures.ThreadPoolExecutor(args.streams * 2), options=[
        ("grpc.max_receive_message_length", 64 << 20)])  # fmt: skip
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(ParseOnly(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    base, cpu0 = _drive(f"127.0.0.1:{port}", args)
    base_cpu = _cpu() - cpu0
    server.stop(0)

    # The collector, end to end into the embedded ClickHouse.
    workdir = Path(tempfile.mkdtemp(prefix="latscope-bench-"))
    store = Store.open(f"chdb://{workdir / 'store'}")
    store.apply_schema()
    settings = Settings(
        otlp_grpc="127.0.0.1:0", store=store.dsn, spool_dir=str(workdir / "spool"),
        grpc_max_message_bytes=64 << 20, grpc_workers=args.streams * 2,
    )  # fmt: skip
    parts = collector_parts(settings, store)
    for component in parts.components:
        component.start()
    grpc_server, addr = start_grpc(settings, parts)
    run, cpu0 = _drive(addr, args)
    started = run["go"]
    # Acknowledged means durable (journaled); the inserts follow within the batch timeout.
    while not parts.components[0].spans.drained():
        time.sleep(0.005)
    stored = store.query_rows(f"SELECT count() FROM {SPANS_TABLE}")[0][0]
    elapsed = time.perf_counter() - started
    cpu = _cpu() - cpu0
    grpc_server.stop(5).wait()
    stop_components(parts, time.monotonic() + 30)
    assert stored == run["spans"], (stored, run["spans"])
    store.command(f"OPTIMIZE TABLE {SPANS_TABLE} FINAL")
    on_disk = store.query_rows(
        "SELECT sum(bytes_on_disk), sum(rows) FROM system.parts "
        "WHERE active AND database = currentDatabase() AND table = {t:String}",
        {"t": SPANS_TABLE},
    )[0]
    store.close()

    spans = run["spans"]
    rate = spans / elapsed
    base_rate = base["spans"] / base["seconds"]
    print(f"exports {args.exports} x {args.requests * 7} spans, {args.streams} streams")
    print(f"hot path, one thread, best of 3: decode {sample_spans / decode_cpu:,.0f} spans/CPU-s  "
          f"decode+map+Arrow {sample_spans / map_cpu:>8,.0f} spans/CPU-s")  # fmt: skip
    print(
        f"parse-only baseline : {base_rate:>10,.0f} spans/s   "
        f"{base_cpu / base['spans'] * 1e5:.3f} CPU s/100k spans   p99 {base['p99_ms']:.1f} ms"
    )
    print(
        f"collector -> chDB   : {rate:>10,.0f} spans/s   "
        f"{cpu / spans * 1e5:.3f} CPU s/100k spans   p99 {run['p99_ms']:.1f} ms"
    )
    print(f"collector spans per CPU-second (per core): {spans / cpu:,.0f}")
    print(f"ratio to parse-only (spans/s): {rate / base_rate:.2f}")
    print(f"bytes per span on disk: {on_disk[0] / on_disk[1]:.1f}  ({on_disk[1]} rows)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--exports", type=int, default=400)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--requests", type=int, default=64, help="requests (x7 spans) per Export")
    parser.add_argument("--loadgen", metavar="ADDR", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.loadgen:
        loadgen(args.loadgen, args.exports, args.streams, args.requests, args.seed)
    else:
        bench(args)


if __name__ == "__main__":
    main()
