"""Wide traces: every trace route of a running ``latscope serve`` on long agent runs, and what
16 such requests at once do to ingest.

    .venv/bin/python -m bench.api.traces [--calls 1100 3300 6600] [--repeat 3] [--concurrent 16]
        [--prompt-kb N]

Starts ``latscope serve`` on a fresh embedded store, sends one agent run per ``--calls`` (6
spans a call: 6,601 / 19,801 / 39,601 spans; ``bench/api/wide.py``) and a run of one call (the
floor: what any trace costs), then times, best of ``--repeat``, each trace route over HTTP
(keep-alive): ``/v1/traces/{id}``, ``/run``, ``/requests``, ``/spans``, a call's page
``/v1/requests/{id}`` and ``/attribution``, and ``latscope explain TRACE_ID`` as a command (a
process of its own, its start included). Served, a trace's state is worked out once and shared by
every answer about it (``latscope.api.trace``), so these are the answers after the first. Printed
per route: ms for each trace and ms per 1,000 spans (flat when the route is linear).

Then, once serve has stopped, each route's first answer as a client gets it: for each route a
serve started afresh on the same store, asked that route of each trace in turn (wall ms over
HTTP, the answer read whole; best of ``--repeat`` serves). And each route cold: in a process of
its own on the same store, each answer worked out from the stored spans with nothing kept from
the one before (CPU ms, best of ``--repeat``): what the first answer about a trace, or about a
trace that changed, costs.

``--prompt-kb N``: every span of the runs carries a prompt and a completion of N kB each (random
text, as ``bench.attribution.wide --prompt-kb``); first, before any other answer, each route is
asked once about the widest run while serve's RSS is sampled every 0.1 s: printed per route, the
answer's time and size (as sent, gzip; and inflated) and serve's peak RSS, against its memory
bound (``latscope.config.memory_bound_bytes``).

Then ingest beside them: a sender acknowledges Exports of 64 small spans one after the other for
``--ingest-s`` seconds alone (the baseline), then as long again while ``--concurrent`` clients
each ask ``/v1/traces/{id}`` of the widest run over and over, taking gzip (as httpx and browsers
do: the answer comes compressed), then again with clients that take no compression; each
client reads the answer as sent, without inflating it. Printed: the acknowledgement latencies
(p50, p99, max), and the trace answers' statuses (200; 503 ``busy`` when more than the API
queues) and latencies. Last, a trace past
``--max-trace-spans`` (a serve started with a cap under the widest run): the 422
``trace_too_large`` answer's time.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import httpx

from bench.api.wide import prompt_exports, span_count, wide_run, with_prompts
from bench.ingest.traces import make_batch
from bench.memory.run import _metric, _rss
from latscope.config import Settings, memory_bound_bytes

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
T0 = 1_763_000_000_000_000_000
ROUTES = (
    ("/v1/traces/{t}", "trace"),
    ("/v1/traces/{t}/run", "run"),
    ("/v1/traces/{t}/requests", "requests"),
    ("/v1/traces/{t}/spans", "spans"),
    ("/v1/requests/{r}", "a call's page"),
    ("/v1/requests/{r}/attribution", "a call's attribution"),
)


class Serve:
    """``latscope serve`` on free ports over ``store``; ``args`` are more flags."""

    def __init__(self, store: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "latscope.cli", "serve", "--store", f"chdb://{store}",
             "--otlp-grpc", "127.0.0.1:0", "--http", "127.0.0.1:0",
             "--max-span-age-s", "0", "--max-span-future-s", "0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        self.grpc = self.http = ""
        #: What serve has printed (its log), read as it comes.
        self.lines: list[str] = []
        while not (self.grpc and self.http):
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("serve did not start:\n" + "".join(self.lines))
            self.lines.append(line)
            if m := re.search(r"OTLP/gRPC\s+(\S+)", line):
                self.grpc = m.group(1)
            if m := re.search(r"HTTP\s+(http://\S+)", line):
                self.http = m.group(1)
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()  # type: ignore[arg-type]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _send(addr: str, payloads: list[bytes]) -> None:
    with grpc.insecure_channel(addr, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        call = ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        for payload in payloads:
            call(payload, timeout=120)


def _stored(http: str, trace_ids: list[str], spans: dict[str, int]) -> None:
    """Wait until each trace's spans are all queryable (the collector has inserted them)."""
    deadline = time.monotonic() + 600
    with httpx.Client(base_url=http, timeout=600) as client:
        for trace_id in trace_ids:
            while True:
                r = client.get(f"/v1/traces/{trace_id}/spans")
                if r.status_code == 200 and len(r.json()["spans"]) == spans[trace_id]:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"trace {trace_id} was not stored: {r.status_code}")
                time.sleep(0.5)


