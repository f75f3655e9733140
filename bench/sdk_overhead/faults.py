"""The app's cost per request while the collector is healthy, down, hanging, slow or refusing,
and while NVML raises: the SDK must leave the app's time and memory where they were.

    .venv/bin/python -m bench.sdk_overhead.faults [--requests 200] [--rounds 8]

Each request is the SDK overhead benchmark's: a client span, a server span, five phases and 256
recorded tokens, exported for real over OTLP/gRPC to a collector on loopback (the SDK's own
bounded batch processor, a short schedule so exports run during the measurement). The
collector is a gRPC TraceService that accepts every Export (the baseline), or refuses with
RESOURCE_EXHAUSTED, or answers after 200 ms, or holds every Export until the end; "down" is a
closed port. With a healthy collector, the GPU is also switched on over a fake NVML whose GPU
answers ("nvml healthy") or whose every call raises ("nvml raising"). The conditions take turns
within every round. Printed per condition: the app thread's wall-clock µs per request (median
and worst round, and the slowest single request: waiting shows here) and its CPU µs per request
(the work the SDK does on the app's thread), each against the healthy collector; what the SDK
exported and dropped; and the resident memory once the condition ran.
"""

from __future__ import annotations

import argparse
import resource
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from bench.sdk_overhead.run import latscope_request
from latscope import sdk
from latscope.sdk import ExportOptions, GpuOptions
from latscope.sdk.testing import FakeGpu, FakeNvml, NVMLError

QUEUE = 2048


class _Service(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.release = threading.Event()

    def Export(self, request, context):
        if self.mode == "refusing":
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "collector queue full")
        elif self.mode == "slow":
            time.sleep(0.2)
        elif self.mode == "hanging":
            self.release.wait(600)
        return trace_service_pb2.ExportTraceServiceResponse()


@contextmanager
def _collector(mode: str) -> Iterator[str]:
    if mode == "down":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]  # nothing listens once the socket is closed
        yield f"127.0.0.1:{port}"
        return
    service = _Service("healthy" if mode.startswith("nvml") else mode)
    server = grpc.server(futures.ThreadPoolExecutor(8))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        service.release.set()
        server.stop(0).wait()


@dataclass
class Figures:
    round_us: list[float] = field(default_factory=list)
    round_cpu_us: list[float] = field(default_factory=list)
    slowest_ms: float = 0.0
    exported: int = 0
    dropped: int = 0
    failed: int = 0
    max_queued: int = 0
    rss_mib: float = 0.0


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _run(mode: str, requests: int, figures: Figures, request: Callable[[], int]) -> None:
    gpu = GpuOptions(enabled=False)
    if mode == "nvml healthy":
        gpu = GpuOptions(enabled=True, nvml=FakeNvml([FakeGpu(utilization=50, power_mw=100_000)]))
    if mode == "nvml raising":
        broken = FakeGpu(utilization=50, power_mw=100_000)
        broken.fail = NVMLError("driver fault")
        gpu = GpuOptions(enabled=True, nvml=FakeNvml([broken]))
    with _collector(mode) as endpoint:
        sdk.configure(
            service_name="bench-faults",
            gpu=gpu,
            export=ExportOptions(
                endpoint=endpoint,
                timeout_s=2.0,
                max_queue_size=QUEUE,
                max_batch_size=256,
                schedule_delay_s=0.02,
            ),
        )
        try:
            request()  # the first request after configure pays for lazy setup
            t_round, cpu_round = time.perf_counter_ns(), time.thread_time_ns()
            for _ in range(requests):
                t0 = time.perf_counter_ns()
                request()
                figures.slowest_ms = max(figures.slowest_ms, (time.perf_counter_ns() - t0) / 1e6)
                figures.max_queued = max(figures.max_queued, sdk.stats()["spans_queued"])
            figures.round_us.append((time.perf_counter_ns() - t_round) / requests / 1000)
            figures.round_cpu_us.append((time.thread_time_ns() - cpu_round) / requests / 1000)
            sdk.force_flush(timeout_s=0.5)
            stats = sdk.stats()
            figures.exported += stats["spans_exported"]
            figures.dropped += stats["spans_dropped"]
            figures.failed += stats["spans_failed"]
        finally:
            sdk.shutdown(timeout_s=0.5)
    figures.rss_mib = max(figures.rss_mib, _rss_mib())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="requests per condition, round")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    modes = ["healthy", "down", "refusing", "slow", "hanging", "nvml healthy", "nvml raising"]
    figures = {mode: Figures() for mode in modes}
    rss0 = _rss_mib()
    for _ in range(args.rounds):
        for mode in modes:
            _run(mode, args.requests, figures[mode], latscope_request)
    base = statistics.median(figures["healthy"].round_us)
    base_cpu = statistics.median(figures["healthy"].round_cpu_us)
    print(
        f"{args.requests} requests x {args.rounds} rounds per condition; queue bound {QUEUE} "
        f"spans; resident memory at start {rss0:.0f} MiB"
    )
    head = (
        f"{'collector':<14}{'µs/request':>11}{'worst round':>12}{'× healthy':>10}"
        f"{'CPU µs':>8}{'× healthy':>10}"
        f"{'slowest ms':>11}{'exported':>10}{'dropped':>9}{'failed':>8}{'max queued':>11}"
        f"{'RSS MiB':>9}"
    )
    print(head)
    for mode in modes:
        f = figures[mode]
        median = statistics.median(f.round_us)
        cpu = statistics.median(f.round_cpu_us)
        print(
            f"{mode:<14}{median:>11.0f}{max(f.round_us):>12.0f}{median / base:>10.2f}"
            f"{cpu:>8.0f}{cpu / base_cpu:>10.2f}"
            f"{f.slowest_ms:>11.1f}{f.exported:>10}{f.dropped:>9}{f.failed:>8}"
            f"{f.max_queued:>11}{f.rss_mib:>9.0f}"
        )


if __name__ == "__main__":
    main()
