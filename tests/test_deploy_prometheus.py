"""The SLO alerts (deploy/prometheus/): promtool's unit tests of the rules, the rules against the
answers' own alerts, and a real Prometheus scraping a real ``latscope serve`` whose store holds a
planted burn (tests/planted.py, ``queue_burn``): the page fires, names the bucket and links to the
web page's window; the Grafana dashboard's Prometheus panels show it.

Debian's prometheus package provides promtool and the server; scripts/test installs it.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import yaml

from latscope.semconv import BUCKETS
from latscope.windows import ALERTS, BURN_WINDOWS_S
from tests.planted import BURN_SERVICE, store_dir
from tests.serve_support import Server, start_serve

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "deploy/prometheus"
RULES = FOLDER / "latscope-slo.rules.yml"
DASHBOARD = ROOT / "deploy/grafana/dashboards/latscope.json"
#: The rules' alert for each of the answers' alerts (windows.ALERTS).
ALERT_NAMES = {
    "fast_burn": "LatscopeSloFastBurn",
    "slow_burn": "LatscopeSloSlowBurn",
    "ticket": "LatscopeSloBudgetBurn",
}
BURNING = f"ttft:500:0.99:30@{BURN_SERVICE}"
CALM = "e2e:100000:0.99:30"
PAGE_URL = "https://latscope.example:8443"


def _tool(name: str) -> str:
    path = shutil.which(name) or f"/usr/bin/{name}"
    if not Path(path).exists():
        pytest.fail(f"{name} is missing: apt-get install -y prometheus (see scripts/test)")
    return path


def _rules() -> list[dict[str, Any]]:
    return [
        rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    ]


def test_promtool_checks_the_config_and_passes_the_rules_unit_tests() -> None:
    promtool = _tool("promtool")
    checked = subprocess.run(
        [promtool, "check", "config", "prometheus.yml"],
        cwd=FOLDER, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [promtool, "test", "rules", "latscope-slo.test.yml"],
        cwd=FOLDER, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_the_rules_are_the_answers_alerts() -> None:
    """Each alert of /v1/slo (windows.ALERTS) is one rule: its long and short windows above the same
    burn rate, and every window a rule names is one latscope serves."""
    rules = {r["alert"]: r for r in _rules()}
    assert set(rules) == set(ALERT_NAMES.values())
    for name, (long, short, limit) in ALERTS.items():
        expr = " ".join(rules[ALERT_NAMES[name]]["expr"].split())
        compared = re.findall(r'latscope_slo_burn_rate\{window="(\w+)"\} > ([0-9.]+)', expr)
        assert compared == [(long, f"{limit:g}"), (short, f"{limit:g}")], name
        annotations = rules[ALERT_NAMES[name]]["annotations"]
        assert f'window=\\"{long}\\"' in annotations["bucket"]
        assert f'query "time() - {BURN_WINDOWS_S[long]}"' in annotations["page"]


def _exposed(text: str) -> dict[str, list[dict[str, str]]]:
    """Metric name -> the label sets of its samples, from a Prometheus text exposition."""
    out: dict[str, list[dict[str, str]]] = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+)(?:\{(.*)\})? ", line)
        if m and not line.startswith("#"):
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            out.setdefault(m.group(1), []).append(labels)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def burning(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``latscope serve`` over the planted burn, evaluating two objectives every second."""
    store = store_dir(time.time_ns(), "burn")
    server = start_serve(store, "--slo-objectives", f"{BURNING},{CALM}", "--slo-interval-s", "1")
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(store.parent, ignore_errors=True)


def _metrics(server: Server) -> dict[str, list[dict[str, str]]]:
    deadline = time.monotonic() + 60
    while True:
        exposed = _exposed(httpx.get(server.url("/metrics"), timeout=10).text)
        if "latscope_slo_burn_rate" in exposed or time.monotonic() > deadline:
            return exposed
        time.sleep(0.2)


def test_the_rules_read_what_latscope_serves(burning: Server) -> None:
    """Every metric and label the rules name is on /metrics of a running latscope, with the
    windows and buckets the rules ask for."""
    exposed = _metrics(burning)
    rules_text = RULES.read_text()
    used = set(re.findall(r"\b(latscope_\w+)\{", rules_text))
    assert used == {"latscope_slo_burn_rate", "latscope_slo_bad_extra_seconds"}
    for name in used:
        series = [s for s in exposed[name] if s["objective"] == BURNING]
        assert {s["window"] for s in series} == set(BURN_WINDOWS_S), name
        for s in series:
            assert (s["metric"], s["service"]) == ("ttft", BURN_SERVICE)
    extra = [s for s in exposed["latscope_slo_bad_extra_seconds"] if s["objective"] == BURNING]
    assert {s["bucket"] for s in extra} == set(BUCKETS)
    # Labels the rules join or print, beside those of the scrape (instance, latscope_url).
    named = set(re.findall(r"\$labels\.(\w+)", rules_text)) | set(
        re.findall(r"on \(([\w, ]+)\)", rules_text)[0].replace(" ", "").split(",")
    )
    assert named - {"instance", "latscope_url"} <= set(exposed["latscope_slo_burn_rate"][0])


