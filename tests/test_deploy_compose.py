"""docker-compose.yml, deploy/Dockerfile and the Grafana provisioning agree with latscope itself.

No Docker engine runs in CI, so the files are parsed and checked against latscope's own settings
(``latscope.config.Settings``: field names, ``LATSCOPE_*`` variables, defaults, validation) and
subcommands (``latscope.cli.COMMANDS``).
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from latscope.cli import COMMANDS
from latscope.config import Settings, parse_hostport
from tests.serve_support import start_serve

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy/Dockerfile"
GRAFANA = ROOT / "deploy/grafana"
LATSCOPE_SERVICES = ("collector", "api")
_INTERPOLATION = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")
_DEFAULTS = {f.name: f.default for f in fields(Settings)}


def interpolate(value: str, env: dict[str, str] | None = None) -> str:
    """Compose's ``${VAR}`` / ``${VAR:-default}`` with the given (default: empty) environment."""
    env = env or {}
    return _INTERPOLATION.sub(lambda m: env.get(m.group(1)) or (m.group(2) or ""), value)


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def service(name: str) -> dict[str, Any]:
    return compose()["services"][name]


def environment(name: str) -> dict[str, str]:
    env = service(name).get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: interpolate(str(v)) for k, v in env.items()}


def published(name: str) -> dict[int, int]:
    """Container port -> host port of a service's ``ports``."""
    out = {}
    for spec in service(name).get("ports", []):
        parts = str(spec).split(":")
        out[int(parts[-1].split("/")[0])] = int(parts[-2])
    return out


def healthcheck_text(name: str) -> str:
    test = service(name)["healthcheck"]["test"]
    return " ".join(test) if isinstance(test, list) else test


def test_the_stack_has_clickhouse_schema_collector_api_prometheus_and_grafana() -> None:
    assert set(compose()["services"]) == {
        "clickhouse", "schema", "collector", "api", "prometheus", "grafana",
    }  # fmt: skip


def test_prometheus_scrapes_the_api_and_loads_the_slo_rules() -> None:
    prometheus = service("prometheus")
    mounts = {v.split(":")[1]: v.split(":")[0] for v in prometheus["volumes"]}
    folder = (ROOT / mounts["/etc/prometheus"]).resolve()
    assert folder == ROOT / "deploy/prometheus"
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    config = yaml.safe_load((folder / "prometheus.yml").read_text())
    assert config["rule_files"] == ["latscope-slo.rules.yml"]
    assert (folder / "latscope-slo.rules.yml").is_file()
    [job] = config["scrape_configs"]
    [static] = job["static_configs"]
    host, port = static["targets"][0].split(":")
    assert host == "api" and int(port) in published("api")
    assert job.get("metrics_path", "/metrics") == "/metrics"
    assert prometheus["depends_on"]["api"]["condition"] == "service_healthy"
    assert "prometheus-data" in compose()["volumes"]


def test_grafana_reaches_prometheus() -> None:
    [source] = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yaml").read_text())[
        "datasources"
    ]
    url = re.sub(r"\$(\w+)", lambda m: environment("grafana")[m.group(1)], source["url"])
    assert urlsplit(url).hostname == "prometheus"
    assert urlsplit(url).port in published("prometheus")


@pytest.mark.parametrize("name", LATSCOPE_SERVICES)
def test_latscope_services_run_a_latscope_subcommand(name: str) -> None:
    # `latscope collector` and `latscope api` run the two halves of `latscope serve` separately.
    command = service(name)["command"]
    assert command[0] in COMMANDS, f"`latscope {command[0]}` is not a subcommand"
    assert service(name)["build"] == {"context": ".", "dockerfile": "deploy/Dockerfile"}


