"""The Grafana dashboard's queries, run as Grafana would against the embedded ClickHouse.

The store holds demo traffic (tests/deploy_demo.py): LLM request traces sent through a real
``latscope serve`` over OTLP/gRPC, their attribution rows and NVML gauge samples. Every query of
every panel and variable is interpolated and macro-expanded as Grafana and the ClickHouse plugin
do (tests/deploy_grafana.py) and must run and return rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml

from latscope.semconv import BUCKETS
from latscope.storage import SPANS_TABLE, Store
from tests.deploy_demo import Demo, load_demo
from tests.deploy_grafana import grafana_sql, is_number, parse_relative, resolve_variables

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy/grafana/dashboards/latscope.json"
DATASOURCES = ROOT / "deploy/grafana/provisioning/datasources/clickhouse.yaml"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, Demo, datetime]]:
    now = datetime.now(UTC).replace(microsecond=0)
    data = load_demo(
        tmp_path_factory.mktemp("deploy") / "store", now_ns=int(now.timestamp()) * 10**9
    )
    # One embedded store per process at a time: close it when the module is done.
    store = Store.open(f"chdb://{data.store_dir}")
    try:
        yield store, data, now
    finally:
        store.close()


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panel_queries() -> list[Any]:
    """The ClickHouse panels' queries (the Prometheus panels, the SLO alerts', run against a
    real Prometheus in tests/test_deploy_prometheus.py)."""
    return [
        pytest.param(panel, target, id=f"{panel['id']}-{target['refId']}")
        for panel in dashboard()["panels"]
        for target in panel.get("targets", [])
        if "rawSql" in target
    ]


class Grafana:
    """The dashboard loaded over the demo store at its default time range."""

    def __init__(self, store: Store, now: datetime, *, start: datetime | None = None) -> None:
        board = dashboard()
        self.store = store
        self.start = start or parse_relative(board["time"]["from"], now)
        self.end = now if start else parse_relative(board["time"]["to"], now)
        self.variables = resolve_variables(
            board["templating"]["list"], store.query_rows, start=self.start, end=self.end
        )

    def sql(self, raw: str) -> str:
        return grafana_sql(raw, start=self.start, end=self.end, variables=self.variables)

    def run(self, raw: str) -> pa.Table:
        return self.store.query_arrow(self.sql(raw))


@pytest.fixture(scope="module")
def grafana(demo: tuple[Store, Demo, datetime]) -> Grafana:
    store, _, now = demo
    return Grafana(store, now)


def test_demo_traffic_went_through_the_collector(demo: tuple[Store, Demo, datetime]) -> None:
    store, data, _ = demo
    assert data.traces == data.requests
    kinds = dict(store.query_rows(f"SELECT SpanKind, count() FROM {SPANS_TABLE} GROUP BY 1"))
    assert kinds["Server"] == data.requests
    assert 0 < kinds["Client"] < data.requests  # some requests come without a client span


def test_variables_resolve_to_demo_values(grafana: Grafana) -> None:
    v = grafana.variables
    assert set(v["service"]) == {"vllm-llama", "vllm-mixtral"}
    assert set(v["model"]) == {"llama-3.1-8b", "mixtral-8x7b"}
    assert len(v["trace_id"]) == 1 and len(v["trace_id"][0]) == 32


@pytest.mark.parametrize(("panel", "target"), panel_queries())
def test_every_panel_query_runs_and_returns_rows(
    grafana: Grafana, panel: dict[str, Any], target: dict[str, Any]
) -> None:
    title = panel["title"]
    table = grafana.run(target["rawSql"])
    assert table.num_rows > 0, f"{title}: no rows"
    rows = table.to_pylist()
    if panel["type"] == "timeseries":
        assert "time" in table.column_names, title
        values = [c for c in table.column_names if c not in ("time", "series")]
        for column in values:
            assert any(is_number(r[column]) for r in rows), f"{title}: {column} is never a number"
    elif panel["type"] in ("stat", "barchart"):
        for column in table.column_names:
            if pa.types.is_floating(table.schema.field(column).type):
                assert any(is_number(r[column]) for r in rows), f"{title}: {column} all null"


def _panel(title_start: str) -> dict[str, Any]:
    matches = [p for p in dashboard()["panels"] if p["title"].startswith(title_start)]
    assert len(matches) == 1, title_start
    return matches[0]


def test_budget_bars_add_up_to_the_mean_end_to_end_latency(grafana: Grafana) -> None:
    panel = _panel("Latency budget: mean per request")
    rows = grafana.run(panel["targets"][0]["rawSql"]).to_pylist()
    assert [c for c in rows[0] if c != "time"] == list(BUCKETS)
    e2e = {
        r["time"]: r["e2e_ms"]
        for r in grafana.run(
            "SELECT $__timeInterval(Timestamp) AS time, avg(E2eNs) / 1e6 AS e2e_ms "
            "FROM latscope_attribution FINAL WHERE $__timeFilter(Timestamp) GROUP BY time"
        ).to_pylist()
    }
    assert len(e2e) == len(rows)
    for row in rows:
        stacked = sum(row[b] for b in BUCKETS)
        assert stacked == pytest.approx(e2e[row["time"]], rel=1e-9, abs=1e-6)


def test_tail_panel_names_every_bucket_once(grafana: Grafana) -> None:
    rows = grafana.run(_panel("Tail:")["targets"][0]["rawSql"]).to_pylist()
    assert sorted(r["bucket"] for r in rows) == sorted(BUCKETS)
    extra = [r["extra_ms"] for r in rows]
    assert extra == sorted(extra, reverse=True)
    # The slowest requests must be slower somewhere: their buckets sum to more than the rest's.
    assert sum(extra) > 0


def test_slo_burn_rates_match_a_direct_count(grafana: Grafana) -> None:
    [row] = grafana.run(
        _panel("Burn rate over the whole range")["targets"][0]["rawSql"]
    ).to_pylist()
    v = grafana.variables
    threshold_ns = float(v["e2e_slo_ms"][0]) * 1e6
    budget = 1 - float(v["slo_target"][0])
    e2e = [r[0] for r in grafana.store.query_rows(
        grafana.sql("SELECT E2eNs FROM latscope_attribution FINAL WHERE $__timeFilter(Timestamp)")
    )]  # fmt: skip
    expected = sum(1 for x in e2e if x > threshold_ns) / len(e2e) / budget
    assert row["e2e_burn"] == pytest.approx(expected)
    assert all(is_number(row[k]) for k in ("ttft_burn", "tpot_burn", "e2e_burn"))


def test_gpu_panel_has_both_phases(grafana: Grafana) -> None:
    rows = grafana.run(_panel("GPU figures per phase")["targets"][0]["rawSql"]).to_pylist()
    phases = {r["phase"] for r in rows}
    assert phases == {"prefill", "decode"}
    util = {r["phase"]: r["mean"] for r in rows if r["figure"] == "utilization_mean"}
    assert 0 < util["decode"] < util["prefill"] <= 100  # the demo's prefill runs hotter


def test_trace_view_returns_the_selected_trace_in_trace_format(grafana: Grafana) -> None:
    panel = _panel("Trace ")
    assert panel["type"] == "traces"
    target = panel["targets"][0]
    assert target["format"] == 3 and target["queryType"] == "traces"  # the plugin's Trace format
    table = grafana.run(target["rawSql"])
    needed = {"traceID", "spanID", "parentSpanID", "serviceName", "operationName", "startTime",
              "duration", "tags", "serviceTags"}  # fmt: skip
    assert needed <= set(table.column_names)
    rows = table.to_pylist()
    assert {r["traceID"] for r in rows} == set(grafana.variables["trace_id"])
    # startTime and duration in milliseconds as numbers, startTime since the epoch: what the
    # ClickHouse plugin's own trace query returns (multiply(toUnixTimestamp64Nano(...), 1e-6));
    # the trace panel misplaces spans given a DateTime64.
    stored = {
        span: (start, duration)
        for span, start, duration in grafana.store.query_rows(
            "SELECT SpanId, toUnixTimestamp64Nano(Timestamp), Duration FROM otel_traces "
            "WHERE TraceId = {t:String}",
            {"t": rows[0]["traceID"]},
        )
    }
    assert len(stored) == len(rows)
    for r in rows:
        assert isinstance(r["startTime"], float) and isinstance(r["duration"], float)
        start_ns, duration_ns = stored[r["spanID"]]
        assert r["startTime"] == pytest.approx(start_ns / 1e6, abs=1e-3)
        assert r["duration"] == pytest.approx(duration_ns / 1e6, abs=1e-6)
    assert [r["startTime"] for r in rows] == sorted(r["startTime"] for r in rows)
    ids = {r["spanID"] for r in rows}
    roots = [r for r in rows if r["parentSpanID"] not in ids]
    assert len(roots) == 1  # one tree: client (or server) span at the top
    # Map(String, String) arrives as key/value pairs: each tag is {'key': ..., 'value': ...}.
    tags = [dict(tag) for r in rows for tag in r["tags"]]
    phases = {t["value"] for t in tags if t["key"] == "latscope.phase"}
    assert phases == {"queue", "preprocess", "prefill", "decode", "postprocess"}


def test_datasource_trace_settings_name_columns_of_the_spans_table(
    demo: tuple[Store, Demo, datetime],
) -> None:
    store = demo[0]
    [source] = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    traces = source["jsonData"]["traces"]
    assert traces["defaultTable"] == SPANS_TABLE
    columns = {
        r[0]
        for r in store.query_rows(
            "SELECT name FROM system.columns WHERE database = currentDatabase() "
            "AND table = {t:String}",
            {"t": SPANS_TABLE},
        )
    }
    named = {v for k, v in traces.items() if k.endswith("Column")}
    assert named and named <= columns, named - columns
    assert traces["durationUnit"] == "nanoseconds"  # Duration is UInt64 ns in the table


def test_time_range_moves_the_data(demo: tuple[Store, Demo, datetime], grafana: Grafana) -> None:
    # A day-long window ending before the demo traffic sees none of it: the macros filter on time.
    store, data, _ = demo
    before = datetime.fromtimestamp(data.first_ns / 1e9 - 1, UTC)
    with pytest.raises(AssertionError, match="no values"):
        Grafana(store, before, start=before - timedelta(days=1))
    grafana.start, saved = before - timedelta(days=1), grafana.start
    grafana.end, saved_end = before, grafana.end
    try:
        requests = grafana.run(_panel("Requests")["targets"][0]["rawSql"]).to_pylist()
    finally:
        grafana.start, grafana.end = saved, saved_end
    assert requests == [{"requests": 0}]


def test_heatmap_counts_every_request_once(grafana: Grafana) -> None:
    panel = _panel("Latency heatmap")
    assert panel["type"] == "heatmap" and panel["options"]["calculate"] is False
    rows = grafana.run(panel["targets"][0]["rawSql"]).to_pylist()
    bins = [c for c in rows[0] if c != "time"]
    assert bins[-1] == "+Inf" and [float(b) for b in bins[:-1]] == sorted(
        float(b) for b in bins[:-1]
    )
    counts = {
        r["time"]: r["n"]
        for r in grafana.run(
            "SELECT $__timeInterval(Timestamp) AS time, count() AS n "
            "FROM latscope_attribution FINAL WHERE $__timeFilter(Timestamp) GROUP BY time"
        ).to_pylist()
    }
    assert {r["time"]: sum(r[b] for b in bins) for r in rows} == counts
