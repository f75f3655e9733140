"""The SDK never breaks the app: collector down, slow or refusing, NVML raising, an SDK bug.

Each test runs the same instrumented handler with and without the fault and checks the app
sees identical results, no exception, and that the SDK's queue stayed within its bound.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from examples.client import chat, make_client
from examples.inference_server import create_app
from latscope import sdk
from latscope.sdk import ExportOptions, GpuOptions
from latscope.sdk.testing import FakeGpu, FakeNvml, NVMLError
from latscope.semconv import LatscopeAttributes
from tests.sdk_support import capture, collector, run_app

QUEUE = 32


@sdk.inference(model="llama")
def handle(n: int) -> list[int]:
    with sdk.phase("queue"):
        pass
    with sdk.phase("prefill"):
        pass
    out = []
    with sdk.phase("decode"):
        for i in sdk.traced_tokens(range(n)):
            out.append(i * i)
    sdk.set_usage(input_tokens=n)
    return out


@sdk.inference(model="llama")
async def ahandle(n: int):
    with sdk.phase("decode"):
        for i in range(n):
            sdk.record_token()
            yield i


async def _drain(n: int) -> list[int]:
    return [i async for i in ahandle(n)]


EXPECTED = [i * i for i in range(20)]


def _run_app_workload(requests: int = 200) -> None:
    for _ in range(requests):
        assert handle(20) == EXPECTED
    assert asyncio.run(_drain(5)) == [0, 1, 2, 3, 4]


@contextmanager
def _configured(endpoint: str, **kwargs) -> Iterator[None]:
    sdk.configure(
        service_name="resilience",
        gpu=False,
        export=ExportOptions(
            endpoint=endpoint,
            timeout_s=0.5,
            max_queue_size=QUEUE,
            max_batch_size=8,
            schedule_delay_s=0.05,
        ),
        **kwargs,
    )
    try:
        yield
    finally:
        sdk.shutdown(timeout_s=1)


def _check_bounded() -> dict:
    stats = sdk.stats()
    assert stats["spans_queued"] <= QUEUE
    return stats


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def test_collector_down(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", "latscope.sdk"), _configured(f"127.0.0.1:{_closed_port()}"):
        for _ in range(5):
            _run_app_workload(requests=40)
            sdk.force_flush(timeout_s=2)  # each flush fails against the dead address
        stats = _check_bounded()
        # 200 requests x 5 spans cannot all fit in a 32-span queue nor reach the collector.
        assert stats["spans_dropped"] > 0
        assert stats["spans_exported"] == 0
        assert stats["spans_failed"] > 0
    # Counted, and said at most once a minute, not once per span or per failed export.
    ours = [r.getMessage() for r in caplog.records if r.name == "latscope.sdk"]
    assert len([m for m in ours if "span export failing" in m]) <= 1
    assert len([m for m in ours if "dropped" in m]) <= 2


def test_reconfiguring_with_the_collector_down_holds_no_old_spans() -> None:
    endpoint = f"127.0.0.1:{_closed_port()}"
    old = []
    for _ in range(3):
        with _configured(endpoint):
            _run_app_workload(requests=40)
            processor = sdk._runtime.RT.processor
            assert sdk.stats()["spans_queued"] > 0  # nowhere to go
        old.append(weakref.ref(processor))
        assert len(processor._queue) == 0  # dropped at shutdown, counted
        assert processor.dropped > 0
    del processor
    gc.collect()
    assert [ref() for ref in old] == [None, None, None]  # nothing keeps a replaced processor


def test_collector_refusing_with_resource_exhausted() -> None:
    with collector("refuse") as (servicer, addr), _configured(addr):
        _run_app_workload()
        assert sdk.force_flush(timeout_s=5) is False  # nothing went: every Export refused
        stats = _check_bounded()
        assert servicer.calls > 0
        assert stats["spans_exported"] == 0
        assert stats["spans_failed"] + stats["spans_dropped"] > 0


def test_collector_hanging_never_blocks_the_app() -> None:
    with collector("hang") as (servicer, addr), _configured(addr):
        handle(3)
        assert servicer.entered.wait(10)  # the export thread's timer sent them; it is held
        # The exporter thread is stuck inside Export; the app must not notice.
        _run_app_workload()
        stats = _check_bounded()
        assert stats["spans_dropped"] > 0
        servicer.release.set()


def test_nvml_raising_mid_run_leaves_results_and_spans_intact() -> None:
    gpu = FakeGpu(utilization=50, power_mw=100_000)
    nvml = FakeNvml([gpu])
    with capture(gpu=GpuOptions(enabled=True, nvml=nvml)) as cap:
        assert handle(20) == EXPECTED
        gpu.fail = NVMLError("GPU is lost")
        assert handle(20) == EXPECTED
        decodes = cap.named("decode")
        assert len(decodes) == 2
        assert LatscopeAttributes.GPU_UTIL_MEAN in decodes[0].attributes
        assert LatscopeAttributes.GPU_UTIL_MEAN not in decodes[1].attributes
        assert decodes[1].attributes[LatscopeAttributes.TOKEN_COUNT] == 20
        assert sdk.stats()["gpu"]["nvml_errors"] > 0


def test_nvml_failing_every_call_is_left_alone_then_retried(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    gpu = FakeGpu(utilization=50, power_mw=100_000)
    nvml = FakeNvml([gpu])
    with (
        caplog.at_level("WARNING", "latscope.sdk"),
        capture(gpu=GpuOptions(enabled=True, nvml=nvml)) as cap,
    ):
        gpu.fail = NVMLError("GPU is lost")
        assert handle(20) == EXPECTED  # prefill and decode: 4 reads, every call failing
        calls = nvml.calls
        for _ in range(50):
            assert handle(20) == EXPECTED
        assert nvml.calls == calls  # paused: a lost GPU costs the app nothing more
        assert sdk.stats()["gpu"]["nvml_pauses"] == 1
        # The GPU comes back and the pause runs out: figures return.
        gpu.fail = None
        monkeypatch.setattr("latscope.sdk._gpu.PAUSE_S", 0.0)
        sdk._runtime.RT.gpu._paused_until = 1.0  # long past
        cap.clear()
        assert handle(20) == EXPECTED
        assert nvml.calls > calls
        assert LatscopeAttributes.GPU_UTIL_MEAN in cap.one("decode").attributes
    paused = [r.getMessage() for r in caplog.records if "GPU figures paused" in r.getMessage()]
    assert len(paused) == 1


def test_nvml_init_failing_turns_gpu_off(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml([FakeGpu()], init_error=NVMLError("Driver Not Loaded"))
    with caplog.at_level("INFO", "latscope.sdk"), capture(gpu=GpuOptions(True, nvml=nvml)) as cap:
        assert handle(20) == EXPECTED
        assert "gpu" not in sdk.stats()
        assert LatscopeAttributes.GPU_UTIL_MEAN not in cap.one("decode").attributes
    assert [r.message for r in caplog.records if "GPU" in r.message] == [
        "latscope GPU figures off: NVML is not available (Driver Not Loaded)"
    ]


@pytest.mark.parametrize(
    "target",
    [
        "latscope.sdk._server._flush_tokens",
        "latscope.sdk._server._Request.note_tokens",
        "latscope.sdk._server._Decode.__init__",
        "latscope.sdk._gpu.aggregate",
        "latscope.sdk._client._start_call",
    ],
)
def test_internal_bug_never_reaches_the_app(monkeypatch: pytest.MonkeyPatch, target: str) -> None:
    def boom(*args, **kwargs):
        raise RuntimeError("bug inside the SDK")

    module, _, attr = target.rpartition(".")
    if attr == "__init__" or module.endswith(("_Request", "_Decode")):
        mod_name, _, cls_name = module.rpartition(".")
        import importlib

        monkeypatch.setattr(getattr(importlib.import_module(mod_name), cls_name), attr, boom)
    else:
        monkeypatch.setattr(target, boom)
    nvml = FakeNvml([FakeGpu(utilization=10)])
    with capture(gpu=GpuOptions(enabled=True, nvml=nvml)) as cap:
        _run_app_workload(requests=5)
        with pytest.raises(ValueError, match="app error"), sdk.client_call("GET", "http://x/y"):
            raise ValueError("app error")
        assert sdk.stats()["internal_errors"]
        assert cap.spans()  # what could still be recorded was


def test_clock_raising_everywhere() -> None:
    def bad_clock() -> int:
        raise OSError("clock source gone")

    with capture(clock=bad_clock):
        _run_app_workload(requests=5)
        with run_app(create_app(token_delay_s=0.0)) as base, make_client(f"{base}/v1") as c:
            assert chat(c, "still works fine") == "still works fine"
        assert set(sdk.stats()["internal_errors"]) >= {
            "inference.start",
            "phase.enter",
            "httpx.begin",
        }


def test_tracer_failing_on_every_span(monkeypatch: pytest.MonkeyPatch) -> None:
    with capture() as cap:

        def boom(*args, **kwargs):
            raise RuntimeError("tracer broken")

        monkeypatch.setattr(sdk._runtime.RT.tracer, "start_span", boom)
        _run_app_workload(requests=5)
        with run_app(create_app(token_delay_s=0.0)) as base, make_client(f"{base}/v1") as c:
            assert chat(c, "still works fine") == "still works fine"
        assert cap.spans() == []
        assert set(sdk.stats()["internal_errors"]) >= {"inference.start", "phase.enter"}


def test_httpx_instrumentation_with_collector_down() -> None:
    with (
        _configured(f"127.0.0.1:{_closed_port()}"),
        run_app(create_app(token_delay_s=0.0)) as base,
        make_client(f"{base}/v1") as client,
    ):
        for _ in range(20):
            assert chat(client, "a b c") == "a b c"
        with httpx.Client() as plain:
            r = plain.post(f"{base}/v1/chat/completions", json={"messages": []})
            assert r.status_code == 200
        _check_bounded()


EXIT_SCRIPT = """
from latscope import sdk
from latscope.sdk import ExportOptions

