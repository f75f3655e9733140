"""GPU figures: a scripted fake NVML per phase, OTLP gauge samples, and the real no-GPU path."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc

from latscope import sdk
from latscope.sdk import GpuOptions
from latscope.sdk.testing import FakeGpu, FakeNvml
from latscope.semconv import GpuMetricAttributes, GpuMetrics
from latscope.semconv import LatscopeAttributes as LA
from tests.sdk_support import capture

GB = 2**30
UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
UUID1 = "GPU-66666666-7777-8888-9999-000000000000"


@sdk.inference(model="llama")
def handle() -> str:
    with sdk.phase("preprocess"):  # no GPU figures outside prefill/decode
        pass
    with sdk.phase("prefill"):
        pass
    with sdk.phase("decode"):
        for _ in range(3):
            sdk.record_token()
    return "ok"


def _gpu(uuid: str, scale: int = 1) -> FakeGpu:
    # Reads 1-2 happen at prefill's start and end, reads 3-4 at decode's.
    return FakeGpu(
        uuid=uuid,
        utilization=[20, 40, 60, 100],
        memory_used=[1 * GB, 2 * GB, 3 * GB, 1 * GB],
        power_mw=[100_000 * scale, 200_000 * scale, 300_000 * scale, 300_000 * scale],
        sm_clock_mhz=[1000, 1400, 1800, 1800],
        energy_mj=[1000, 1500 * scale, 1500 * scale, 4500 * scale],
    )


def test_phase_figures_from_one_gpu() -> None:
    nvml = FakeNvml([_gpu(UUID0)])
    with capture(gpu=GpuOptions(enabled=True, nvml=nvml)) as cap:
        assert handle() == "ok"
        phases = cap.phases()
        prefill, decode = phases["prefill"].attributes, phases["decode"].attributes
        assert prefill[LA.GPU_UTIL_MEAN] == 30
        assert prefill[LA.GPU_UTIL_MAX] == 40
        assert prefill[LA.GPU_MEMORY_USED_MAX] == 2 * GB
        assert prefill[LA.GPU_POWER_MEAN] == pytest.approx(150.0)
        assert prefill[LA.GPU_SM_CLOCK] == 1200
        assert prefill[LA.GPU_ENERGY_MJ] == 500
        assert list(prefill[LA.GPU_UUIDS]) == [UUID0]
        assert decode[LA.GPU_UTIL_MEAN] == 80
        assert decode[LA.GPU_UTIL_MAX] == 100
        assert decode[LA.GPU_MEMORY_USED_MAX] == 3 * GB
        assert decode[LA.GPU_POWER_MEAN] == pytest.approx(300.0)
        assert decode[LA.GPU_ENERGY_MJ] == 3000
        assert not any(k.startswith("latscope.gpu") for k in phases["preprocess"].attributes)
    assert not nvml.initialized  # shut down with the SDK


def test_two_gpus_sum_power_and_energy() -> None:
    nvml = FakeNvml([_gpu(UUID0), _gpu(UUID1, scale=2)])
    with capture(gpu=GpuOptions(enabled=True, nvml=nvml)) as cap:
        handle()
        decode = cap.phases()["decode"].attributes
        assert decode[LA.GPU_POWER_MEAN] == pytest.approx(300.0 + 600.0)
        assert decode[LA.GPU_ENERGY_MJ] == 3000 + 6000
        assert list(decode[LA.GPU_UUIDS]) == [UUID0, UUID1]


@pytest.mark.parametrize("visible", ["1", UUID1])
def test_cuda_visible_devices_picks_the_gpus(monkeypatch: pytest.MonkeyPatch, visible: str) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    nvml = FakeNvml([_gpu(UUID0), _gpu(UUID1)])
    with capture(gpu=GpuOptions(enabled=True, nvml=nvml)) as cap:
        handle()
        assert list(cap.phases()["prefill"].attributes[LA.GPU_UUIDS]) == [UUID1]


def test_no_gpu_on_this_machine_is_one_info_line(caplog: pytest.LogCaptureFixture) -> None:
    """The real pynvml path: nvidia-ml-py is installed, the NVML library and GPU are not."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # a machine with a GPU: this test is about the machine without one
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a working NVML")
    with caplog.at_level("INFO", "latscope.sdk"), capture(gpu=True) as cap:
        assert handle() == "ok"
        assert "gpu" not in sdk.stats()
        assert not any(k.startswith("latscope.gpu") for k in cap.phases()["decode"].attributes)
    lines = [r.getMessage() for r in caplog.records if r.name == "latscope.sdk"]
    assert len(lines) == 1
    assert lines[0].startswith("latscope GPU figures off: NVML is not available")
    assert caplog.records[0].levelname == "INFO"


