"""The fixed cost of the attributor's two statements: what ClickHouse spends parsing, analysing
and planning each one, which every pass that runs it pays whatever its batch's size.

    .venv/bin/python -m bench.attribution.fixed [--rounds 9]
    .venv/bin/python -m bench.attribution.fixed --save DIR         # keep these statements' text
    .venv/bin/python -m bench.attribution.fixed --against DIR      # time them beside DIR's

In a fresh embedded store (schema applied, no spans), for the single-call statement (by resource
id, the one the collector's spans take) and the general one: the text's length, the lines of
``EXPLAIN QUERY TREE`` (the analysed tree), and the CPU seconds of parsing alone (``EXPLAIN
AST``), of analysis (``EXPLAIN QUERY TREE``) and of a run over a batch of no traces (parse,
analysis, plan and an empty read: a pass's fixed cost), each ``--rounds`` times, the statements
alternating; printed as median and minimum, beside ``SELECT 1`` through the same client (the
baseline of a call). ``--against DIR`` times the statements saved there by ``--save`` (say from
another revision) in the same rounds and prints the ratios of the medians. Everything it creates
is removed at the end.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

#: The batch: a list of trace ids, none stored (the statements read no span).
BY_IDS = "SELECT arrayJoin({trace_ids:Array(String)}) AS trace_id"
PARAMS = {"trace_ids": ["00"], "stall_ns": 1, "through_us": 0, "after_us": 0}
NAMES = ("single-call", "general")


def statements() -> dict[str, str]:
    from latscope.attribution.sql import attribution_select, simple_select
    from latscope.storage import SPANS_TABLE

    return {
        "single-call": simple_select(BY_IDS, SPANS_TABLE, "1", True, True),
        "general": attribution_select(BY_IDS, SPANS_TABLE, "1"),
    }


def _cpu(fn: Callable[[], Any]) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


def measure(store: Any, sqls: dict[str, str], rounds: int) -> dict[str, dict[str, list[float]]]:
    """CPU seconds per statement and measure, ``rounds`` values each, the statements alternating
    within every round."""
    measures: dict[str, Callable[[str], Any]] = {
        "parse": lambda sql: store.query_rows("EXPLAIN AST " + sql, PARAMS),
        "analysis": lambda sql: store.query_rows("EXPLAIN QUERY TREE " + sql, PARAMS),
        "empty run": lambda sql: store.query_arrow(sql, PARAMS),
    }
    out: dict[str, dict[str, list[float]]] = {name: {m: [] for m in measures} for name in sqls}
    for sql in sqls.values():  # the first call of each pays one-off work (caches, functions)
        measures["empty run"](sql)
    for _ in range(rounds):
        for m, fn in measures.items():
            for name, sql in sqls.items():
                out[name][m].append(_cpu(partial(fn, sql)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--save", type=Path, help="write the statements' text here and stop")
    parser.add_argument("--against", type=Path, help="time the statements saved here beside")
    args = parser.parse_args()
    current = statements()
    if args.save:
        args.save.mkdir(parents=True, exist_ok=True)
        for name, sql in current.items():
            (args.save / f"{name}.sql").write_text(sql)
        print(f"saved {', '.join(current)} in {args.save}")
        return
    sqls = dict(current)
    if args.against:
        for name in NAMES:
            sqls[f"{name} (saved)"] = (args.against / f"{name}.sql").read_text()

    from latscope.storage import Store

    workdir = Path(tempfile.mkdtemp(prefix="latscope-fixedbench-"))
    try:
        store = Store.open(f"chdb://{workdir}")
        try:
            store.apply_schema()
            lines = {
                name: len(store.query_rows("EXPLAIN QUERY TREE " + sql, PARAMS))
                for name, sql in sqls.items()
            }
            call = [_cpu(lambda: store.query_rows("SELECT 1")) for _ in range(args.rounds)]
            out = measure(store, sqls, args.rounds)
        finally:
            store.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"{args.rounds} rounds; SELECT 1: {statistics.median(call) * 1000:.1f} ms CPU")
    print(f"{'':<44}{'CPU s, median (min):':>42}")
    print(f"{'statement':<24}{'chars':>8}{'tree lines':>12}{'parse':>16}{'analysis':>16}"
          f"{'empty run':>16}")  # fmt: skip
    for name, by in out.items():
        cells = "".join(f"{statistics.median(v):.3f} ({min(v):.3f})".rjust(16) for v in by.values())
        print(f"{name:<24}{len(sqls[name]):>8,}{lines[name]:>12,}{cells}")
    if args.against:
        print("ratios of the medians, current / saved:")
        for name in NAMES:
            now, then = out[name], out[f"{name} (saved)"]
            ratios = "  ".join(
                f"{m} {statistics.median(now[m]) / statistics.median(then[m]):.2f}" for m in now
            )
            print(f"  {name:<12} tree lines {lines[name] / lines[f'{name} (saved)']:.2f}  {ratios}")


if __name__ == "__main__":
    main()