@pytest.mark.parametrize("name", (*LATSCOPE_SERVICES, "schema"))
def test_latscope_environment_is_valid_settings(name: str) -> None:
    env = environment(name)
    known = {Settings.env_name(f.name) for f in fields(Settings)}
    latscope_vars = {k for k in env if k.startswith("LATSCOPE_")}
    assert latscope_vars <= known, latscope_vars - known
    settings = Settings.from_env(env)  # validates addresses, levels, ...
    assert urlsplit(settings.store).scheme == "http"  # the ClickHouse server, not chDB


@pytest.mark.parametrize("name", LATSCOPE_SERVICES)
def test_listen_addresses_are_published_and_health_checked(name: str) -> None:
    settings = Settings.from_env(environment(name))
    ports = published(name)
    http_host, http_port = parse_hostport(settings.http, name="http")
    assert http_host == "0.0.0.0"  # reachable from outside the container
    assert ports[http_port] == http_port
    assert f"127.0.0.1:{http_port}/healthz" in healthcheck_text(name)
    if name == "collector":
        grpc_host, grpc_port = parse_hostport(settings.otlp_grpc, name="otlp_grpc")
        assert grpc_host == "0.0.0.0"
        # Apps point their OTLP exporters at the usual ports: gRPC 4317 (latscope's default
        # port too) and HTTP 4318.
        assert grpc_port == parse_hostport(_DEFAULTS["otlp_grpc"], name="default")[1] == 4317
        assert ports[grpc_port] == 4317
        assert http_port == 4318
    else:
        assert http_port == parse_hostport(_DEFAULTS["http"], name="default")[1]


@pytest.mark.parametrize("name", (*LATSCOPE_SERVICES, "schema"))
def test_store_dsn_points_at_the_clickhouse_service(name: str) -> None:
    dsn = urlsplit(environment(name)["LATSCOPE_STORE"])
    ch = environment("clickhouse")
    assert dsn.hostname == "clickhouse"
    assert dsn.port == 8123  # ClickHouse's HTTP interface, the one clickhouse-connect speaks
    assert "8123" in healthcheck_text("clickhouse")
    assert dsn.username == ch["CLICKHOUSE_USER"]
    assert dsn.password == ch["CLICKHOUSE_PASSWORD"]
    assert dsn.path.strip("/") == ch["CLICKHOUSE_DB"]


def test_secrets_come_from_the_environment() -> None:
    raw = COMPOSE.read_text()
    assert "${CLICKHOUSE_PASSWORD:-" in raw and "${LATSCOPE_TOKEN:-}" in raw
    env = {"CLICKHOUSE_PASSWORD": "s3cret", "LATSCOPE_TOKEN": "tok"}
    for name in LATSCOPE_SERVICES:
        values = service(name)["environment"]
        assert urlsplit(interpolate(values["LATSCOPE_STORE"], env)).password == "s3cret"
        assert interpolate(values["LATSCOPE_TOKEN"], env) == "tok"


@pytest.mark.parametrize("name", LATSCOPE_SERVICES)
def test_latscope_waits_for_clickhouse_and_the_schema(name: str) -> None:
    depends = service(name)["depends_on"]
    assert depends["clickhouse"]["condition"] == "service_healthy"
    assert depends["schema"]["condition"] == "service_completed_successfully"


def test_schema_step_runs_the_init_script_the_image_ships() -> None:
    schema = service("schema")
    assert schema["restart"] == "no"
    assert schema["depends_on"]["clickhouse"]["condition"] == "service_healthy"
    script = schema["entrypoint"][-1]
    copies = [line for line in DOCKERFILE.read_text().splitlines() if line.startswith("COPY ")]
    shipped = [c for c in copies if "init_store.py" in c]
    assert shipped and shipped[0].split()[-1].rstrip("/") == str(Path(script).parent)
    for source in shipped[0].split()[1:-1]:
        assert (ROOT / source).is_file(), source


def test_clickhouse_is_health_checked_and_keeps_its_data() -> None:
    ch = service("clickhouse")
    assert ch["image"].startswith("clickhouse/clickhouse-server:")
    assert {"interval", "retries", "test"} <= set(ch["healthcheck"])
    volume = next(v for v in ch["volumes"] if v.endswith(":/var/lib/clickhouse"))
    assert volume.split(":")[0] in compose()["volumes"]


