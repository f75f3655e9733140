"""The query commands as a person reads them: laid out for an 80-column terminal without cutting
figures, bars that tell the buckets apart without colour, evidence rendered as the rest is, and
the cold-start and heatmap commands."""

from __future__ import annotations

import json
import re
from collections import deque
from datetime import UTC, datetime
from typing import Any

import pytest
from rich.table import Table

from latscope.api.schemas import Why, Window
from latscope.cli import main
from latscope.cmd import _render as r
from latscope.cmd import diagnose, top, why
from latscope.semconv import BUCKETS

#: A figure cut short by rich: a number (a share, a rate) ending in an ellipsis. Names and ids
#: may be cut (a UUID beyond its column).
CUT_FIGURE = re.compile(r"(?:^|\s)[-+]?[\d.,]+[%x]?…", re.M)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return code, out


@pytest.fixture
def columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("FORCE_COLOR", raising=False)


@pytest.mark.subprocess
@pytest.mark.parametrize(
    "argv",
    [
        ["report", "--since", "2h", "--group-by", "model"],
        ["tail", "--since", "2h"],
        ["compare", "--before-since", "3h", "--before-until", "30m"],
        ["slo"],
        ["why", "--since", "2h"],
        ["diagnose", "--since", "2h"],
        ["coldstart", "--since", "2h"],
        ["heatmap", "--since", "2h"],
        ["timeline", "--since", "2h", "--table"],
    ],
    ids=lambda argv: argv[0],
)
def test_every_table_fits_80_columns_without_cutting_a_figure(
    served, capsys, columns, argv
) -> None:
    server, _ = served
    _, out = run(capsys, *argv, "--url", server.http)
    assert max(len(line) for line in out.splitlines()) <= 80
    assert not CUT_FIGURE.search(out), out


@pytest.mark.subprocess
def test_slo_at_80_columns_keeps_every_figure(served, capsys, columns) -> None:
    server, _ = served
    # Objectives every request misses: every alert fires, the widest table slo prints.
    objectives = ("--objective", "ttft:1:0.999:30", "--objective", "e2e:10000:0.9999:30")
    _, raw = run(capsys, "slo", "--url", server.http, *objectives, "--json")
    body = json.loads(raw)
    assert body["objectives"][0]["alerts"] == {"fast_burn": True, "slow_burn": True, "ticket": True}
    _, out = run(capsys, "slo", "--url", server.http, *objectives)
    for o in body["objectives"]:
        words = o["name"].split()  # wrapped, not cut
        assert all(re.search(rf"(^|\s){re.escape(w)}(\s|$)", out, re.M) for w in words), out
        assert f" {o['total']} " in out
        assert r.pct(o["budget_left"]) in out


def test_fit_drops_the_named_columns_in_order_only_when_wrapping_is_not_enough() -> None:
    def table() -> Table:
        t = Table(box=None, pad_edge=False)
        t.add_column("name")  # wraps
        for col in ("a", "b", "c"):
            t.add_column(col, no_wrap=True, justify="right")
        t.add_row("a fairly long service name", "1234567890", "1234567890", "1234567890")
        return t

    wide = r.fit(table(), drop=("b", "a"), width=80)
    assert [c.header for c in wide.columns] == ["name", "a", "b", "c"]
    wrapped = r.fit(table(), drop=("b", "a"), width=45)  # the name wraps, every figure stays
    assert [c.header for c in wrapped.columns] == ["name", "a", "b", "c"]
    narrow = r.fit(table(), drop=("b", "a"), width=30)
    assert [c.header for c in narrow.columns] == ["name", "c"]
    out = r.console()
    with out.capture() as captured:
        out.print(narrow)
    assert "1234567890" in captured.get() and "…" not in captured.get()


@pytest.mark.subprocess
def test_without_colour_each_bucket_has_its_own_glyph(served, capsys, columns) -> None:
    server, _ = served
    _, out = run(capsys, "report", "--url", server.http, "--group-by", "model")
    assert len(set(r.GLYPHS.values())) == len(BUCKETS)
    for bucket, glyph in r.GLYPHS.items():
        assert f"{glyph} {bucket}" in out  # the legend
    bar = next(line for line in out.splitlines() if line.startswith("all "))
    assert "█" not in out
    assert len({c for c in bar if c in r.GLYPHS.values()}) >= 3  # several buckets, told apart


@pytest.mark.subprocess
def test_in_colour_bars_are_blocks(served, capsys, monkeypatch) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")
    server, _ = served
    _, out = run(capsys, "report", "--url", server.http)
    assert "█" in out and "~ network" not in out


