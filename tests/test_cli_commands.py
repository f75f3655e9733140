"""Every query command against a running ``latscope serve`` (``--url``), as JSON and as the
terminal shows it; and direct reads of the store (``--store``)."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from latscope.cli import main
from latscope.cmd import _render as r
from tests.serve_support import Server
from tests.surfaces import dataset_store


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def api(server: Server, path: str, **params: object) -> dict:
    return httpx.get(server.url(path), params=params, timeout=30).json()


def _drop_window(body: dict) -> dict:
    # Relative windows ("1h") move with the clock between two calls; the rest must agree.
    return {k: v for k, v in body.items() if k not in ("window", "now_ns", "at")}


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("argv", "path", "params"),
    [
        (["report", "--since", "2h", "--until", "1m"], "/v1/attribution/summary",
         {"since": "2h", "until": "1m", "group_by": "model"}),
        (["tail", "--since", "2h", "--until", "1m", "--percentile", "90"],
         "/v1/attribution/tail", {"since": "2h", "until": "1m", "percentile": 90}),
        (["diagnose", "--since", "2h", "--until", "1m"], "/v1/attribution/diagnose",
         {"since": "2h", "until": "1m"}),
        (["slo", "--objective", "ttft:500:0.99:30"], "/v1/slo",
         {"objective": "ttft:500:0.99:30"}),
    ],
)  # fmt: skip
def test_json_output_is_the_api_answer(served, capsys, argv, path, params) -> None:
    server, _ = served
    code, out, err = run(capsys, *argv, "--url", server.http, "--json")
    assert code == 0, err
    assert _drop_window(json.loads(out)) == _drop_window(api(server, path, **params))


@pytest.mark.subprocess
def test_report_shows_percentiles_and_budget(served, capsys) -> None:
    server, _ = served
    code, out, _ = run(capsys, "report", "--url", server.http, "--group-by", "model")
    assert code == 0
    summary = api(server, "/v1/attribution/summary")
    assert f"{summary['count']} requests" in out
    for bucket in ("network", "queue", "preprocess", "prefill", "decode", "postprocess", "other"):
        assert bucket in out
    assert "llama-3-8b" in out and "mistral-7b" in out
    assert f"{summary['buckets_ms']['prefill']['p50']:.1f} ms" in out
    assert f"{summary['buckets_ms']['decode']['share'] * 100:.1f}%" in out
    assert f"{r.GLYPHS['decode']} decode" in out  # the stacked bars' legend (piped: glyphs)


@pytest.mark.subprocess
def test_tail_and_diagnose_name_the_queue(served, capsys) -> None:
    server, _ = served
    code, out, _ = run(capsys, "tail", "--url", server.http)
    assert code == 0 and "most of the tail is queue" in out
    code, out, _ = run(capsys, "diagnose", "--url", server.http)
    assert code == 0
    assert "load exceeds capacity" in out and "cap the queue depth" in out


@pytest.mark.subprocess
def test_compare_names_the_mover(served, capsys) -> None:
    server, _ = served
    code, out, _ = run(capsys, "compare", "--url", server.http, "--json")
    body = json.loads(out)
    assert code == 0 and body["before"]["count"] == 20 and body["after"]["count"] == 41
    code, out, _ = run(capsys, "compare", "--url", server.http)
    assert f"biggest mover: {body['mover']}" in out


@pytest.mark.subprocess
def test_slo_table(served, capsys) -> None:
    server, _ = served
    code, out, _ = run(capsys, "slo", "--url", server.http, "--objective", "ttft:500:0.99:30")
    assert code == 0
    assert "ttft p99 < 500 ms" in out and "NO" in out  # the objective is missed


@pytest.mark.subprocess
def test_explain_shows_buckets_waterfall_and_stall(served, capsys) -> None:
    server, specs = served
    spec = next(s for s in specs if s.model == "llama-3-70b")
    code, out, _ = run(capsys, "explain", spec.trace_id, "--url", server.http)
    assert code == 0
    assert spec.trace_id in out and "rag-server" in out
    for phase, (start, end) in spec.phases.items():
        assert phase in out
        assert f"{end - start:.1f}" in out
    assert "1 stall(s)" in out and "token 10" in out
    # The only llama-3-70b request of its service: no peers to rank it among.
    assert api(server, f"/v1/requests/{spec.trace_id}")["standing"]["peers"] == 0
    assert "started in the hour before it: no percentiles" in " ".join(out.split())
    peered = specs[7]  # a llama request among others of its service and model
    code, out, _ = run(capsys, "explain", peered.trace_id, "--url", server.http)
    standing = api(server, f"/v1/requests/{peered.trace_id}")["standing"]
    assert standing["peers"] > 0
    flat = " ".join(out.split())
    assert f"percentile among the {standing['peers']} requests of {peered.service}" in flat
    assert f"p{standing['percentiles']['e2e']:.1f}" in flat
    code, out, _ = run(capsys, "explain", spec.trace_id, "--url", server.http, "--json")
    assert json.loads(out) == api(server, f"/v1/requests/{spec.trace_id}")


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("argv", "message", "exit_code"),
    [
        (["explain", "ab" * 16], "no spans stored for trace", 2),
        (["explain", "xyz"], "32 hexadecimal characters", 2),
        (["report", "--since", "last tuesday"], "RFC 3339", 2),
        (["tail", "--percentile", "120"], "percentile", 2),
        (["slo", "--objective", "ttft"], "METRIC:THRESHOLD_MS:TARGET", 2),
    ],
)
def test_bad_input_gets_a_clear_message(served, capsys, argv, message, exit_code) -> None:
    server, _ = served
    code, out, err = run(capsys, *argv, "--url", server.http)
    assert code == exit_code
    assert message in err and "Traceback" not in err
    assert out == ""


def test_no_api_running_says_how_to_start_one(capsys) -> None:
    code, _, err = run(capsys, "report", "--url", "http://127.0.0.1:9")
    assert code == 1
    assert "no API at http://127.0.0.1:9" in err and "latscope serve" in err


@pytest.mark.slow
def test_top_without_a_server_says_so(capsys) -> None:
    code, _, err = run(capsys, "top", "--grpc", "127.0.0.1:9", "--duration", "5")
    assert code == 1
    assert "no latscope gRPC at 127.0.0.1:9" in err


@pytest.mark.subprocess
def test_direct_store_mode_reads_the_same_answers(served) -> None:
    """``--store`` opens the store itself, so no process may hold it: the dataset's own store,
    of which the server serves a copy."""
    server, specs = served
    expected = api(server, "/v1/attribution/summary", since="2h", until="1m")
    spec = specs[0]
    explained = api(server, f"/v1/requests/{spec.trace_id}")
    built, _ = dataset_store()
    dsn = f"chdb://{built}"
    # One process per command: an embedded store belongs to one process at a time.
    report = subprocess.run(
        [sys.executable, "-m", "latscope.cli", "report", "--store", dsn,
         "--since", "2h", "--until", "1m", "--group-by", "none", "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr
    assert _drop_window(json.loads(report.stdout)) == _drop_window(expected)
    explain = subprocess.run(
        [sys.executable, "-m", "latscope.cli", "explain", spec.trace_id, "--store", dsn, "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert explain.returncode == 0, explain.stderr
    assert json.loads(explain.stdout) == explained