def _cpu_s(pid: int) -> float:
    """CPU seconds the process has used (user and system, all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _best(client: httpx.Client, path: str, repeat: int, pid: int = 0) -> tuple[float, float, int]:
    """Best of ``repeat``: the answer's wall time, the serve process's CPU seconds over it (on a
    shared machine the steadier figure), and its status."""
    best, cpu, status = float("inf"), float("inf"), 0
    for _ in range(repeat):
        cpu_before = _cpu_s(pid) if pid else 0.0
        started = time.perf_counter()
        r = client.get(path)
        best = min(best, time.perf_counter() - started)
        cpu = min(cpu, _cpu_s(pid) - cpu_before if pid else 0.0)
        status = r.status_code
    return best, cpu, status


def _cli_explain(http: str, trace_id: str, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "latscope.cli", "explain", trace_id, "--url", http],
            check=True, capture_output=True, env={**os.environ, "COLUMNS": "160"},
        )  # fmt: skip
        best = min(best, time.perf_counter() - started)
    return best


COLD = """
import json, sys, time
from latscope.api import trace, trace_state
from latscope.storage import Store
store = Store.open(sys.argv[1])
repeat, asks = int(sys.argv[2]), json.loads(sys.argv[3])
answers = {"trace": trace.trace_explain, "run": trace.trace_run,
           "requests": trace.trace_requests, "spans": trace.trace_spans,
           "a call's page": trace.explain, "a call's attribution": trace.request_attribution}
out = {}
for name, ids in asks.items():
    out[name] = []
    for i in ids:
        best = float("inf")
        for _ in range(repeat):
            trace_state._KEPT.clear()
            started = time.process_time()
            answers[name](store, i).model_dump_json()
            best = min(best, time.process_time() - started)
        out[name].append(best)
