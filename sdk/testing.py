"""Test helpers: a fake NVML module with pynvml's interface that plays a scripted GPU.

No GPU on the machine is needed; pass the fake as ``GpuOptions(nvml=FakeNvml(...))``.

Example::

    nvml = FakeNvml([FakeGpu(utilization=[40, 90], power_mw=[200_000], energy_mj=[0, 500])])
    sdk.configure(gpu=GpuOptions(enabled=True, nvml=nvml), ...)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FakeGpu", "FakeNvml", "NVMLError"]


class NVMLError(Exception):
    """Stands for ``pynvml.NVMLError``."""


class _Script:
    """Values returned one per read; the last one repeats."""

    def __init__(self, values: int | Iterable[int]) -> None:
        self._values = [values] if isinstance(values, int) else list(values)
        self._i = 0

    def next(self) -> int:
        v = self._values[min(self._i, len(self._values) - 1)]
        self._i += 1
        return v


@dataclass
class FakeGpu:
    """One scripted GPU: each figure is a value or a list played one per read."""

    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    utilization: int | list[int] = 0
    memory_used: int | list[int] = 0
    memory_total: int = 80 * 2**30
    power_mw: int | list[int] = 0
    sm_clock_mhz: int | list[int] = 0
    energy_mj: int | list[int] = 0
    #: Raised by every reading call of this GPU when set (a driver fault).
    fail: Exception | None = None
    _scripts: dict[str, _Script] = field(default_factory=dict, repr=False)

    def _next(self, name: str) -> int:
        if self.fail is not None:
            # A fresh traceback each time, as pynvml raises a new error per call: re-raising
            # one instance would grow its traceback by a frame per call.
            raise self.fail.with_traceback(None)
        if name not in self._scripts:
            self._scripts[name] = _Script(getattr(self, name))
        return self._scripts[name].next()


@dataclass
class _Utilization:
    gpu: int
    memory: int


@dataclass
class _Memory:
    total: int
    used: int
    free: int


class FakeNvml:
    """The subset of pynvml latscope calls, over scripted ``FakeGpu``s; counts its calls."""

    NVML_CLOCK_SM = 1
    NVMLError = NVMLError

    def __init__(self, gpus: list[FakeGpu], *, init_error: Exception | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.calls = 0
        self.initialized = False

    def _gpu(self, handle: Any) -> FakeGpu:
        self.calls += 1
        gpu: FakeGpu = self.gpus[handle]
        return gpu

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.initialized = False

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < len(self.gpus):
            raise NVMLError(f"invalid GPU index {index}")
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        for i, g in enumerate(self.gpus):
            if g.uuid == uuid:
                return i
        raise NVMLError(f"no GPU {uuid}")

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self.gpus[handle].uuid

    def nvmlDeviceGetIndex(self, handle: int) -> int:
        return handle

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> _Utilization:
        return _Utilization(self._gpu(handle)._next("utilization"), 0)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Memory:
        g = self._gpu(handle)
        used = g._next("memory_used")
        return _Memory(g.memory_total, used, g.memory_total - used)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return self._gpu(handle)._next("power_mw")

    def nvmlDeviceGetClockInfo(self, handle: int, clock_type: int) -> int:
        if clock_type != self.NVML_CLOCK_SM:
            raise NVMLError("only the SM clock is scripted")
        return self._gpu(handle)._next("sm_clock_mhz")

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        return self._gpu(handle)._next("energy_mj")