sdk.configure(
    service_name="exits", gpu=False, export=ExportOptions(endpoint={addr!r}, schedule_delay_s=60)
)

@sdk.inference(model="llama")
def handle():
    with sdk.phase("decode"):
        sdk.record_token()

handle()
print("done")  # no shutdown(): the SDK must flush at exit
"""


@pytest.mark.subprocess
def test_spans_are_flushed_at_exit() -> None:
    import subprocess
    import sys

    with collector("ok") as (servicer, addr):
        proc = subprocess.run(
            [sys.executable, "-c", EXIT_SCRIPT.format(addr=addr)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == "done"
        assert sorted(servicer.names) == ["chat llama", "decode"]


def test_middleware_flushes_when_the_server_shuts_down() -> None:
    with collector("ok") as (servicer, addr):
        sdk.configure(
            service_name="shutdown",
            gpu=False,
            export=ExportOptions(endpoint=addr, schedule_delay_s=60),
        )
        try:
            with run_app(create_app(token_delay_s=0.0), lifespan="on") as base:
                with make_client(f"{base}/v1") as client:
                    assert chat(client, "a b") == "a b"
                assert servicer.names == []  # still queued: the export timer is a minute
            # uvicorn's graceful shutdown ran the lifespan's end: the middleware flushed.
            assert "chat toy-echo-1" in servicer.names
            assert "POST /v1/chat/completions" in servicer.names
        finally:
            sdk.shutdown(timeout_s=1)


FORK_SCRIPT = """
import os
from latscope import sdk
from latscope.sdk import ExportOptions

