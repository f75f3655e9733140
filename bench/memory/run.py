"""Memory under load: ``latscope serve``'s peak RSS with large spans, many senders and a big spool.

    .venv/bin/python -m bench.memory.run [--seconds 40] [--senders 8] [--spool-max-bytes 8e9]

Starts ``latscope serve`` (a process of its own, defaults except the spool size and the ports)
on a fresh embedded store, then sends for ``--seconds`` from ``--senders`` threads in a separate
process: Exports of ``--spans`` spans (32-384, drawn per Export: 1-12 MB), each span carrying a
prompt and a completion of 16 kB (32 kB of attributes), retrying what the collector refuses
(RESOURCE_EXHAUSTED, after its RetryInfo). serve's RSS is sampled every 0.1 s; after the load,
the run waits until every acknowledged span is stored (queue and spool empty), stops serve and
counts the stored spans. The peak is the larger of the samples and the kernel's high-water mark.

Printed: serve's RSS idle (the baseline of the same run), peak RSS and its ratio to the bound
docs/deploy.md gives for these settings (``latscope.config.memory_bound_bytes``), the memory the
collector counted at its peak, spans acknowledged / refused / stored, MB/s acknowledged, and
what serve logged as warnings or errors (an insert the embedded ClickHouse refused at its memory
limit is one, and is retried). ``--memory-limit-bytes`` runs it with another limit (the bound
moves with it).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import httpx
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from latscope.config import Settings, memory_bound_bytes

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
T0 = 1_763_000_000_000_000_000
SERVICE = "bench-memory"


def _rss(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process, in bytes."""
    text = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+)", text).group(1)) * 1024  # type: ignore[union-attr]
    hwm = int(re.search(r"VmHWM:\s+(\d+)", text).group(1)) * 1024  # type: ignore[union-attr]
    return rss, hwm


