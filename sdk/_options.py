"""Option groups for ``configure()`` and the one place environment variables are read.

Precedence: an argument to ``configure()`` wins over ``LATSCOPE_*``, which wins over ``OTEL_*``,
which wins over the default.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_ENDPOINT = "http://127.0.0.1:4317"


@dataclass(frozen=True)
class ExportOptions:
    """Where and how spans (and GPU samples) are sent."""

    endpoint: str = DEFAULT_ENDPOINT
    """OTLP/gRPC endpoint of the latscope collector (``host:port`` or ``http(s)://host:port``)."""
    token: str | None = None
    """Bearer token sent as ``authorization: Bearer ...`` when the collector requires one."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """Extra gRPC metadata (``OTEL_EXPORTER_OTLP_HEADERS``)."""
    insecure: bool | None = None
    """Plaintext gRPC; None means "plaintext unless the endpoint says https"."""
    certificate: str | None = None
    """PEM file of the CA that signed the collector's certificate (TLS); None: system roots."""
    timeout_s: float = 10.0
    """Upper bound on one export, retries included; the app never waits for it."""
    max_queue_size: int = 4096
    """Ended spans waiting for export; beyond it spans are dropped and counted."""
    max_batch_size: int = 512
    """Spans per export request."""
    schedule_delay_s: float = 1.0
    """How often the exporter thread sends what is queued."""


@dataclass(frozen=True)
class GpuOptions:
    """NVML GPU figures per prefill/decode phase and optional periodic samples."""

    enabled: bool | None = None
    """True: on (still off, with one info line, when NVML is missing); False: off; None: auto."""
    sample_hz: float = 0.0
    """Periodic GPU samples exported as OTLP gauges, per second; 0 turns them off."""
    devices: tuple[str, ...] | None = None
    """GPU indices or UUIDs to watch; None means ``CUDA_VISIBLE_DEVICES``, else every GPU."""
    nvml: Any = None
    """A module with pynvml's interface; None imports ``pynvml`` (nvidia-ml-py)."""


@dataclass(frozen=True)
class Options:
    """Everything ``configure()`` settled on."""

    service_name: str = "unknown_service"
    export: ExportOptions = field(default_factory=ExportOptions)
    gpu: GpuOptions = field(default_factory=GpuOptions)
    disabled: bool = False
    clock: Callable[[], int] | None = None
    max_tokens_per_span: int = 16384
    metrics: bool = True
    """The GenAI semantic conventions' histograms (``gen_ai.server.*``, ``gen_ai.client.*``)."""
    metrics_interval_s: float = 60.0
    """How often the metrics are exported (``OTEL_METRIC_EXPORT_INTERVAL``, in ms there)."""


def grpc_target(exp: ExportOptions) -> tuple[str, bool]:
    """(host:port, insecure) of the collector."""
    endpoint = exp.endpoint
    insecure = exp.insecure
    if "://" in endpoint:
        scheme, _, rest = endpoint.partition("://")
        if insecure is None:
            insecure = scheme.lower() != "https"
        endpoint = rest.rstrip("/")
    return endpoint, True if insecure is None else insecure


def grpc_headers(exp: ExportOptions) -> dict[str, str]:
    headers = {k.lower(): v for k, v in exp.headers.items()}
    if exp.token:
        headers["authorization"] = f"Bearer {exp.token}"
    return headers


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def parse_headers(value: str) -> dict[str, str]:
    """``OTEL_EXPORTER_OTLP_HEADERS`` format: comma-separated, URL-encoded ``key=value`` pairs."""
    headers = {}
    for item in value.split(","):
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(
                f"bad header item {item!r}: write OTEL_EXPORTER_OTLP_HEADERS as k1=v1,k2=v2"
            )
        headers[urllib.parse.unquote(key.strip()).lower()] = urllib.parse.unquote(val.strip())
    return headers


def parse_devices(value: str) -> tuple[str, ...]:
    return tuple(d.strip() for d in value.split(",") if d.strip())


def from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Settings found in the environment, as ``configure()`` keyword arguments."""
    env = os.environ if environ is None else environ
    out: dict[str, Any] = {}

    def first(*names: str) -> str | None:
        for name in names:
            value = env.get(name)
            if value is not None and value.strip():
                return value.strip()
        return None

    if v := first("LATSCOPE_SERVICE_NAME", "OTEL_SERVICE_NAME"):
        out["service_name"] = v
    if v := first(
        "LATSCOPE_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"
    ):
        out["endpoint"] = v
    if v := first("LATSCOPE_TOKEN"):
        out["token"] = v
    if v := first("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"):
        out["headers"] = parse_headers(v)
    if v := first("LATSCOPE_INSECURE", "OTEL_EXPORTER_OTLP_INSECURE"):
        out["insecure"] = _truthy(v)
    if v := first("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE"):
        out["certificate"] = v
    if v := first("LATSCOPE_SDK_DISABLED", "OTEL_SDK_DISABLED"):
        out["disabled"] = _truthy(v)
    if v := first("LATSCOPE_EXPORT_TIMEOUT_S"):
        out["export_timeout_s"] = float(v)
    if v := first("LATSCOPE_GPU"):
        out["gpu"] = None if v.lower() == "auto" else _truthy(v)
    if v := first("LATSCOPE_GPU_SAMPLE_HZ"):
        out["gpu_sample_hz"] = float(v)
    if v := first("LATSCOPE_GPU_DEVICES", "CUDA_VISIBLE_DEVICES"):
        out["gpu_devices"] = parse_devices(v)
    if v := first("LATSCOPE_METRICS"):
        out["metrics"] = _truthy(v)
    elif (v := first("OTEL_METRICS_EXPORTER")) and v.lower() == "none":
        out["metrics"] = False
    if v := first("OTEL_METRIC_EXPORT_INTERVAL"):
        out["metrics_interval_s"] = float(v) / 1000
    return out
