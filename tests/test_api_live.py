"""Live: spans in -> the attributor -> Watch streams and the /metrics latency histograms."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from latscope.api.grpc_service import attribution_dict
from latscope.cli import main
from latscope.v1 import query_pb2, query_pb2_grpc
from tests.serve_support import Server, start_serve
from tests.surfaces import FAST_ATTRIBUTION, RequestSpec, send, steady_tokens

pytestmark = pytest.mark.subprocess


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Server]:
    server = start_serve(tmp_path / "store", *FAST_ATTRIBUTION)
    try:
        yield server
    finally:
        server.stop()


def _spec(queue_ms: float, model: str = "llama-3-8b") -> RequestSpec:
    q = queue_ms
    return RequestSpec(
        model=model,
        client=(0, 1000 + q),
        server=(40, 960 + q),
        phases={
            "queue": (45, 45 + q),
            "prefill": (50 + q, 250 + q),
            "decode": (250 + q, 900 + q),
        },
        token_offsets_us=steady_tokens(10, 0, 50_000),
    )


def _metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if m and ",".join(sorted(m.group(1).split(","))) == want:
            return float(m.group(2))
    return 0.0


def test_watch_and_metrics_follow_attributed_requests(
    live: Server, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Top runs the same stream from the command line, as JSON lines; each stream is open (the
    # server sends its headers once it has subscribed) before the requests are sent.
    opened: list[grpc.Call] = []

    class Stub(query_pb2_grpc.QueryServiceStub):
        """The generated stub, keeping each Watch stream it opens."""

        def __init__(self, channel: grpc.Channel) -> None:
            super().__init__(channel)
            self._watch, self.Watch = self.Watch, self._watched

        def _watched(self, *args: Any, **kwargs: Any) -> Any:
            opened.append(self._watch(*args, **kwargs))
            return opened[-1]

    monkeypatch.setattr(query_pb2_grpc, "QueryServiceStub", Stub)
    with grpc.insecure_channel(live.grpc) as channel:
        stream = Stub(channel).Watch(
            query_pb2.WatchRequest(model="llama-3-8b", min_e2e_ms=1100), timeout=60
        )
        got: list[dict] = []
        done = threading.Event()

        def read() -> None:
            try:
                for message in stream:
                    got.append(attribution_dict(message))
                    if len(got) == 2:
                        break
            except grpc.RpcError:
                pass
            done.set()

        threading.Thread(target=read, daemon=True).start()
        code: list[int] = []
        argv = ["top", "--grpc", live.grpc, "--count", "3", "--duration", "60", "--json"]
        top = threading.Thread(target=lambda: code.append(main(argv)), daemon=True)
        top.start()
        deadline = time.monotonic() + 60
        while len(opened) < 2:
            assert time.monotonic() < deadline, "top never opened its Watch stream"
            time.sleep(0.05)
        for s in opened:
            s.initial_metadata()  # waits for the server's headers: subscribed
        specs = [_spec(300), _spec(20), _spec(600), _spec(400, model="mistral-7b")]
        send(live.grpc, specs)
        assert done.wait(45), "Watch delivered nothing"
        stream.cancel()
        top.join(60)
        out, err = capsys.readouterr()
    slow = {specs[0].trace_id: specs[0], specs[2].trace_id: specs[2]}
    assert {r["trace_id"] for r in got} == set(slow)
    for r in got:
        assert r["e2e_ms"] == pytest.approx(slow[r["trace_id"]].e2e_ms, abs=0.01)
        assert r["buckets_ms"]["queue"] == pytest.approx(
            slow[r["trace_id"]].expected_buckets()["queue"], abs=0.01
        )
    assert code == [0], err
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 3
    assert {json.loads(line)["trace_id"] for line in lines} <= {s.trace_id for s in specs}

    text = httpx.get(live.url("/metrics"), timeout=10).text
    labels = {"service": "llm-server", "model": "llama-3-8b"}
    assert _metric(text, "latscope_request_e2e_seconds_count", **labels) == 3
    assert _metric(text, "latscope_request_bucket_seconds_count", bucket="queue", **labels) == 3
    queue_sum = _metric(text, "latscope_request_bucket_seconds_sum", bucket="queue", **labels)
    assert queue_sum == pytest.approx((300 + 20 + 600) / 1000, abs=1e-6)
    # 20 ms of queue is under the 25 ms bound; 300 and 600 ms are not under 250 ms.
    le = _metric(text, "latscope_request_bucket_seconds_bucket", bucket="queue", le="0.025",
                 **labels)  # fmt: skip
    assert le == 1
    assert _metric(text, "latscope_request_e2e_seconds_count",
                   service="llm-server", model="mistral-7b") == 1  # fmt: skip
