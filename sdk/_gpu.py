"""GPU figures from NVML (pynvml, from nvidia-ml-py): per prefill/decode phase, and as gauges.

Per phase: NVML is read when the phase starts and when it ends (plus any periodic samples taken
in between), giving utilization mean/max (%), memory used max (bytes), power mean (W, summed
over the watched GPUs), SM clock mean (MHz) and the energy counter's difference (mJ). NVML
itself averages utilization over a sample period of 1/6 s to 1 s (``nvmlUtilization_t``), so for
short phases the energy difference is the sharper figure; the energy counter
(``nvmlDeviceGetTotalEnergyConsumption``) exists from Volta on, and a GPU without it simply
leaves that attribute out.

With no pynvml, no driver or no GPU, ``GpuMonitor.start`` logs one info line and returns None:
every GPU feature is then off and nothing else changes.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from latscope.sdk import _guard
from latscope.sdk._options import Options
from latscope.semconv import GpuMetricAttributes, GpuMetrics, LatscopeAttributes

logger = logging.getLogger("latscope.sdk")

#: Periodic samples kept for phase aggregation; older ones fall off (bounded memory).
_RING = 512
#: Reads in a row in which every NVML call failed before NVML is left alone for a while: a
#: lost GPU or a wedged driver fails every call, and each failing call can be slow.
_FAILED_READS_BEFORE_PAUSE = 3
#: How long NVML is left alone then; reads resume afterwards, so a driver hiccup heals.
PAUSE_S = 30.0

_SAMPLE = _guard.handle_internal_errors("gpu.sample")


@dataclass(frozen=True)
class _Device:
    index: int
    uuid: str
    handle: Any


# One reading of one GPU: (utilization %, memory used bytes, power mW, SM clock MHz, energy mJ).
# Any field NVML would not give is None.
Reading = tuple[int | None, int | None, int | None, int | None, int | None]


class GpuMonitor:
    """Reads the watched GPUs through a pynvml-compatible module."""

    def __init__(self, nvml: Any, devices: list[_Device]) -> None:
        self._nvml = nvml
        self.devices = devices
        self._uuids = tuple(d.uuid for d in devices)
        self._ring: collections.deque[tuple[int, list[Reading]]] = collections.deque(maxlen=_RING)
        self._latest: list[Reading] | None = None
        self._lock = threading.Lock()
        self._meter_provider: Any = None
        self.reads = 0
        self.errors = 0
        self.pauses = 0
        self._failed_reads = 0
        self._paused_until = 0.0
        self._nothing: list[Reading] = [(None, None, None, None, None) for _ in devices]

    # lifecycle --------------------------------------------------------------------------------
    @classmethod
    def start(cls, opts: Options, resource: Any, metric_exporter: Any) -> GpuMonitor | None:
        nvml: Any = opts.gpu.nvml
        if nvml is None:
            try:
                import pynvml
            except ImportError:
                logger.info("latscope GPU figures off: pynvml (nvidia-ml-py) is not installed")
                return None
            nvml = pynvml
        try:
            nvml.nvmlInit()
        except Exception as exc:
            logger.info("latscope GPU figures off: NVML is not available (%s)", exc)
            return None
        try:
            devices = _resolve_devices(nvml, opts.gpu.devices)
        except Exception as exc:
            logger.info("latscope GPU figures off: cannot list GPUs through NVML (%s)", exc)
            _quiet(nvml.nvmlShutdown)
            return None
        if not devices:
            logger.info("latscope GPU figures off: NVML sees no GPU to watch")
            _quiet(nvml.nvmlShutdown)
            return None
        monitor = cls(nvml, devices)
        if opts.gpu.sample_hz > 0:
            monitor._start_metrics(opts, resource, metric_exporter)
        logger.info(
            "latscope GPU figures on: %s%s",
            ", ".join(f"{d.index}:{d.uuid}" for d in devices),
            f", sampled at {opts.gpu.sample_hz:g} Hz" if opts.gpu.sample_hz > 0 else "",
        )
        return monitor

    def stop(self, timeout_s: float = 5.0) -> None:
        mp, self._meter_provider = self._meter_provider, None
        if mp is not None:
            _quiet(lambda: mp.shutdown(timeout_millis=int(timeout_s * 1000)))
        _quiet(self._nvml.nvmlShutdown)

    def stats(self) -> dict[str, int]:
        return {
            "gpus": len(self.devices),
            "nvml_reads": self.reads,
            "nvml_errors": self.errors,
            "nvml_pauses": self.pauses,
        }

    # reading ----------------------------------------------------------------------------------
    def read(self) -> list[Reading]:
        """One reading of every watched GPU (all None while NVML is paused after failures)."""
        if self._paused_until and time.monotonic() < self._paused_until:
            return self._nothing
        nvml = self._nvml
        out: list[Reading] = []
        for d in self.devices:
            h = d.handle
            out.append(
                (
                    self._get(lambda h=h: nvml.nvmlDeviceGetUtilizationRates(h).gpu),
                    self._get(lambda h=h: nvml.nvmlDeviceGetMemoryInfo(h).used),
                    self._get(lambda h=h: nvml.nvmlDeviceGetPowerUsage(h)),
                    self._get(lambda h=h: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
                    self._get(lambda h=h: nvml.nvmlDeviceGetTotalEnergyConsumption(h)),
                )
            )
        self.reads += 1
        if any(v is not None for reading in out for v in reading):
            self._failed_reads = 0
        else:
            self._failed_reads += 1
            if self._failed_reads >= _FAILED_READS_BEFORE_PAUSE:
                self._pause()
        return out

    def _pause(self) -> None:
        self._failed_reads = 0
        self._paused_until = time.monotonic() + PAUSE_S
        self.pauses += 1
        if self.pauses == 1:
            logger.warning(
                "latscope GPU figures paused: every NVML call failed %d reads in a row; "
                "retrying every %.0f s (app unaffected)",
                _FAILED_READS_BEFORE_PAUSE,
                PAUSE_S,
            )

    def _get(self, fn: Any) -> int | None:
        try:
            return int(fn())
        except Exception:  # NVMLError_NotSupported on older GPUs, a driver hiccup, ...
            self.errors += 1
            return None

    def begin(self) -> tuple[int, list[Reading]]:
        """Snapshot at a phase's start."""

        return time.monotonic_ns(), self.read()

    def end(self, snap: tuple[int, list[Reading]]) -> dict[str, Any]:
        """The phase span's GPU attributes, from its start snapshot to now."""

        t0, first = snap
        last = self.read()
        with self._lock:
            between = [r for t, r in self._ring if t >= t0]
        readings = [first, *between, last]
        return aggregate(readings, self._uuids)

    # periodic samples as OTLP gauges ----------------------------------------------------------
    def _sample(self) -> list[Reading] | None:
        with _SAMPLE:
            now = time.monotonic_ns()
            readings = self.read()
            with self._lock:
                self._ring.append((now, readings))
                self._latest = readings
            return readings
        return None

    def _start_metrics(self, opts: Options, resource: Any, metric_exporter: Any) -> None:
        from opentelemetry.metrics import CallbackOptions, Observation
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        if metric_exporter is None:
            from latscope.sdk._runtime import otlp_metric_exporter

            metric_exporter = otlp_metric_exporter(opts.export)
        interval_ms = max(10.0, 1000.0 / opts.gpu.sample_hz)
        reader = PeriodicExportingMetricReader(
            metric_exporter,
            export_interval_millis=interval_ms,
            export_timeout_millis=opts.export.timeout_s * 1000,
        )
        provider = MeterProvider(resource=resource, metric_readers=[reader], shutdown_on_exit=False)
        meter = provider.get_meter("latscope.sdk.gpu")
        labels = [
            {GpuMetricAttributes.UUID: d.uuid, GpuMetricAttributes.INDEX: str(d.index)}
            for d in self.devices
        ]
        scale = {2: 1e-3}  # power: mW -> W

        def observe(field: int) -> Any:
            def callback(options: CallbackOptions) -> list[Observation]:
                # The utilization gauge is collected first: it takes the sample the rest reuse.
                readings = self._sample() if field == 0 else self._latest
                if readings is None:
                    return []
                f = scale.get(field, 1)
                return [
                    Observation(value * f, labels[i])
                    for i, r in enumerate(readings)
                    if (value := r[field]) is not None
                ]

            return callback

        names = (
            (GpuMetrics.UTILIZATION, "%"),
            (GpuMetrics.MEMORY_USED, "By"),
            (GpuMetrics.POWER, "W"),
            (GpuMetrics.SM_CLOCK, "MHz"),
            (GpuMetrics.ENERGY, "mJ"),
        )
        for field, (name, unit) in enumerate(names):
            meter.create_observable_gauge(name, callbacks=[observe(field)], unit=unit)
        self._meter_provider = provider


