"""Wide traces through the attributor: routed to the reference engine, against the SQL first.

    .venv/bin/python -m bench.attribution.wide [--calls 150 300 1100 3300] [--rounds 2]

For each ``--calls``, a fresh ``latscope serve`` (its defaults, an embedded store) is sent one
agent run of that many calls (6 spans a call, ``bench/api/wide.py``) and a one-call run beside it,
in variants taking turns, ``--rounds`` times each:

- ``routed`` (the default): a trace with at least ``--attribution-reference-spans`` (1,000)
  spans in a pass goes to the reference engine without the SQL, which works in a process of its
  own (``--attribution-reference-process on``);
- ``in process``: the same, the reference engine working in serve's attributor thread
  (``--attribution-reference-process off``);
- ``sql first``: that bound above every run (``--attribution-reference-spans 1000000``), so the
  attributor's SQL takes every trace, and one it refuses alone for its memory goes to the
  reference engine after (the attributor before the bound existed).

Printed per run size and variant (medians of the rounds): seconds from the last Export's
acknowledgement until every call of both runs is attributed
(``latscope_attributed_requests_total``), serve's CPU seconds over that time (its child
process included: the reference engine's worker), the batches ClickHouse refused for memory
(serve's warnings of a batch failed with ``MEMORY_LIMIT_EXCEEDED``; the parts a refused batch
is cut into are tried without one), the traces the reference engine took, and the peak RSS of
serve and of its largest child (the worker); then routed against each other variant, round by
round.

``--prompt-kb N``: every span carries a prompt and a completion of N kB each (Exports of about
8 MB), as agent runs traced with message content do.

``--beside-ingest``: from the last Export of the runs until they are attributed, a sender also
has Exports of 64 plain spans (no call among them) acknowledged one after the other, 20 ms
apart, and their acknowledgement times are printed (p50, p99, max): what attributing the wide
run does to ingest beside it. Ingest then never pauses, so the runs wait the settle window
instead of a quiet pass.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import grpc
import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span

from bench.api.traces import EXPORT, Serve, _cpu_s, _pct, _send
from bench.api.wide import T0, prompt_exports, span_count, wide_run, with_prompts
from bench.ingest.run import _median
from bench.memory.run import _metric, _rss

VARIANTS = {
    "routed": (),
    "in process": ("--attribution-reference-process", "off"),
    "sql first": ("--attribution-reference-spans", "1000000"),
}
WIDE = bytes.fromhex("1f" * 16)
ONE = bytes.fromhex("2f" * 16)


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants now living."""
    found = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            found += _tree(int(child))
    return found


def _tree_cpu_s(pid: int, seen: dict[int, float]) -> float:
    """CPU seconds of ``pid`` and its children, those that ended since an earlier call included
    (``seen``: the last figure of each process asked about)."""
    for each in _tree(pid):
        with contextlib.suppress(FileNotFoundError):  # ended since it was listed
            seen[each] = _cpu_s(each)
    return sum(seen.values())


def _served(http: str, name: str) -> float:
    """A metric of serve's /metrics (0 when absent)."""
    return _metric(httpx.get(f"{http}/metrics", timeout=30).text, name)


def _ticks(addr: str, stop: threading.Event, acks: list[float]) -> None:
    """Exports of 64 plain spans, one after the other, until ``stop``: their ack times (s)."""
    export = ExportTraceServiceRequest(resource_spans=[ResourceSpans()])
    scope = export.resource_spans[0].scope_spans.add()
    for i in range(64):
        scope.spans.append(Span(
            trace_id=bytes.fromhex("3f" * 16), span_id=(i + 1).to_bytes(8, "big"), name="tick",
            kind=Span.SPAN_KIND_INTERNAL, start_time_unix_nano=T0, end_time_unix_nano=T0 + 1000,
        ))  # fmt: skip
    payload = export.SerializeToString()
    with grpc.insecure_channel(addr) as channel:
        call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        while not stop.is_set():
            started = time.perf_counter()
            call(payload, timeout=60)
            acks.append(time.perf_counter() - started)
            time.sleep(0.02)


