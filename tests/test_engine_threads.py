"""The embedded engine as ``latscope serve`` starts it: its queries use the cores while its memory
limit has room (``latscope.storage.QUERY_THREAD_SHARE``).

The engine takes its settings from the connection that starts it, once a process, so each check
runs in a process of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from latscope.config import Settings
from latscope.storage import ENGINE_MEMORY_SHARE

_PROBE = """
import json, sys
from latscope.storage import Store
store = Store.open("chdb://" + sys.argv[1], memory_limit_bytes=int(sys.argv[2]))
plan = [row[0].strip() for row in store.query_rows(
    "EXPLAIN PIPELINE SELECT sum(number) FROM numbers_mt(10000000) SETTINGS max_threads = 2"
)]
limit = store.query_rows(
    "SELECT value FROM system.server_settings WHERE name = 'max_server_memory_usage'"
)[0][0]
print(json.dumps({"plan": plan, "limit": int(limit)}))
store.close()
"""


def _probe(path: Path, memory_limit_bytes: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(path), str(memory_limit_bytes)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_query_of_the_engine_under_the_default_memory_setting_runs_on_two_threads(
    tmp_path: Path,
) -> None:
    # The default setting gives the engine 768 MiB, under ClickHouse's own 1 GiB of free memory a
    # query thread: without latscope's share, the read is one stream ("NumbersRange 0 → 1").
    default = Settings().memory_limit_bytes
    probe = _probe(tmp_path / "store", default)
    assert probe["limit"] == ENGINE_MEMORY_SHARE * default
    reads = [step for step in probe["plan"] if step.startswith("NumbersRange")]
    assert reads == ["NumbersRange × 2 0 → 1"], probe["plan"]