@pytest.fixture(scope="module")
def prometheus(burning: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Prometheus scraping ``burning`` every second with the rules file, as the compose
    stack's (deploy/prometheus/prometheus.yml) does every 30 s."""
    work = tmp_path_factory.mktemp("prometheus")
    shutil.copy(RULES, work / RULES.name)
    config = yaml.safe_load((FOLDER / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    [static] = config["scrape_configs"][0]["static_configs"]
    static["targets"] = [burning.http.removeprefix("http://")]
    static["labels"]["latscope_url"] = PAGE_URL
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    address = f"127.0.0.1:{_free_port()}"
    log = (work / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [_tool("prometheus"), f"--config.file={work / 'prometheus.yml'}",
         f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address={address}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://{address}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, (work / "prometheus.log").read_text()
            assert time.monotonic() < deadline, "prometheus did not get ready"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def _firing(url: str, count: int) -> list[dict[str, Any]]:
    """The latscope alerts Prometheus holds once ``count`` of them fire (60 s at most)."""
    deadline = time.monotonic() + 60
    while True:
        alerts = httpx.get(f"{url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
        ours = [a for a in alerts if a["labels"]["alertname"].startswith("LatscopeSlo")]
        if sum(a["state"] == "firing" for a in ours) >= count or time.monotonic() > deadline:
            return ours
        time.sleep(0.5)


def test_prometheus_pages_on_the_planted_burn_and_names_the_bucket(prometheus: str) -> None:
    alerts = _firing(prometheus, len(ALERTS))
    by_name = {a["labels"]["alertname"]: a for a in alerts if a["state"] == "firing"}
    # The planted hour burns ~35x over 1 h and 5 m, ~25x over 6 h and 30 m, ~5x over 3 days:
    # every alert fires, for the burning objective only.
    assert set(by_name) == set(ALERT_NAMES.values())
    assert {a["labels"]["objective"] for a in alerts} == {BURNING}
    page = by_name["LatscopeSloFastBurn"]
    assert page["labels"]["severity"] == "page"
    assert page["annotations"]["bucket"] == "queue"  # the planted 1-2 s of extra queueing
    assert "spent most of their extra time in queue (+1." in page["annotations"]["description"]
    link = urlsplit(page["annotations"]["page"])
    assert f"{link.scheme}://{link.netloc}" == PAGE_URL and link.path == "/"
    window = parse_qs(link.fragment)
    since = time.mktime(time.strptime(window["since"][0], "%Y-%m-%dT%H:%M:%SZ"))
    until = time.mktime(time.strptime(window["until"][0], "%Y-%m-%dT%H:%M:%SZ"))
    assert until - since == 3600
    assert window["service"] == [BURN_SERVICE]
    assert by_name["LatscopeSloBudgetBurn"]["labels"]["severity"] == "ticket"


def test_the_dashboard_shows_the_alerts_state(prometheus: str) -> None:
    """The dashboard's Prometheus panels, queried as Grafana does (instant for the table, a
    range for the time series), show the firing alerts and the burn rates behind them."""
    _firing(prometheus, len(ALERTS))
    panels = [
        p
        for p in json.loads(DASHBOARD.read_text())["panels"]
        if p.get("datasource", {}).get("type") == "prometheus"
    ]
    assert {p["type"] for p in panels} == {"table", "timeseries"}
    for panel in panels:
        [target] = panel["targets"]
        if target.get("instant"):
            body = httpx.get(
                f"{prometheus}/api/v1/query", params={"query": target["expr"]}, timeout=10
            ).json()
        else:
            now = time.time()
            body = httpx.get(
                f"{prometheus}/api/v1/query_range",
                params={"query": target["expr"], "start": now - 300, "end": now, "step": 1},
                timeout=10,
            ).json()
        series = [r["metric"] for r in body["data"]["result"]]
        assert series, panel["title"]
        if panel["type"] == "table":
            firing = {s["alertname"] for s in series if s["alertstate"] == "firing"}
            assert firing == set(ALERT_NAMES.values())
        else:
            assert {s["objective"] for s in series} == {BURNING, CALM}
