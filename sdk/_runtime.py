"""Process-wide SDK state and ``configure()`` / ``shutdown()``.

latscope keeps its own ``TracerProvider`` and never replaces the global one, so an app that set
up OpenTelemetry itself keeps its pipeline; the two share the context API, so spans nest
across them.
"""

from __future__ import annotations

import atexit
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter

from latscope.sdk import _guard
from latscope.sdk._export import BoundedBatchProcessor
from latscope.sdk._options import (
    ExportOptions,
    GpuOptions,
    Options,
    from_env,
)
from latscope.semconv import ResourceAttributes

logger = logging.getLogger("latscope.sdk")

_SCOPE = "latscope.sdk"

_START_GPU = _guard.handle_internal_errors("gpu.start")
_START_METRICS = _guard.handle_internal_errors("metrics.start")
_SHUTDOWN = _guard.handle_internal_errors("shutdown")
_FORCE_FLUSH = _guard.handle_internal_errors("force_flush")


class Runtime:
    """What the hot paths read: plain attributes, swapped as a whole by ``configure()``."""

    __slots__ = (
        "clock",
        "enabled",
        "gpu",
        "metrics",
        "options",
        "processor",
        "provider",
        "token_cap",
        "tracer",
    )

    def __init__(self) -> None:
        self.enabled = False
        self.clock: Callable[[], int] = time.time_ns
        self.tracer: trace.Tracer = trace.NoOpTracer()
        self.provider: TracerProvider | None = None
        self.processor: SpanProcessor | None = None
        self.gpu: Any = None  # latscope.sdk._gpu.GpuMonitor when NVML is up
        self.metrics: Any = None  # latscope.sdk._metrics.GenAIMetrics when metrics are on
        self.options = Options()
        self.token_cap = Options().max_tokens_per_span


RT = Runtime()
_lock = threading.Lock()
_atexit_registered = False
#: Whether ``configure()`` ran (even to disable the SDK), and whether the SDK said it had not.
_configured = False
_warned_unconfigured = False

_UNSET: Any = object()


def now() -> int | None:
    """The SDK clock, or None when it failed (a span then ends on OpenTelemetry's own clock)."""
    try:
        return RT.clock()
    except Exception:  # every span's end reads it: no ``with`` handler here (see ``_guard``)
        _guard.fault("clock")
    return None


def warn_if_unconfigured() -> None:
    """Instrumentation ran while the SDK is off: before any ``configure()``, say so once.

    An app that never calls ``configure()`` otherwise runs untraced without a word. Only the
    paths taken while the SDK is off call this; the configured hot path does not.
    """
    global _warned_unconfigured
    if _configured or _warned_unconfigured:
        return
    _warned_unconfigured = True
    logger.warning(
        "latscope SDK: instrumentation used before sdk.configure(); nothing is traced until the "
        'app calls it, e.g. sdk.configure(service_name="llm-server")'
    )


def end_span(span: trace.Span, end: int | None) -> None:
    """End ``span`` at ``end`` (OpenTelemetry's clock when None); a fault is counted."""
    try:
        span.end(end_time=end)
    except Exception:
        _guard.fault("span.end")