sdk.configure(service_name="forks", gpu=False, export=ExportOptions(endpoint={addr!r}))

@sdk.inference(model="child")
def handle():
    pass

pid = os.fork()
if pid == 0:  # a pre-fork server's worker: configured in the parent, serving in the child
    handle()
    sdk.shutdown()
    os._exit(0)
os.waitpid(pid, 0)
sdk.shutdown()
print("done")
"""


@pytest.mark.subprocess
def test_exports_from_a_forked_worker() -> None:
    import subprocess
    import sys

    with collector("ok") as (servicer, addr):
        proc = subprocess.run(
            [sys.executable, "-c", FORK_SCRIPT.format(addr=addr)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        assert servicer.names == ["chat child"]


def test_malformed_sse_never_reaches_the_app() -> None:
    """Odd SSE payloads (choices not a list, binary, huge) still stream through untouched."""
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    events = [
        b'data: {"choices": 7}\n\n',
        b"data: \xff\xfe\n\n",
        b'data: {"choices": [{"delta": {"content": ""}}]}\n\n',
        b"data: " + b"x" * 70_000 + b"\n\n",
        b"data: [DONE]\n\n",
    ]

    async def body():
        for e in events:
            yield e

    async def endpoint(request):
        return StreamingResponse(body(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/sse", endpoint)])
    with capture() as cap, run_app(app) as base, sdk.instrument_httpx(httpx.Client()) as http:
        assert http.get(f"{base}/sse").content == b"".join(events)
        span = cap.one("GET /sse")
        assert LatscopeAttributes.FIRST_TOKEN_NS in span.attributes
        assert LatscopeAttributes.STREAM_END not in span.attributes