def _metric(text: str, name: str, labels: str = "") -> float:
    match = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def _export(rng: random.Random, i: int, spans: int) -> bytes:
    """An Export of ``spans`` spans, each with a 16 kB prompt and a 16 kB completion."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.append(
        KeyValue(key="service.name", value=AnyValue(string_value=SERVICE))
    )
    ss = rs.scope_spans.add()
    for n in range(spans):
        span = ss.spans.add(
            trace_id=rng.randbytes(16), span_id=rng.randbytes(8), name="chat",
            kind=2, start_time_unix_nano=T0 + (i * 1000 + n) * 1_000_000,
            end_time_unix_nano=T0 + (i * 1000 + n) * 1_000_000 + 500_000_000,
        )  # fmt: skip
        for key in ("gen_ai.prompt", "gen_ai.completion"):
            text = rng.randbytes(8192).hex()  # 16 kB that compress like text, not like zeros
            span.attributes.append(KeyValue(key=key, value=AnyValue(string_value=text)))
    return req.SerializeToString()


def loadgen(addr: str, seconds: float, senders: int, spans: tuple[int, int]) -> None:
    """Child process: send for ``seconds`` from ``senders`` threads; print the counts."""
    rng = random.Random(1)
    # A pool of distinct Exports, sent round-robin with fresh span ids patched in is costly;
    # instead every Export is built once, and each is sent once (unique spans throughout).
    channel = grpc.insecure_channel(addr, options=[("grpc.max_send_message_length", 64 << 20)])
    call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
    counts = {"acked": 0, "refused": 0, "bytes": 0, "errors": 0}
    lock = threading.Lock()
    next_i = [0]
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.readline()
    deadline = time.monotonic() + seconds

    def sender() -> None:
        local = random.Random(rng.random())
        while time.monotonic() < deadline:
            with lock:
                i = next_i[0]
                next_i[0] += 1
            n = local.randint(*spans)
            payload = _export(local, i, n)
            while time.monotonic() < deadline + 30:
                try:
                    call(payload, timeout=60)
                    with lock:
                        counts["acked"] += n
                        counts["bytes"] += len(payload)
                    break
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                        with lock:
                            counts["errors"] += 1
                        break
                    with lock:
                        counts["refused"] += 1
                    time.sleep(_retry_delay(exc))

    threads = [threading.Thread(target=sender) for _ in range(senders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(counts), flush=True)


def _retry_delay(exc: grpc.RpcError) -> float:
    for key, value in exc.trailing_metadata() or ():  # type: ignore[attr-defined]
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                info = error_details_pb2.RetryInfo()
                if detail.Unpack(info):
                    return info.retry_delay.ToTimedelta().total_seconds()
    return 1.0


def bench(args: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="latscope-bench-memory-"))
    # Removed at exit, also when the run fails half-way (a serve that does not start, a store
    # that cannot be read back).
    atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    store_dir = workdir / "store"
    cmd = [
        sys.executable, "-m", "latscope.cli", "serve", "--store", f"chdb://{store_dir}",
        "--otlp-grpc", "127.0.0.1:0", "--http", "127.0.0.1:0",
        "--max-span-age-s", "0", "--max-span-future-s", "0",  # the spans are at fixed times
        "--spool-max-bytes", str(int(args.spool_max_bytes)),
    ]  # fmt: skip
    if args.memory_limit_bytes:
        cmd += ["--memory-limit-bytes", str(int(args.memory_limit_bytes))]
    cmd += args.serve_arg
    limit = int(args.memory_limit_bytes or Settings().memory_limit_bytes)
    serve = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert serve.stdout is not None
    grpc_addr = http_addr = ""
    output: list[str] = []
    try:
        while not (grpc_addr and http_addr):
            line = serve.stdout.readline()
            if not line:
                raise RuntimeError("serve did not start:\n" + "".join(output))
            output.append(line)
            if "OTLP/gRPC" in line:
                grpc_addr = line.split()[-1]
            if "HTTP" in line and "://" in line:
                http_addr = line.split()[-1]
        threading.Thread(target=lambda: output.extend(serve.stdout), daemon=True).start()
        time.sleep(2)
        idle, _ = _rss(serve.pid)
        load = subprocess.Popen(
            [sys.executable, "-m", "bench.memory.run", "--loadgen", grpc_addr,
             "--seconds", str(args.seconds), "--senders", str(args.senders),
             "--spans", f"{args.spans[0]}-{args.spans[1]}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert load.stdin and load.stdout
        json.loads(load.stdout.readline())
        peak = held_peak = 0
        samples = []
        started = time.monotonic()
        load.stdin.write("go\n")
        load.stdin.flush()
        result: dict[str, int] = {}
        reader = threading.Thread(
            target=lambda: result.update(json.loads(load.stdout.readline())), daemon=True
        )
        reader.start()
        last_metrics = 0.0
        while reader.is_alive():
            rss, _ = _rss(serve.pid)
            peak = max(peak, rss)
            samples.append(rss)
            if time.monotonic() - last_metrics > 1:
                last_metrics = time.monotonic()
                text = httpx.get(f"{http_addr}/metrics", timeout=10).text
                held_peak = max(held_peak, int(_metric(text, "latscope_collector_memory_bytes")))
            time.sleep(0.1)
        sent_s = time.monotonic() - started
        load.wait()
        # Every acknowledged span stored: the queue and the spool empty.
        drain_started = time.monotonic()
        while time.monotonic() - drain_started < 600:
            text = httpx.get(f"{http_addr}/metrics", timeout=10).text
            rss, _ = _rss(serve.pid)
            peak = max(peak, rss)
            depth = _metric(text, "latscope_collector_queue_depth", '{signal="traces"}')
            spool = _metric(text, "latscope_collector_spool_bytes", '{signal="traces"}')
            if depth == 0 and spool == 0:
                break
            time.sleep(0.2)
        drained_s = time.monotonic() - drain_started
        _, hwm = _rss(serve.pid)
        peak = max(peak, hwm)
        serve.send_signal(signal.SIGTERM)
        serve.wait(120)
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
    from latscope.storage import Store

    store = Store.open(f"chdb://{store_dir}")
    stored, distinct = store.query_rows(
        "SELECT count(), uniqExact(SpanId) FROM otel_traces WHERE ServiceName = {s:String}",
        {"s": SERVICE},
    )[0]
    store.close()
    shutil.rmtree(workdir, ignore_errors=True)
    bound = memory_bound_bytes(limit)
    mib = 1024**2
    lo, hi = args.spans
    print(f"{args.senders} senders x {args.seconds:.0f} s, Exports of {lo}-{hi} spans x 32 kB "
          f"attributes; spool limit {args.spool_max_bytes / 1e9:.1f} GB, memory limit "
          f"{limit / mib:.0f} MiB; load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"serve RSS idle (baseline)   : {idle / mib:8.0f} MiB")
    print(f"serve RSS peak              : {peak / mib:8.0f} MiB   "
          f"({peak / idle:.2f} x idle)")  # fmt: skip
    print(f"documented bound            : {bound / mib:8.0f} MiB   "
          f"(peak / bound {peak / bound:.2f}: {'under' if peak <= bound else 'OVER'})")  # fmt: skip
    print(f"memory counted, peak        : {held_peak / mib:8.0f} MiB of {limit / mib:.0f}")
    acked = result.get("acked", 0)
    print(f"spans acknowledged          : {acked:8d}   "
          f"({result.get('bytes', 0) / sent_s / 1e6:.1f} MB/s of Exports)")  # fmt: skip
    print(f"Exports refused (retried)   : {result.get('refused', 0):8d}   "
          f"other errors {result.get('errors', 0)}")  # fmt: skip
    print(f"spans stored                : {stored:8d}   distinct {distinct}; "
          f"drained {drained_s:.0f} s after the load")  # fmt: skip
    lost = acked - distinct
    print(f"acknowledged and not stored : {max(0, lost):8d}")
    logged = [line for line in output if re.search(r"\b(WARNING|ERROR)\b", line)]
    print(f"serve's warnings and errors : {len(logged):8d}")
    for line in logged[:5]:
        print("    " + line.rstrip()[:300])


def _span_range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("-")
    return int(lo), int(hi or lo)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--senders", type=int, default=8)
    parser.add_argument(
        "--spans", type=_span_range, default=(32, 384),
        help="spans per Export, LO-HI (each Export draws its count; 32 kB a span)",
    )  # fmt: skip
    parser.add_argument("--spool-max-bytes", type=float, default=8e9)
    parser.add_argument("--memory-limit-bytes", type=float, default=0)
    parser.add_argument(
        "--serve-arg", action="append", default=[], help="one more argument for latscope serve"
    )
    parser.add_argument("--loadgen", metavar="ADDR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.loadgen:
        loadgen(args.loadgen, args.seconds, args.senders, args.spans)
    else:
        bench(args)


if __name__ == "__main__":
    main()