def test_grafana_gets_the_plugin_provisioning_and_dashboards() -> None:
    grafana = service("grafana")
    env = environment("grafana")
    assert "grafana-clickhouse-datasource" in env["GF_INSTALL_PLUGINS"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"]}
    assert (ROOT / mounts["/etc/grafana/provisioning"]).resolve() == GRAFANA / "provisioning"
    dashboards_dir = mounts["/var/lib/grafana/dashboards"]
    assert (ROOT / dashboards_dir).resolve() == GRAFANA / "dashboards"
    provider = yaml.safe_load((GRAFANA / "provisioning/dashboards/latscope.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    home = Path(env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"])
    assert (GRAFANA / "dashboards" / home.relative_to("/var/lib/grafana/dashboards")).is_file()
    assert grafana["depends_on"]["clickhouse"]["condition"] == "service_healthy"


def test_datasource_provisioning_reaches_clickhouse() -> None:
    [source] = yaml.safe_load((GRAFANA / "provisioning/datasources/clickhouse.yaml").read_text())[
        "datasources"
    ]
    assert source["type"] == "grafana-clickhouse-datasource"
    env = environment("grafana")
    ch = environment("clickhouse")

    def resolve(value: Any) -> str:
        # Grafana expands $VAR in provisioning files from its own environment.
        return re.sub(r"\$(\w+)", lambda m: env[m.group(1)], str(value))

    data = source["jsonData"]
    assert resolve(data["host"]) == "clickhouse"
    assert resolve(data["port"]) == "8123" and data["protocol"] == "http"
    assert resolve(data["username"]) == ch["CLICKHOUSE_USER"]
    assert resolve(data["defaultDatabase"]) == ch["CLICKHOUSE_DB"]
    assert resolve(source["secureJsonData"]["password"]) == ch["CLICKHOUSE_PASSWORD"]


def test_dashboard_uses_the_provisioned_datasources_everywhere() -> None:
    sources = {
        s["uid"]: s
        for name in ("clickhouse", "prometheus")
        for s in yaml.safe_load((GRAFANA / f"provisioning/datasources/{name}.yaml").read_text())[
            "datasources"
        ]
    }
    board = json.loads((GRAFANA / "dashboards/latscope.json").read_text())
    targets = [t for p in board["panels"] for t in p.get("targets", [])]
    variables = [v for v in board["templating"]["list"] if v["type"] == "query"]
    assert targets and variables
    for item in [*targets, *variables]:
        assert item["datasource"]["type"] == sources[item["datasource"]["uid"]]["type"]
    for t in targets:  # SQL for ClickHouse, PromQL for Prometheus (the SLO alerts' panels)
        assert ("expr" if t["datasource"]["type"] == "prometheus" else "rawSql") in t
    assert {sources[t["datasource"]["uid"]]["type"] for t in targets} == {
        "grafana-clickhouse-datasource", "prometheus",
    }  # fmt: skip
    names = {v["name"] for v in board["templating"]["list"]}
    for t in targets:
        used = set(re.findall(r"\$\{(\w+)|\$(?!__)(\w+)", t.get("rawSql") or t["expr"]))
        used = {a or b for a, b in used}
        assert used <= names, used - names
    types = {p["type"] for p in board["panels"]}
    assert {"timeseries", "barchart", "traces", "table", "stat"} <= types


# -- the image ------------------------------------------------------------------------------------


def dockerfile_stages() -> list[list[str]]:
    stages: list[list[str]] = []
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def test_image_is_multi_stage_and_installs_the_package_from_its_own_files() -> None:
    build = dockerfile_stages()[0]
    assert len(dockerfile_stages()) >= 2
    # The image runs the collector and API: the package with its server extra.
    assert any(re.search(r'pip install "\.\[server\]"( |$)', line) for line in build)
    for line in build:
        if line.startswith("COPY "):
            for source in shlex.split(line)[1:-1]:
                assert (ROOT / source).exists(), source
    assert any(shlex.split(line)[1] == "." for line in build if line.startswith("COPY "))


def dockerignored(path: str) -> bool:
    """Whether .dockerignore keeps ``path`` (relative to the repository root) out of the context."""
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    parts = Path(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(
        fnmatch.fnmatch(prefix, pattern) or fnmatch.fnmatch(prefix, pattern.removeprefix("**/"))
        for pattern in patterns
        for prefix in prefixes
    )


def test_build_context_holds_every_file_the_package_is_built_from() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_dirs = project["tool"]["setuptools"]["package-dir"].values()
    needed = ["pyproject.toml", project["project"]["readme"], *package_dirs]
    needed += ["deploy/init_store.py", "deploy/clickhouse/cluster/retention.sql"]
    for path in needed:
        assert (ROOT / path).exists(), path
        assert not dockerignored(path), f".dockerignore drops {path}, which the image needs"
    assert dockerignored("tests/test_deploy_compose.py") and dockerignored(".venv/bin/python")


def test_runtime_stage_copies_the_environment_and_installs_nothing() -> None:
    runtime = dockerfile_stages()[-1]
    assert any(line.startswith("COPY --from=build /opt/latscope ") for line in runtime)
    assert not any("pip install" in line for line in runtime)  # no build tools at runtime


def test_image_runs_as_a_non_root_user() -> None:
    runtime = dockerfile_stages()[-1]
    users = [line.split()[1] for line in runtime if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0", "0:0")
    assert any("useradd" in line and users[-1] in line for line in runtime)


def test_image_defaults_are_valid_settings_and_one_image_serves_every_role() -> None:
    runtime = dockerfile_stages()[-1]
    env_line = " ".join(line[4:] for line in runtime if line.startswith("ENV "))
    env = dict(item.split("=", 1) for item in shlex.split(env_line))
    settings = Settings.from_env({k: v for k, v in env.items() if k.startswith("LATSCOPE_")})
    exposed = {int(p) for line in runtime if line.startswith("EXPOSE ") for p in line.split()[1:]}
    assert {parse_hostport(settings.otlp_grpc, name="grpc")[1],
            parse_hostport(settings.http, name="http")[1]} == exposed  # fmt: skip
    entry = [line for line in runtime if line.startswith("ENTRYPOINT ")]
    cmd = [line for line in runtime if line.startswith("CMD ")]
    assert json.loads(entry[-1].split(None, 1)[1]) == ["latscope"]
    assert json.loads(cmd[-1].split(None, 1)[1])[0] in COMMANDS
    assert any(line.startswith("HEALTHCHECK ") and "/healthz" in line for line in runtime)
    # compose reuses this one image for each role
    images = {service(n)["image"] for n in (*LATSCOPE_SERVICES, "schema")}
    assert len(images) == 1


@pytest.mark.subprocess
def test_image_healthcheck_passes_on_a_running_latscope_and_fails_without_one(
    tmp_path: Path,
) -> None:
    line = next(x for x in dockerfile_stages()[-1] if x.startswith("HEALTHCHECK "))
    command = json.loads(line[line.index("CMD ") + 4 :])
    assert command[0] == "python"
    server = start_serve(tmp_path / "store")
    try:
        http = server.http.removeprefix("http://")
        ok = subprocess.run([sys.executable, *command[1:]], env={"LATSCOPE_HTTP": http}, timeout=30)
    finally:
        server.stop()
    down = subprocess.run(
        [sys.executable, *command[1:]],
        env={"LATSCOPE_HTTP": http},
        capture_output=True,
        timeout=30,
    )
    assert ok.returncode == 0
    assert down.returncode != 0


@pytest.mark.parametrize("name", ["collector", "api"])
def test_compose_python_healthchecks_compile(name: str) -> None:
    test = service(name)["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    compile(test[3], f"{name} healthcheck", "exec")