def aggregate(readings: list[list[Reading]], uuids: tuple[str, ...]) -> dict[str, Any]:
    """Phase attributes from readings (each a list over GPUs), the first and last included."""
    attrs: dict[str, Any] = {LatscopeAttributes.GPU_UUIDS: list(uuids)}
    utils = [r[0] for rs in readings for r in rs if r[0] is not None]
    if utils:
        attrs[LatscopeAttributes.GPU_UTIL_MEAN] = sum(utils) / len(utils)
        attrs[LatscopeAttributes.GPU_UTIL_MAX] = max(utils)
    mems = [r[1] for rs in readings for r in rs if r[1] is not None]
    if mems:
        attrs[LatscopeAttributes.GPU_MEMORY_USED_MAX] = max(mems)
    power_w = 0.0
    have_power = False
    for g in range(len(uuids)):
        p = [mw for rs in readings if (mw := rs[g][2]) is not None]
        if p:
            have_power = True
            power_w += sum(p) / len(p) / 1000
    if have_power:
        attrs[LatscopeAttributes.GPU_POWER_MEAN] = power_w
    clocks = [r[3] for rs in readings for r in rs if r[3] is not None]
    if clocks:
        attrs[LatscopeAttributes.GPU_SM_CLOCK] = sum(clocks) / len(clocks)
    energy = 0
    have_energy = False
    for g in range(len(uuids)):
        e0, e1 = readings[0][g][4], readings[-1][g][4]
        if e0 is not None and e1 is not None and e1 >= e0:
            energy += e1 - e0
            have_energy = True
    if have_energy:
        attrs[LatscopeAttributes.GPU_ENERGY_MJ] = energy
    return attrs


def _resolve_devices(nvml: Any, wanted: tuple[str, ...] | None) -> list[_Device]:
    """The GPUs to watch: ``wanted`` indices/UUIDs, else all of them.

    ``CUDA_VISIBLE_DEVICES`` indices follow CUDA's order, which matches NVML's when
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; UUIDs (``GPU-...``) are unambiguous either way.
    """
    if wanted is None:
        specs: list[str] = [str(i) for i in range(nvml.nvmlDeviceGetCount())]
    else:
        specs = list(wanted)
    devices = []
    for spec in specs:
        if spec.isdigit():
            handle = nvml.nvmlDeviceGetHandleByIndex(int(spec))
        elif spec.startswith("GPU-"):
            handle = nvml.nvmlDeviceGetHandleByUUID(spec)
        else:  # MIG instances and other forms: not watched
            continue
        uuid = nvml.nvmlDeviceGetUUID(handle)
        if isinstance(uuid, bytes):
            uuid = uuid.decode()
        index = nvml.nvmlDeviceGetIndex(handle)
        devices.append(_Device(int(index), str(uuid), handle))
    return devices


def _quiet(fn: Any) -> None:
    with contextlib.suppress(Exception):
        fn()
