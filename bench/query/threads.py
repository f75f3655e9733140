"""The embedded engine's query threads: what a thread a core buys against one thread, as
``latscope serve`` opens the engine (``latscope.storage.QUERY_THREAD_SHARE``).

    .venv/bin/python -m bench.query.threads [--requests 50000] [--rounds 6] [--calls 3300]

Both parts run over stores opened with serve's default memory setting (the engine's limit 768
MiB), the spans table's merges stopped, each measure on the engine's threads and with
``max_threads = 1`` (what ClickHouse's own rule gives every query under that limit), the
two alternating round by round; printed: medians of wall and CPU seconds of this process.

1. The attributor: ``--requests`` of the attribution benchmark's requests (7 spans each) sent to
   ``latscope serve`` with its attributor off, then attributed again from an empty attribution
   table, as a quiet pass (the attributor's clock 1 s after the newest span: every span inside
   the settle window, ingest paused, so one statement takes the early window) and as settled
   traces (settle window 0).
2. A trace's read: an agent run of ``--calls`` calls (6 spans each, ``bench.api.wide``), every
   span carrying a 16 kB prompt and a 16 kB completion, stored through the collector's decoder,
   read as the trace routes read it (``TRACE_SPANS_SHOWN``: values cut at 256 characters).

Everything it creates is removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

#: The two ways each measure runs: the engine's threads (None: no setting) and one thread.
THREADS: dict[str, int | None] = {"engine's threads": None, "one thread": 1}


def _in_turn(round_: int) -> list[str]:
    """``THREADS``' names in the order of round ``round_``: each first every other round."""
    names = list(THREADS)
    return names if round_ % 2 == 0 else names[::-1]


def _timed(fn: Callable[[], Any]) -> tuple[tuple[float, float], Any]:
    """Wall and CPU seconds of ``fn()``, and what it returned."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return (time.perf_counter() - wall, time.process_time() - cpu), out


@contextlib.contextmanager
def _threads(store: Any, chosen: list[int | None]) -> Iterator[None]:
    """Every query of ``store`` with ``max_threads = chosen[0]`` while it is set (None: none)."""
    querying = store._querying

    @contextlib.contextmanager
    def with_threads() -> Iterator[tuple[Any, dict[str, Any] | None]]:
        with querying() as (client, settings):
            if chosen[0] is None:
                yield client, settings
            else:
                yield client, {**(settings or {}), "max_threads": chosen[0]}

    store._querying = with_threads
    try:
        yield
    finally:
        store._querying = querying


def _open(path: Path) -> Any:
    """The store at ``path`` as serve opens it: its engine's limits from the default setting."""
    from latscope.config import Settings
    from latscope.storage import ENGINE_MEMORY_SHARE, SPANS_TABLE, Store

    setting = Settings().memory_limit_bytes
    store = Store.open(f"chdb://{path}", memory_limit_bytes=setting)
    (limit,) = store.query_rows(
        "SELECT value FROM system.server_settings WHERE name = 'max_server_memory_usage'"
    )[0]
    assert int(limit) == ENGINE_MEMORY_SHARE * setting, (limit, setting)
    store.apply_schema()
    store.command(f"SYSTEM STOP MERGES {SPANS_TABLE}")
    return store


def attributor_part(workdir: Path, requests: int, rounds: int) -> dict[tuple[str, str], list]:
    from bench.attribution.run import quiet_attributor, stored_burst
    from latscope.attribution.attributor import Attributor
    from latscope.storage import ATTRIBUTION_TABLE

    run = stored_burst(requests, workdir)
    store = _open(run.store_dir)
    chosen: list[int | None] = [None]
    out: dict[tuple[str, str], list] = {}
    with _threads(store, chosen):
        for r in range(rounds):
            for way in ("quiet pass", "settled traces"):
                for name in _in_turn(r):
                    chosen[0] = THREADS[name]
                    store.command(f"TRUNCATE TABLE {ATTRIBUTION_TABLE}")
                    if way == "quiet pass":
                        attributor = quiet_attributor(store)
                    else:
                        attributor = Attributor(store, settle_s=0.0)
                    timed, written = _timed(partial(attributor.run_until_idle, max_batches=10**6))
                    assert written == requests, (written, requests)
                    out.setdefault((way, name), []).append(timed)
    store.close()
    return out


def trace_part(workdir: Path, calls: int, rounds: int) -> tuple[int, dict[str, list]]:
    from bench.api.wide import prompt_exports, span_count, wide_run, with_prompts
    from latscope.attribution.queries import ATTRIBUTE_CHARS, TRACE_SPANS_SHOWN
    from latscope.attribution.sql import rule_keys
    from latscope.collector.mapping import combine, decode_spans
    from latscope.storage import SPANS_TABLE

    store = _open(workdir / "trace-store")
    trace_id = os.urandom(16)
    exports = with_prompts(wide_run(trace_id, calls, per_export=prompt_exports(16)), 16)
    for i, message in enumerate(exports):
        store.insert_arrow(SPANS_TABLE, combine(decode_spans(message).table), dedup_token=str(i))
    params = {"trace_id": trace_id.hex(), "keys": rule_keys(), "cut": ATTRIBUTE_CHARS}
    chosen: list[int | None] = [None]
    out: dict[str, list] = {}
    with _threads(store, chosen):
        for r in range(rounds):
            for name in _in_turn(r):
                chosen[0] = THREADS[name]
                timed, rows = _timed(partial(store.query_rows, TRACE_SPANS_SHOWN, params))
                assert len(rows) == span_count(calls), len(rows)
                out.setdefault(name, []).append(timed)
    store.close()
    return span_count(calls), out


def _medians(values: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(v[0] for v in values), statistics.median(v[1] for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=3300, help="calls of the agent run read")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="latscope-bench-threads-"))
    try:
        attribution = attributor_part(workdir, args.requests, args.rounds)
        spans, trace = trace_part(workdir, args.calls, args.rounds)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"load average {os.getloadavg()[0]:.2f}; medians of {args.rounds} rounds, wall / CPU s")
    print(f"the attributor, {args.requests:,} requests:")
    for way in ("quiet pass", "settled traces"):
        base_wall, base_cpu = _medians(attribution[(way, "one thread")])
        for name in THREADS:
            wall, cpu = _medians(attribution[(way, name)])
            print(f"  {way:15s} {name:17s} {wall:6.3f} / {cpu:6.3f}   "
                  f"{args.requests / cpu:8,.0f} requests per CPU s   against one thread: "
                  f"wall {wall / base_wall:.2f}, CPU {cpu / base_cpu:.2f}")  # fmt: skip
    print(f"a trace of {spans:,} spans carrying 16 kB prompts and completions, read as shown:")
    base_wall, base_cpu = _medians(trace["one thread"])
    for name in THREADS:
        wall, cpu = _medians(trace[name])
        print(f"  {name:17s} {wall * 1000:7.1f} / {cpu * 1000:7.1f} ms   against one thread: "
              f"wall {wall / base_wall:.2f}, CPU {cpu / base_cpu:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
