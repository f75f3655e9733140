"""``latscope export --parquet``: attributed requests as a Parquet file, through a running API
and from the store itself, the same rows both ways."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import polars as pl
import pytest

from latscope.cli import main
from latscope.semconv import BUCKETS
from tests.surfaces import dataset_store

pytestmark = pytest.mark.subprocess

BUCKET_COLUMNS = [f"{b.capitalize()}Ns" for b in BUCKETS]


def _export(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["export", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_export_through_the_api_holds_every_request(served, capsys, tmp_path: Path) -> None:
    server, specs = served
    path = tmp_path / "requests.parquet"
    code, out, err = _export(capsys, "--parquet", str(path), "--url", server.url(""),
                             "--since", "2h")  # fmt: skip
    assert code == 0, err
    frame = pl.read_parquet(path)
    assert f"{frame.height} requests written to {path}" in out
    summary = httpx.get(server.url("/v1/attribution/summary"), params={"since": "2h"}).json()
    assert frame.height == summary["count"] > 0
    assert {s.trace_id for s in specs} <= set(frame["TraceId"])
    # The seven buckets add up to the end-to-end time, row by row, as stored.
    assert (frame.select(pl.sum_horizontal(BUCKET_COLUMNS)).to_series() == frame["E2eNs"]).all()
    assert frame["Timestamp"].is_sorted()

    code, _, err = _export(capsys, "--parquet", str(path), "--url", server.url(""),
                           "--since", "2h", "--limit", "5")  # fmt: skip
    assert code == 0 and pl.read_parquet(path).height == 5
    assert "the limit cut the window short" in err


def test_export_bad_input_gets_a_clear_message(served, capsys, tmp_path: Path) -> None:
    server, _ = served
    path = tmp_path / "x.parquet"
    code, _, err = _export(capsys, "--parquet", str(path), "--url", server.url(""),
                           "--since", "yesterday")  # fmt: skip
    assert code == 2 and "since: expected RFC 3339" in err and "(invalid_time)" in err
    assert not path.exists()
    code, _, err = _export(capsys, "--parquet", str(tmp_path / "no" / "x.parquet"))
    assert code == 2 and "no directory" in err
    response = httpx.get(server.url("/v1/export/requests"), params={"limit": 0})
    assert response.status_code == 422
    response = httpx.get(server.url("/v1/export/requests"), params={"since": "2h"})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/vnd.apache.parquet"
    assert int(response.headers["x-latscope-rows"]) > 0


def test_export_from_the_store_equals_the_api_export(served, tmp_path: Path) -> None:
    server, _ = served
    via_api = tmp_path / "api.parquet"
    body = httpx.get(server.url("/v1/export/requests"), params={"since": "2h"})
    via_api.write_bytes(body.content)
    # An embedded store belongs to one process at a time: the dataset's own store, of which the
    # server serves a copy.
    built, _ = dataset_store()
    direct = tmp_path / "store.parquet"
    done = subprocess.run(
        [sys.executable, "-m", "latscope.cli", "export", "--parquet", str(direct),
         "--store", f"chdb://{built}", "--since", "2h"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert pl.read_parquet(direct).equals(pl.read_parquet(via_api))