print(json.dumps(out))
"""


def _cold(store: Path, ids: list[str], first: dict[str, str], repeat: int) -> dict[str, list]:
    """CPU seconds of each route's answer worked out from nothing, in a process of its own."""
    asks = {name: [first[t] if "call" in name else t for t in ids] for _, name in ROUTES}
    done = subprocess.run(
        [sys.executable, "-c", COLD, f"chdb://{store}", str(repeat), json.dumps(asks)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _first_answers(
    store: Path, ids: list[str], first: dict[str, str], repeat: int
) -> dict[str, list[float]]:
    """Wall seconds of each route's first answer about each trace over HTTP: per route, a serve
    started afresh on ``store`` (best of ``repeat`` serves)."""
    out: dict[str, list[float]] = {}
    for path, name in ROUTES:
        best = [float("inf")] * len(ids)
        for _ in range(repeat):
            serve = Serve(store)
            try:
                with httpx.Client(base_url=serve.http, timeout=600) as client:
                    for i, t in enumerate(ids):
                        started = time.perf_counter()
                        r = client.get(path.format(t=t, r=first[t]))
                        best[i] = min(best[i], time.perf_counter() - started)
                        assert r.status_code == 200, (path, t, r.status_code)
            finally:
                serve.stop()
        out[name] = best
    return out


def _table(
    title: str, unit: str, seconds: dict[str, list[float]], ids: list[str],
    spans: dict[str, int], repeat: int,
) -> None:  # fmt: skip
    """Each route's figures (s) for each trace, and per 1,000 spans for the wide ones."""
    print(f"\n{title:<34}" + "".join(f"{spans[t]:>10,} sp" for t in ids) + "   ms per 1,000 spans")
    print(f"{'  (' + unit + ', best of ' + str(repeat) + ')':<34}")
    for _, name in ROUTES:
        cells = "".join(f"{x * 1e3:>13.0f}" for x in seconds[name])
        per = "  ".join(
            f"{x * 1e6 / spans[t]:5.1f}" for x, t in zip(seconds[name], ids, strict=True)
            if spans[t] > 1000
        )  # fmt: skip
        print(f"{name:<34}{cells}   {per}")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _acks(addr: str, seconds: float, seed: int) -> list[float]:
    """Latencies of Exports of 64 small spans (9 requests x 7), sent one after the other."""
    rng = random.Random(seed)
    payloads = [make_batch(rng, T0 + 10**12 + i * 10**9, 9).SerializeToString() for i in range(64)]
    out = []
    with grpc.insecure_channel(addr) as channel:
        call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        deadline = time.monotonic() + seconds
        i = 0
        while time.monotonic() < deadline:
            started = time.perf_counter()
            call(payloads[i % len(payloads)], timeout=60)
            out.append(time.perf_counter() - started)
            i += 1
            time.sleep(0.02)
    return out


def _line(name: str, xs: list[float]) -> str:
    return (f"{name:<48} p50 {_pct(xs, 0.5) * 1e3:7.1f}  p99 {_pct(xs, 0.99) * 1e3:7.1f}  "
            f"max {max(xs) * 1e3:7.1f} ms  ({len(xs)})")  # fmt: skip


def _beside_askers(
    serve: Serve, trace_id: str, args: argparse.Namespace, encoding: str, alone: list[float]
) -> None:
    """Acknowledgements while ``--concurrent`` clients taking ``encoding`` ask for the trace."""
    statuses: Counter[int] = Counter()
    answers: list[float] = []
    stop = threading.Event()
    lock = threading.Lock()

    def asker() -> None:
        headers = {"Accept-Encoding": encoding}
        with httpx.Client(base_url=serve.http, timeout=300, headers=headers) as client:
            while not stop.is_set():
                started = time.perf_counter()
                # Read as sent, not decoded: the askers' own CPU (a gzip answer's inflating)
                # would be this machine's, which serve shares, not the server's.
                with client.stream("GET", f"/v1/traces/{trace_id}") as r:
                    for _ in r.iter_raw():
                        pass
                with lock:
                    statuses[r.status_code] += 1
                    if r.status_code == 200:
                        answers.append(time.perf_counter() - started)
                if r.status_code != 200:
                    time.sleep(0.5)

    askers = [threading.Thread(target=asker) for _ in range(args.concurrent)]
    for thread in askers:
        thread.start()
    time.sleep(1.0)  # every asker has a request in
    beside = _acks(serve.grpc, args.ingest_s, 2)
    stop.set()
    for thread in askers:
        thread.join(600)
    print(_line(f"Export acknowledged, beside {args.concurrent} clients, {encoding}", beside))
    p50 = statistics.median(beside) / statistics.median(alone)
    p99 = _pct(beside, 0.99) / _pct(alone, 0.99)
    print(f"{'  ratio of the p50s, of the p99s':<48} {p50:.2f}, {p99:.2f}")
    if answers:
        print(_line(f"trace answered (200), {encoding}", answers))
    print(f"trace answers by status, {encoding}: {dict(sorted(statuses.items()))}")


def _ingest_beside(serve: Serve, trace_id: str, args: argparse.Namespace) -> None:
    # The answer worked out and compressed first, so that both variants find it kept (what its
    # first working-out costs is the first-answer table's).
    for encoding in ("gzip", "identity"):
        r = httpx.get(f"{serve.http}/v1/traces/{trace_id}", headers={"Accept-Encoding": encoding},
                      timeout=300)  # fmt: skip
        assert r.status_code == 200, r.text[:300]
    alone = _acks(serve.grpc, args.ingest_s, 1)
    print(f"\ningest beside {args.concurrent} clients asking /v1/traces/{{id}} of the widest run:")
    print(_line("Export acknowledged, ingest alone (baseline)", alone))
    for encoding in ("gzip", "identity"):
        _beside_askers(serve, trace_id, args, encoding, alone)


def _attributed(http: str, calls: int) -> None:
    """Wait until serve has attributed ``calls`` calls."""
    deadline = time.monotonic() + 600
    while _metric(httpx.get(f"{http}/metrics").text, "latscope_attributed_requests_total") < calls:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{calls} calls not attributed in 600 s")
        time.sleep(0.5)


def _memory(serve: Serve, trace_id: str, spans: int) -> None:
    """Each route asked once about ``trace_id`` (``/requests`` first: the rest need a call's
    id), serve's RSS sampled meanwhile."""
    bound = memory_bound_bytes(Settings().memory_limit_bytes) / 2**20
    before = _rss(serve.proc.pid)[0] / 2**20
    print(f"\nfirst answers about the {spans:,}-span run carrying prompts; serve's RSS "
          f"{before:,.0f} MiB before, its bound {bound:,.0f} MiB")  # fmt: skip
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _rss(serve.proc.pid)[0])
            time.sleep(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        first = ""
        with httpx.Client(base_url=serve.http, timeout=600) as client:
            for path, name in sorted(ROUTES, key=lambda route: route[1] != "requests"):
                peak[0] = _rss(serve.proc.pid)[0]
                started = time.perf_counter()
                with client.stream("GET", path.format(t=trace_id, r=first)) as r:
                    sent = b"".join(r.iter_raw())
                took = time.perf_counter() - started
                assert r.status_code == 200, (path, r.status_code)
                gzipped = r.headers.get("content-encoding") == "gzip"
                body = gzip.decompress(sent) if gzipped else sent
                if name == "requests":
                    first = json.loads(body)["requests"][0]["request_id"]
                mib = (len(sent) / 2**20, len(body) / 2**20, peak[0] / 2**20)
                print(f"  {name:<24} {took * 1e3:>7.0f} ms  {mib[0]:>7.1f} MiB sent, "
                      f"{mib[1]:>7.1f} MiB inflated  peak RSS {mib[2]:>7,.0f} MiB")  # fmt: skip
    finally:
        stop.set()
        sampler.join()
    print(f"  serve's peak RSS since it started (VmHWM) {_rss(serve.proc.pid)[1] / 2**20:,.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, nargs="+", default=[1100, 3300, 6600])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--concurrent", type=int, default=16)
    parser.add_argument("--ingest-s", type=float, default=10.0)
    parser.add_argument(
        "--prompt-kb", type=int, default=0,
        help="each span carries a prompt and a completion of this many kB",
    )  # fmt: skip
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="latscope-bench-traces-"))
    try:
        _run(root, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run(root: Path, args: argparse.Namespace) -> None:
    serve = Serve(root / "store")
    try:
        rng = random.Random(7)
        runs = {rng.randbytes(16): calls for calls in [1, *args.calls]}
        spans = {tid.hex(): span_count(calls) for tid, calls in runs.items()}
        started = time.perf_counter()
        kb = args.prompt_kb
        per_export = prompt_exports(kb)
        for i, (tid, calls) in enumerate(runs.items()):
            _send(serve.grpc, with_prompts(wide_run(tid, calls, per_export=per_export, seed=i), kb))
        if kb:  # every call attributed (so stored), without reading the spans' prompts
            _attributed(serve.http, sum(runs.values()))
        else:
            _stored(serve.http, list(spans), spans)
        prompts = f", a {kb} kB prompt and completion a span" if kb else ""
        print(f"sent and stored {sum(spans.values()):,} spans in {len(runs)} traces{prompts} in "
              f"{time.perf_counter() - started:.0f} s; load average "
              f"{os.getloadavg()[0]:.2f}")  # fmt: skip
        ids = list(spans)
        if kb:
            _memory(serve, ids[-1], spans[ids[-1]])
        with httpx.Client(base_url=serve.http, timeout=600) as client:
            first = {}
            for t in ids:
                r = client.get(f"/v1/traces/{t}/requests")
                assert r.status_code == 200, r.text
                first[t] = r.json()["requests"][0]["request_id"]
            header = "".join(f"{spans[t]:>10,} sp" for t in ids)
            print(f"\n{'route, best of ' + str(args.repeat):<34}{header}   ms per 1,000 spans")
            print(f"{'  (wall ms / serve CPU ms)':<34}")
            for path, name in ROUTES:
                times, cpus = [], []
                for t in ids:
                    took, cpu, status = _best(
                        client, path.format(t=t, r=first[t]), args.repeat, serve.proc.pid
                    )
                    assert status == 200, (path, t, status)
                    times.append(took)
                    cpus.append(cpu)
                per = "  ".join(
                    f"{x * 1e6 / spans[t]:5.1f}/{c * 1e6 / spans[t]:5.1f}"
                    for x, c, t in zip(times, cpus, ids, strict=True)
                    if spans[t] > 1000
                )
                cells = "".join(
                    f"{x * 1e3:>7.0f}/{c * 1e3:<5.0f}" for x, c in zip(times, cpus, strict=True)
                )
                print(f"{name:<34}{cells}   {per}")
        cli = [_cli_explain(serve.http, t, args.repeat) for t in ids]
        print(f"{'latscope explain TRACE_ID':<34}" + "".join(f"{x * 1e3:>10.0f} ms" for x in cli)
              + "   (a process: its start is the first column)")  # fmt: skip
        _ingest_beside(serve, ids[-1], args)
    finally:
        serve.stop()
    answers = _first_answers(root / "store", ids, first, args.repeat)
    _table("first answer, a fresh serve", "wall ms over HTTP", answers, ids, spans, args.repeat)
    cold = _cold(root / "store", ids, first, args.repeat)
    _table("cold: worked out from nothing", "in-process CPU ms", cold, ids, spans, args.repeat)
    # Past the cap: a serve on the same store that answers traces of fewer spans than the widest.
    cap = spans[ids[-1]] - 1
    serve = Serve(root / "store", "--max-trace-spans", str(cap))
    try:
        with httpx.Client(base_url=serve.http, timeout=600) as client:
            took, _, status = _best(client, f"/v1/traces/{ids[-1]}", args.repeat)
            body = client.get(f"/v1/traces/{ids[-1]}").json()
        print(f"\npast --max-trace-spans {cap:,}: {status} {body['error']} in {took * 1e3:.0f} ms: "
              f"{json.dumps(body['detail'])[:160]}...")  # fmt: skip
    finally:
        serve.stop()


if __name__ == "__main__":
    main()