def configure(
    *,
    service_name: str | None = None,
    endpoint: str | None = None,
    token: str | None = None,
    headers: Mapping[str, str] | None = None,
    insecure: bool | None = None,
    gpu: bool | GpuOptions | None = None,
    gpu_sample_hz: float | None = None,
    gpu_devices: tuple[str, ...] | list[str] | None = None,
    clock: Callable[[], int] | None = None,
    export: ExportOptions | None = None,
    export_timeout_s: float | None = None,
    max_tokens_per_span: int | None = None,
    span_exporter: SpanExporter | None = None,
    metric_exporter: Any = None,
    resource_attributes: Mapping[str, Any] | None = None,
    disabled: bool | None = None,
    metrics: bool | None = None,
    metrics_interval_s: float | None = None,
) -> None:
    """Set up latscope for this process; safe to call again (the new settings replace the old).

    Arguments win over ``LATSCOPE_*`` and ``OTEL_*`` environment variables. ``clock`` returns ns
    since the epoch and stamps every time the SDK records. ``span_exporter`` replaces the OTLP
    exporter (spans then go out synchronously: meant for tests and debugging); ``metric_exporter``
    likewise replaces the OTLP metric exporter. ``metrics`` turns the GenAI semantic conventions'
    histograms on or off (``LATSCOPE_METRICS``; on by default), exported every
    ``metrics_interval_s`` (``OTEL_METRIC_EXPORT_INTERVAL``, default 60 s).

    Example::

        from latscope import sdk
        sdk.configure(service_name="llm-server", endpoint="http://127.0.0.1:4317")
    """
    if max_tokens_per_span is not None and max_tokens_per_span < 0:
        raise ValueError("max_tokens_per_span must be >= 0 (0 keeps counts but no token times)")
    if gpu_sample_hz is not None and gpu_sample_hz < 0:
        raise ValueError("gpu_sample_hz must be >= 0 (0 turns periodic GPU samples off)")
    if clock is not None and not callable(clock):
        raise ValueError("clock must be a callable returning ns since the epoch, e.g. time.time_ns")
    if gpu is not None and not isinstance(gpu, bool | GpuOptions):
        raise ValueError("gpu must be True, False, None (auto) or a GpuOptions")
    if metrics_interval_s is not None and not metrics_interval_s > 0:
        raise ValueError("metrics_interval_s must be > 0 (seconds between metric exports)")

    env = from_env()
    explicit = {
        "service_name": service_name,
        "endpoint": endpoint,
        "token": token,
        "headers": headers,
        "insecure": insecure,
        "gpu_sample_hz": gpu_sample_hz,
        "gpu_devices": gpu_devices,
        "export_timeout_s": export_timeout_s,
        "disabled": disabled,
        "metrics": metrics,
        "metrics_interval_s": metrics_interval_s,
    }
    merged = {**env, **{k: v for k, v in explicit.items() if v is not None}}
    if gpu is not None:
        merged["gpu"] = gpu

    exp = export or ExportOptions()
    exp = replace(
        exp,
        endpoint=merged.get("endpoint", exp.endpoint),
        token=merged.get("token", exp.token),
        headers=dict(merged.get("headers", exp.headers)),
        insecure=merged.get("insecure", exp.insecure),
        certificate=merged.get("certificate", exp.certificate),
        timeout_s=merged.get("export_timeout_s", exp.timeout_s),
    )
    g = merged.get("gpu")
    gopts = g if isinstance(g, GpuOptions) else GpuOptions(enabled=g)
    if "gpu_sample_hz" in merged:
        gopts = replace(gopts, sample_hz=float(merged["gpu_sample_hz"]))
    if gopts.devices is None and merged.get("gpu_devices") is not None:
        gopts = replace(gopts, devices=tuple(str(d) for d in merged["gpu_devices"]))
    opts = Options(
        service_name=merged.get("service_name", "unknown_service"),
        export=exp,
        gpu=gopts,
        disabled=bool(merged.get("disabled", False)),
        clock=clock,
        max_tokens_per_span=(
            Options.max_tokens_per_span if max_tokens_per_span is None else max_tokens_per_span
        ),
        metrics=bool(merged.get("metrics", Options.metrics)),
        metrics_interval_s=float(merged.get("metrics_interval_s", Options.metrics_interval_s)),
    )

    global _configured
    with _lock:
        _configured = True
        _shutdown_locked()
        RT.options = opts
        RT.clock = clock or time.time_ns
        from latscope.sdk import _server

        _server.set_clock(RT.clock)
        RT.token_cap = opts.max_tokens_per_span
        if opts.disabled:
            logger.info("latscope SDK disabled (OTEL_SDK_DISABLED / disabled=True)")
            return
        resource = Resource.create(
            {
                ResourceAttributes.HOST_NAME: socket.gethostname(),
                **(resource_attributes or {}),
                ResourceAttributes.SERVICE_NAME: opts.service_name,
            }
        )
        # latscope's own atexit hook flushes whichever provider is current; OpenTelemetry's
        # would hold every provider a re-configure replaced (and its queued spans) until exit.
        provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        if span_exporter is not None:
            processor: SpanProcessor = SimpleSpanProcessor(span_exporter)
        else:
            processor = BoundedBatchProcessor(
                _otlp_span_exporter(exp),
                max_queue_size=exp.max_queue_size,
                max_batch_size=exp.max_batch_size,
                schedule_delay_s=exp.schedule_delay_s,
            )
        provider.add_span_processor(processor)
        RT.provider = provider
        RT.processor = processor
        RT.tracer = provider.get_tracer(_SCOPE)
        RT.gpu = _start_gpu(opts, resource, metric_exporter)
        RT.metrics = _start_metrics(opts, resource, metric_exporter)
        RT.enabled = True
        _register_atexit()


