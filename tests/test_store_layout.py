"""A spans table in the OpenTelemetry Collector ClickHouse exporter's JSON-typed layout is refused
at start with the reason, before anything in the store is changed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.upstream_traces import JSON_EXPORTER_TRACES_DDL

pytestmark = pytest.mark.subprocess

MAKE_STORE = """
import sys
from latscope.storage import Store
store = Store.open("chdb://" + sys.argv[1])
store.command(sys.argv[2])
"""


def test_serve_refuses_a_json_typed_spans_table(tmp_path: Path) -> None:
    store_dir = tmp_path / "exporter-json"
    subprocess.run(
        [sys.executable, "-c", MAKE_STORE, str(store_dir),
         JSON_EXPORTER_TRACES_DDL.format(table="otel_traces")],
        check=True, timeout=120,
    )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "latscope.cli", "serve", "--store", f"chdb://{store_dir}",
         "--otlp-grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "SpanAttributes" in output and "Map(String, String)" in output, output
    assert "Traceback" not in output, output
    # Nothing was applied: no latscope table next to the exporter's.
    check = subprocess.run(
        [sys.executable, "-c",
         "import sys; from latscope.storage import Store; "
         "s = Store.open('chdb://' + sys.argv[1]); "
         "print(sorted(r[0] for r in s.query_rows('SHOW TABLES')))",
         str(store_dir)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert check.stdout.strip() == "['otel_traces']", check.stdout
