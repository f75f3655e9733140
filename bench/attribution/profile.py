"""Where the attributor's CPU goes inside the embedded ClickHouse: the pass serve makes after a
burst (``bench.attribution.run``'s quiet pass), statement by statement, and the single-call
INSERT by step of its pipeline, from the engine's own profile of each processor.

    .venv/bin/python -m bench.attribution.profile [--requests 200000] [--runs 3]

Stores ``--requests`` unique requests (7 spans each) through ``latscope serve`` with the
attributor off, as the attribution benchmark does, then reopens that store with the engine's
query log and processor profile log on (a config file for this process's engine; ``perf`` cannot
name a frame of chDB's stripped library) and runs the quiet pass ``--runs`` times over it, the
spans' merges stopped and the attribution table emptied before each. Each statement of a pass is
tagged with its name (``log_comment``) and the profile of each processor it ran is read back.

Printed, as medians over the runs:

- each statement: its calls, its CPU (this process's over the call; on one thread, so not what
  serve's statements cost, which ``bench.attribution.run`` gives) and its share of the pass's;
- the single-call INSERTs together, by step, in ms, in us a request and as a share of their CPU:
  reading the spans, the filters, building the batch's sets, the expressions before and after the
  GROUP BY, the GROUP BY's two halves (adding each span to its trace's aggregates; turning each
  trace's aggregates into columns), HAVING, writing the rows, and the rest of their CPU.

A processor's time is the wall time of its work (not its waits for input or output). Each
statement runs on one thread here, so no processor waits for a core behind another of its own
statement, and that time is close to the processor's CPU (it also counts what the machine's
other load takes from the thread). What the INSERTs' CPU has beyond their processors' time is
the engine's work outside them: parsing, analysis and planning (``bench.attribution.fixed``
measures the first two). Everything it creates (the store, the config) is removed at the end.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The engine's own logs, on for this process's engine: each query, and each of its processors.
LOGS_CONFIG = """<clickhouse>
  <query_log><database>system</database><table>query_log</table></query_log>
  <processors_profile_log>
    <database>system</database><table>processors_profile_log</table>
  </processors_profile_log>