def one_round(
    workdir: Path, calls: int, variant: str, beside: bool, prompt_kb: int = 0
) -> dict[str, float]:
    """A fresh serve sent the two runs: what attributing them took."""
    store = workdir / f"store-{calls}-{variant.replace(' ', '-')}"
    per_export = prompt_exports(prompt_kb)
    runs = [*wide_run(WIDE, calls, per_export=per_export), *wide_run(ONE, 1)]
    payloads = with_prompts(runs, prompt_kb)
    serve = Serve(store, *VARIANTS[variant])
    lines: list[str] = []
    try:
        pid = serve.proc.pid
        _send(serve.grpc, payloads)
        cpus: dict[int, float] = {}
        sent, cpu0 = time.perf_counter(), _tree_cpu_s(pid, cpus)
        stop, acks = threading.Event(), []
        ticker = threading.Thread(target=_ticks, args=(serve.grpc, stop, acks))
        if beside:
            ticker.start()
        deadline = sent + 600
        try:
            while _served(serve.http, "latscope_attributed_requests_total") < calls + 1:
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"{calls} calls ({variant}) not attributed in 600 s")
                time.sleep(0.05)
        finally:
            stop.set()
            if beside:
                ticker.join()
        result = {
            "seconds": time.perf_counter() - sent,
            "cpu_s": _tree_cpu_s(pid, cpus) - cpu0,
            "by_reference": _served(serve.http, "latscope_attribution_by_reference_traces_total"),
            "peak_rss_mib": _rss(pid)[1] / 2**20,
            "child_rss_mib": max((_rss(c)[1] for c in _tree(pid)[1:]), default=0) / 2**20,
        }
        if acks:
            result.update(ack_p50_ms=_pct(acks, 0.5) * 1e3, ack_p99_ms=_pct(acks, 0.99) * 1e3,
                          ack_max_ms=max(acks) * 1e3)  # fmt: skip
    finally:
        serve.stop()
        lines = serve.lines
        shutil.rmtree(store, ignore_errors=True)
        shutil.rmtree(Path(f"{store}-spool"), ignore_errors=True)
    result["refused"] = sum(
        "traces failed" in line and "MEMORY_LIMIT_EXCEEDED" in line for line in lines
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, nargs="+", default=[150, 300, 1100, 3300])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--beside-ingest", action="store_true", help="time Exports acknowledged meanwhile"
    )
    parser.add_argument(
        "--prompt-kb", type=int, default=0,
        help="each span carries a prompt and a completion of this many kB",
    )  # fmt: skip
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="latscope-bench-wide-attribution-"))
    results: dict[tuple[int, str], list[dict[str, float]]] = {}
    try:
        for calls in args.calls:
            for r in range(args.rounds):
                order = list(VARIANTS) if r % 2 == 0 else list(VARIANTS)[::-1]
                for variant in order:
                    results.setdefault((calls, variant), []).append(
                        one_round(workdir, calls, variant, args.beside_ingest, args.prompt_kb)
                    )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    prompts = f", a {args.prompt_kb} kB prompt and completion a span" if args.prompt_kb else ""
    print(f"wide runs through latscope serve, medians of {args.rounds} rounds{prompts}; "
          f"load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    head = ("spans", "variant", "s to attributed", "serve CPU s", "batches refused", "by reference",
            "peak RSS MiB", "child RSS MiB")  # fmt: skip
    if args.beside_ingest:
        head += ("ack p50 ms", "ack p99 ms", "ack max ms")
    print("  " + " ".join(f"{h:>16s}" for h in head))
    for calls in args.calls:
        for variant in VARIANTS:
            got = results[(calls, variant)]
            cells = [f"{span_count(calls):,}", variant]
            cells += [f"{_median([g[k] for g in got]):.2f}" for k in ("seconds", "cpu_s")]
            cells += [f"{_median([g[k] for g in got]):.0f}" for k in ("refused", "by_reference")]
            cells += [
                f"{_median([g[k] for g in got]):,.0f}" for k in ("peak_rss_mib", "child_rss_mib")
            ]
            if args.beside_ingest:
                cells += [f"{_median([g[k] for g in got]):.1f}"
                          for k in ("ack_p50_ms", "ack_p99_ms", "ack_max_ms")]  # fmt: skip
            print("  " + " ".join(f"{c:>16s}" for c in cells))
        keys = ("seconds", "cpu_s") + (("ack_p99_ms", "ack_max_ms") if args.beside_ingest else ())
        for other in list(VARIANTS)[1:]:
            pairs = zip(results[(calls, "routed")], results[(calls, other)], strict=True)
            listed = ", ".join(" / ".join(f"{a[k] / b[k]:.2f}" for k in keys) for a, b in pairs)
            print(f"  {span_count(calls):,} spans, routed / {other} "
                  f"({' / '.join(keys)}), by round: {listed}")  # fmt: skip


if __name__ == "__main__":
    main()