def _otlp_span_exporter(exp: ExportOptions) -> SpanExporter:
    from latscope.sdk._otlp import OtlpSpanExporter

    return OtlpSpanExporter(exp)


def _start_gpu(opts: Options, resource: Resource, metric_exporter: Any) -> Any:
    if opts.gpu.enabled is False:
        return None
    with _START_GPU:
        from latscope.sdk._gpu import GpuMonitor

        return GpuMonitor.start(opts, resource, metric_exporter)
    return None


def _start_metrics(opts: Options, resource: Resource, metric_exporter: Any) -> Any:
    if not opts.metrics:
        return None
    with _START_METRICS:
        from latscope.sdk._metrics import GenAIMetrics

        exporter = metric_exporter or otlp_metric_exporter(opts.export)
        return GenAIMetrics(exporter, resource, opts.metrics_interval_s, opts.export.timeout_s)
    return None


def otlp_metric_exporter(exp: ExportOptions) -> Any:
    from latscope.sdk._otlp import OtlpMetricExporter

    return OtlpMetricExporter(exp)


def _register_atexit() -> None:
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(shutdown)
        _atexit_registered = True


def shutdown(timeout_s: float | None = None) -> None:
    """Flush what is queued (bounded by ``timeout_s``, default the export timeout) and stop."""
    with _lock:
        _shutdown_locked(timeout_s)


def _shutdown_locked(timeout_s: float | None = None) -> None:
    RT.enabled = False
    RT.tracer = trace.NoOpTracer()
    gpu, provider, processor, metrics = RT.gpu, RT.provider, RT.processor, RT.metrics
    RT.gpu = RT.provider = RT.processor = RT.metrics = None
    limit = RT.options.export.timeout_s if timeout_s is None else timeout_s
    deadline = time.monotonic() + limit
    # Each part stops on its own: one failing must not keep the others running. They share the
    # time limit, so a collector that is down holds the app's exit for ``limit`` at most.
    if gpu is not None:
        with _SHUTDOWN:
            gpu.stop(max(0.05, deadline - time.monotonic()))
    if isinstance(processor, BoundedBatchProcessor):
        with _SHUTDOWN:
            processor.shutdown(max(0.05, deadline - time.monotonic()))
    elif provider is not None:
        with _SHUTDOWN:
            provider.shutdown()
    if metrics is not None:
        with _SHUTDOWN:
            metrics.shutdown(max(0.05, deadline - time.monotonic()))


def force_flush(timeout_s: float = 10.0) -> bool:
    """Export what is queued now (spans and metrics); False when it did not finish in time."""
    done = False
    with _FORCE_FLUSH:
        ok = True
        if RT.processor is not None:
            ok = bool(RT.processor.force_flush(int(timeout_s * 1000)))
        if RT.metrics is not None:
            ok = RT.metrics.force_flush(timeout_s) and ok
        done = ok
    return done


def stats() -> dict[str, Any]:
    """Counters for what the SDK did and dropped (spans, internal faults)."""
    p = RT.processor
    out: dict[str, Any] = {"enabled": RT.enabled, "internal_errors": dict(_guard.faults)}
    if isinstance(p, BoundedBatchProcessor):
        out.update(
            spans_exported=p.exported,
            spans_failed=p.failed,
            spans_dropped=p.dropped,
            spans_queued=len(p._queue),
        )
    if RT.gpu is not None:
        out["gpu"] = RT.gpu.stats()
    return out