</clickhouse>
"""
#: What each statement is run with: logged, its processors profiled, tagged with its name, and
#: on one thread: a processor's time is the wall time of its work, which counts CPU only while its
#: thread has a core to itself (with two, the statement's own threads take each other's turns).
TAG = "log_queries = 1, log_processors_profiles = 1, log_comment = '{name}', max_threads = 1"
#: The single-call INSERTs' step of each processor (its name, the plan step it belongs to, and
#: whether it runs after the GROUP BY's states are turned into columns), in print order.
STEPS = (
    "reading the spans",
    "filters (WHERE)",
    "the batch's sets and DISTINCT",
    "expressions before the GROUP BY",
    "GROUP BY: adding each span to its trace's aggregates",
    "GROUP BY: turning each trace's aggregates into columns",
    "HAVING",
    "expressions after the GROUP BY",
    "writing the rows",
    "other processors",
)
#: The processors of an INSERT's write, after its SELECT's last expression.
_WRITE = re.compile(
    r"^(MergeTreeSink|CountingTransform|ConvertingTransform|AddDeduplicationInfoTransform|"
    r"PlanSquashingTransform|ApplySquashingTransform|NestedElementsValidationTransform|"
    r"RemovingReplicatedColumnsTransform|EmptySink)$"
)


def tagged(sql: str, name: str) -> str:
    """``sql`` with the settings that log it, profile its processors and tag it ``name``: added
    to the SETTINGS clause that ends it (each of the attributor's statements ends with one), else
    a new one."""
    tag = TAG.format(name=name.replace("'", ""))
    last = sql.rstrip().rsplit("\n", 1)[-1]
    if last.startswith("SETTINGS "):
        return f"{sql.rstrip()}, {tag}"
    return f"{sql.rstrip()}\nSETTINGS {tag}"


def step_of(name: str, plan_step: str, description: str, after_group_by: bool) -> str:
    """The step (``STEPS``) of a processor of a single-call INSERT."""
    if name.startswith("MergeTreeSelect"):
        return STEPS[0]
    if name == "AggregatingTransform":
        return STEPS[4]
    if name.startswith("ConvertingAggregatedToChunks"):
        return STEPS[5]
    if plan_step == "Filter":
        return STEPS[6] if description == "HAVING" else STEPS[1]
    if plan_step.startswith("CreatingSet") or "Distinct" in name:
        return STEPS[2]
    if _WRITE.match(name):
        return STEPS[8]
    if name == "ExpressionTransform":
        return STEPS[7] if after_group_by else STEPS[3]
    return STEPS[9]


def downstream(processors: list[tuple]) -> set[int]:
    """The ids of the processors fed, directly or not, by the GROUP BY's conversion of its
    states to columns (``processors``: id, ids of the processors it feeds, name, ...)."""
    feeds = {p[0]: p[1] for p in processors}
    todo = [p[0] for p in processors if p[2].startswith("ConvertingAggregatedToChunks")]
    seen: set[int] = set()
    while todo:
        for fed in feeds.get(todo.pop(), ()):
            if fed not in seen:
                seen.add(fed)
                todo.append(fed)
    return seen


def tagging(attributor: Any, calls: list[str]) -> Callable[[str, Callable[[str], Any]], Any]:
    """What each of ``attributor``'s statements goes through (``statements_through``): tagged
    with a name of its own (a token of this pass, the call's number, and its name among the
    attributor's statements), kept in ``calls``."""
    from bench.attribution.run import statement_names

    this_pass = uuid.uuid4().hex[:12]

    def tag(sql: str, run: Callable[[str], Any]) -> Any:
        calls.append(f"{this_pass}:{len(calls)}:{statement_names(attributor).get(sql, 'other')}")
        return run(tagged(sql, calls[-1]))

    return tag


def profile_pass(store: Any, requests: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    """One quiet pass over every stored request (``quiet_pass``): by statement name, its CPU
    seconds and calls; and the single-call INSERTs' processors' ms by step."""
    from bench.attribution.run import quiet_pass

    calls: list[str] = []
    _, by_statement = quiet_pass(store, requests, lambda attributor: tagging(attributor, calls))
    store.command("SYSTEM FLUSH LOGS")
    logged = {
        tag
        for (tag,) in store.query_rows(
            "SELECT log_comment FROM system.query_log "
            "WHERE type = 'QueryFinish' AND has({tags:Array(String)}, log_comment)",
            {"tags": calls},
        )
    }
    processors: dict[str, list[tuple]] = defaultdict(list)
    for row in store.query_rows(
        "SELECT log_comment, id, parent_ids, name, plan_step_name, plan_step_description, "
        "elapsed_us FROM system.processors_profile_log AS p "
        "INNER JOIN system.query_log AS q ON p.query_id = q.query_id "
        "WHERE q.type = 'QueryFinish' AND has({tags:Array(String)}, q.log_comment)",
        {"tags": calls},
    ):
        processors[row[0]].append(row[1:])
    missing = [tag for tag in calls if tag not in logged]
    assert not missing, f"statements missing from the engine's query log: {missing}"
    steps = dict.fromkeys(STEPS, 0.0)
    for tag in calls:
        if tag.split(":", 2)[2].startswith("insert_simple"):
            after = downstream(processors[tag])
            for p in processors[tag]:
                steps[step_of(p[2], p[3], p[4], p[0] in after)] += p[5] / 1e3
    return by_statement, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200_000, help="unique requests (x7 spans)")
    parser.add_argument("--runs", type=int, default=3, help="quiet passes profiled")
    parser.add_argument("--senders", type=int, default=4)
    args = parser.parse_args()

    from bench.attribution.run import spans_merges_stopped, stored_burst
    from latscope.storage import Store

    workdir = Path(tempfile.mkdtemp(prefix="latscope-attrprofile-"))
    try:
        t = time.perf_counter()
        stored = stored_burst(args.requests, workdir / "serve", senders=args.senders)
        print(f"{args.requests:,} requests ({args.requests * 7:,} spans) stored through latscope "
              f"serve in {stored.stored_s:.1f} s ({time.perf_counter() - t:.1f} s with building "
              "them)")  # fmt: skip
        config = workdir / "logs.xml"
        config.write_text(LOGS_CONFIG)
        store = Store.open(f"chdb://{stored.store_dir}", chdb_options={"config-file": str(config)})
        runs: list[tuple[dict[str, list[float]], dict[str, float]]] = []
        try:
            with spans_merges_stopped(store):
                for _ in range(args.runs):
                    runs.append(profile_pass(store, args.requests))
        finally:
            store.close()
        print_profile(runs, args.requests)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def print_profile(
    runs: list[tuple[dict[str, list[float]], dict[str, float]]], requests: int
) -> None:
    def median(values: list[float]) -> float:
        return statistics.median(values) if values else 0.0

    names = sorted(
        {name for by_statement, _ in runs for name in by_statement},
        key=lambda n: -median([r[0].get(n, [0.0, 0])[0] for r in runs]),
    )
    totals = [sum(s[0] * 1e3 for s in by_statement.values()) for by_statement, _ in runs]
    print(f"\nthe quiet pass over {requests:,} requests, each statement on one thread, "
          f"{len(runs)} runs, medians: "
          f"{median(totals):,.0f} CPU ms ({requests / (median(totals) / 1e3):,.0f} requests per "
          "CPU s)")  # fmt: skip
    print(f"  {'statement':36s} {'calls':>5s} {'CPU ms':>8s} {'share':>6s}")
    for name in names:
        spent = [r[0][name] for r in runs if name in r[0]]
        cpu = median([s[0] * 1e3 for s in spent])
        print(f"  {name:36s} {int(spent[0][1]):5d} {cpu:8.0f} {cpu / median(totals):6.1%}")
    inserts = median(
        [
            sum(s[0] * 1e3 for n, s in by_statement.items() if n.startswith("insert_simple"))
            for by_statement, _ in runs
        ]
    )
    steps = {step: median([r[1][step] for r in runs]) for step in STEPS}
    steps["outside the processors (parsing, analysis, planning)"] = inserts - sum(steps.values())
    print(f"\nthe single-call INSERTs together by step, medians ({inserts:,.0f} CPU ms, "
          f"{inserts * 1e3 / requests:.1f} us a request):")  # fmt: skip
    print(f"  {'step':56s} {'ms':>6s} {'us/req':>6s} {'share':>6s}")
    for step, ms in steps.items():
        print(f"  {step:56s} {ms:6.0f} {ms * 1e3 / requests:6.2f} {ms / inserts:6.1%}")


if __name__ == "__main__":
    main()
