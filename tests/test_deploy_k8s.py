"""deploy/k8s/latscope.yaml agrees with latscope's settings, subcommands and image."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml

from latscope.cli import COMMANDS
from latscope.config import Settings, parse_hostport

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = ROOT / "deploy/k8s/latscope.yaml"


def documents() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(MANIFESTS.read_text()) if d]


def deployment(component: str) -> dict[str, Any]:
    [dep] = [
        d
        for d in documents()
        if d["kind"] == "Deployment"
        and d["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    return dep


def container(component: str) -> dict[str, Any]:
    [c] = deployment(component)["spec"]["template"]["spec"]["containers"]
    return c


@pytest.mark.parametrize("component", ["collector", "api"])
def test_containers_run_a_latscope_subcommand(component: str) -> None:
    c = container(component)
    assert c["args"][0] in COMMANDS, f"`latscope {c['args'][0]}` is not a subcommand"


@pytest.mark.parametrize("component", ["collector", "api"])
def test_container_settings_ports_and_probes_agree(component: str) -> None:
    c = container(component)
    known = {Settings.env_name(f.name) for f in fields(Settings)}
    names = {e["name"] for e in c["env"]}
    assert names <= known, names - known
    assert "LATSCOPE_STORE" in names  # from the secret: never the embedded default
    values = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    settings = Settings.from_env(values)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    http_port = parse_hostport(settings.http, name="http")[1]
    assert http_port in ports.values()
    for probe in ("readinessProbe", "livenessProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] == "/healthz" and ports[get["port"]] == http_port
    if component == "collector":
        assert ports["otlp-grpc"] == parse_hostport(settings.otlp_grpc, name="grpc")[1]


@pytest.mark.parametrize("component", ["collector", "api"])
def test_pods_run_as_the_image_user(component: str) -> None:
    uid = int(re.search(r"^ARG UID=(\d+)$", (ROOT / "deploy/Dockerfile").read_text(), re.M)[1])
    pod = deployment(component)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == uid


def test_services_select_the_deployments_and_expose_their_ports() -> None:
    services = [d for d in documents() if d["kind"] == "Service"]
    assert services
    for svc in services:
        component = svc["spec"]["selector"]["app.kubernetes.io/component"]
        labels = deployment(component)["spec"]["template"]["metadata"]["labels"]
        assert svc["spec"]["selector"].items() <= labels.items()
        named = {p["name"] for p in container(component)["ports"]}
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= named
    collector = next(s for s in services if s["metadata"]["name"] == "latscope-collector")
    assert collector["spec"]["clusterIP"] == "None"  # per-request balancing needs pod IPs


def test_grace_period_outlasts_the_shutdown_grace() -> None:
    pod = deployment("collector")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in container("collector")["env"]}
    grace = Settings.from_env({"LATSCOPE_SHUTDOWN_GRACE_S": env["LATSCOPE_SHUTDOWN_GRACE_S"]})
    assert pod["terminationGracePeriodSeconds"] > grace.shutdown_grace_s