class _Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self) -> None:
        self.requests: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.got = threading.Event()

    def Export(self, request, context):
        self.requests.append(request)
        self.got.set()
        return metrics_service_pb2.ExportMetricsServiceResponse()


def test_periodic_samples_are_otlp_gauges_with_gpu_ids() -> None:
    servicer = _Metrics()
    server = grpc.server(futures.ThreadPoolExecutor(2))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    nvml = FakeNvml(
        [
            FakeGpu(uuid=UUID0, utilization=55, memory_used=GB, power_mw=250_000),
            FakeGpu(uuid=UUID1, utilization=75, memory_used=2 * GB, power_mw=150_000),
        ]
    )
    try:
        sdk.configure(
            service_name="gpu-host",
            endpoint=f"http://127.0.0.1:{port}",
            gpu=GpuOptions(enabled=True, nvml=nvml, sample_hz=20),
        )
        try:
            deadline = time.monotonic() + 20
            gauges: dict[str, dict[tuple[str, str], float]] = {}
            while time.monotonic() < deadline and GpuMetrics.POWER not in gauges:
                servicer.got.wait(1)
                for req in list(servicer.requests):
                    for rm in req.resource_metrics:
                        for sm in rm.scope_metrics:
                            for m in sm.metrics:
                                for dp in m.gauge.data_points:
                                    attrs = {a.key: a.value.string_value for a in dp.attributes}
                                    key = (
                                        attrs[GpuMetricAttributes.UUID],
                                        attrs[GpuMetricAttributes.INDEX],
                                    )
                                    value = dp.as_double or dp.as_int
                                    gauges.setdefault(m.name, {})[key] = value
        finally:
            sdk.shutdown(timeout_s=2)
    finally:
        server.stop(0).wait()
    assert gauges[GpuMetrics.UTILIZATION] == {(UUID0, "0"): 55, (UUID1, "1"): 75}
    assert gauges[GpuMetrics.MEMORY_USED] == {(UUID0, "0"): GB, (UUID1, "1"): 2 * GB}
    assert gauges[GpuMetrics.POWER] == pytest.approx({(UUID0, "0"): 250.0, (UUID1, "1"): 150.0})


def test_samples_taken_between_a_phases_ends_count() -> None:
    from latscope.sdk._gpu import aggregate

    # Two GPUs; readings: the phase's start, one periodic sample, the phase's end.
    # (utilization %, memory bytes, power mW, SM MHz, energy mJ)
    start = [(10, GB, 100_000, 1000, 5_000), (0, GB, 50_000, 900, 100)]
    middle = [(70, 4 * GB, 400_000, 1500, None), (30, GB, 50_000, 900, None)]
    end = [(40, 2 * GB, 100_000, 1200, 5_600), (0, GB, None, 900, 150)]
    attrs = aggregate([start, middle, end], (UUID0, UUID1))
    assert attrs[LA.GPU_UTIL_MEAN] == pytest.approx((10 + 0 + 70 + 30 + 40 + 0) / 6)
    assert attrs[LA.GPU_UTIL_MAX] == 70
    assert attrs[LA.GPU_MEMORY_USED_MAX] == 4 * GB
    assert attrs[LA.GPU_POWER_MEAN] == pytest.approx(200.0 + 50.0)
    assert attrs[LA.GPU_SM_CLOCK] == pytest.approx((1000 + 900 + 1500 + 900 + 1200 + 900) / 6)
    assert attrs[LA.GPU_ENERGY_MJ] == 600 + 50


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("no pynvml", "latscope GPU figures off: pynvml (nvidia-ml-py) is not installed"),
        ("no gpu", "latscope GPU figures off: NVML sees no GPU to watch"),
        ("bad device", "latscope GPU figures off: cannot list GPUs through NVML (no GPU GPU-x)"),
    ],
)
def test_gpu_off_cases_log_one_info_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, case: str, expected: str
) -> None:
    if case == "no pynvml":
        monkeypatch.setitem(__import__("sys").modules, "pynvml", None)  # import fails
        gpu = GpuOptions(enabled=True)
    elif case == "no gpu":
        gpu = GpuOptions(enabled=True, nvml=FakeNvml([]))
    else:
        gpu = GpuOptions(enabled=True, nvml=FakeNvml([FakeGpu()]), devices=("GPU-x",))
    with caplog.at_level("INFO", "latscope.sdk"), capture(gpu=gpu) as cap:
        assert handle() == "ok"
        assert not any(k.startswith("latscope.gpu") for k in cap.phases()["decode"].attributes)
    assert [r.getMessage() for r in caplog.records if r.name == "latscope.sdk"] == [expected]