def _req(trace: str, start_s: float, e2e_ms: float) -> dict[str, Any]:
    buckets = dict.fromkeys(BUCKETS, 0.0) | {"decode": e2e_ms}
    return {
        "request_id": f"{trace * 32}-{trace * 16}",
        "trace_id": trace * 32,
        "service": "llm",
        "model": "m",
        "e2e_ms": e2e_ms,
        "ttft_ms": None,
        "buckets_ms": buckets,
        "start_unix_nano": int(start_s * 1e9),
    }


def test_top_lists_the_latest_requests_by_when_they_ended() -> None:
    # One poll's batch in trace id order: "a" ended last, "c" first.
    recent = deque([_req("a", 10.0, 900), _req("b", 10.0, 500), _req("c", 10.2, 100)])
    out = r.console()
    with out.capture() as captured:
        out.print(top._screen(recent, 3, "test"))
    text = captured.get()
    order = [text.index(t * 32) for t in ("a", "b", "c")]
    assert order == sorted(order)


def test_diagnose_evidence_reads_as_the_rest_of_the_output() -> None:
    evidence = {
        "replicas": ["llm/llm-2", "llm/llm-3"],
        "since_ns": 1_795_886_114_694_270_283,
        "warmup_extra_by_bucket_ms": {"network": 9.43, "decode": 801.0, "queue": 0.0},
        "warmup_extra_ms": 861.4,
        "warmup_extra_share": 0.25,
    }
    text = ", ".join(f"{diagnose._label(k)} {diagnose._figure(k, v)}" for k, v in evidence.items())
    when = datetime.fromtimestamp(1_795_886_114.694, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    assert text == (
        f"replicas llm/llm-2, llm/llm-3, since {when}, warmup_extra_by_bucket_ms "
        "(decode 801.0 ms, network 9.4 ms), warmup_extra_ms 861.4 ms, warmup_extra_share 25.0%"
    )
    assert "{" not in text and "[" not in text


def _why_body(selected: int, others: int, dimensions: list[dict[str, Any]]) -> Why:
    means = {"e2e_mean_ms": 500.0, "buckets_ms": dict.fromkeys(BUCKETS, 50.0)}
    selection = {"kind": "percentile", "metric": "e2e", "threshold_ms": None}
    return Why.model_validate({
        "window": Window.of(0, 3600 * 10**9),
        "selection": {**means, **selection, "count": selected, "description": "e2e above p99"},
        "baseline": {**means, "count": others, "description": "the others"},
        "extra_e2e_ms": 100.0,
        "dominant": "queue",
        "extra_buckets_ms": dict.fromkeys(BUCKETS, 10.0),
        "top": None,
        "dimensions": dimensions,
        "examples": [],
    })  # fmt: skip


def test_why_says_when_there_are_too_few_requests(capsys) -> None:
    why.render(_why_body(2, 1, []))
    out = capsys.readouterr().out
    assert "no dimension sets these 2 requests apart from the other 1" in out
    assert "too few" in out and "dimension  " not in out  # no empty table header
    value = {
        "value": "a", "in_count": 3, "out_count": 0, "in_share": 1.0, "out_share": 0.0,
        "difference": 1.0, "in_e2e_mean_ms": 550.0, "out_e2e_mean_ms": None, "extra_ms": 50.0,
        "buckets_ms": dict.fromkeys(BUCKETS, 5.0), "dominant": "queue", "extra_share": 1.0,
    }  # fmt: skip
    dimension = {"dimension": "model", "score": 1.0, "values_seen": 1, "values": [value]}
    why.render(_why_body(3, 40, [dimension]))
    out = capsys.readouterr().out
    assert "only 3 against 40 requests: too few" in out and "model" in out


@pytest.mark.subprocess
def test_coldstart_and_heatmap_commands_answer_as_the_api(served, capsys, columns) -> None:
    server, _ = served
    _, raw = run(capsys, "coldstart", "--url", server.http, "--since", "2h", "--json")
    body = json.loads(raw)
    _, out = run(capsys, "coldstart", "--url", server.http, "--since", "2h")
    assert f"{body['appeared']} of {body['replica_count']} replicas appeared" in out
    _, raw = run(capsys, "heatmap", "--url", server.http, "--since", "2h", "--json")
    heat = json.loads(raw)
    assert heat["count"] > 0
    _, out = run(capsys, "heatmap", "--url", server.http, "--since", "2h")
    assert f"{heat['count']} requests" in out
    rows = [line for line in out.splitlines() if "│" in line]
    assert sum(int(line.rsplit(" ", 1)[1]) for line in rows) + _hidden(out) == heat["count"] - sum(
        heat["zero_counts"]
    )


def _hidden(out: str) -> int:
    found = re.search(r"(\d+) requests in rows not shown", out)
    return int(found.group(1)) if found else 0
