"""The C OTLP decoder is built where the project is tested, and the collector runs without it."""

from __future__ import annotations

import logging
import os
import random
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from bench.ingest.traces import make_batch
from latscope.collector import mapping
from latscope.storage import Store
from tests.collector_harness import count_spans, start_collector, store_fixture  # noqa: F401
from tests.hypothesis_support import examples

#: Set where an install without a C compiler is intended: the Python decoder is then expected.
ALLOW_PYTHON = "LATSCOPE_ALLOW_PYTHON_DECODER"


def test_the_c_decoder_is_built() -> None:
    if os.environ.get(ALLOW_PYTHON):
        pytest.skip(f"{ALLOW_PYTHON} is set: the Python decoder is allowed")
    assert mapping.NATIVE, (
        "latscope.collector._otlp was not built: reinstall with a C compiler and the Python "
        f"headers (pip install -e .), or set {ALLOW_PYTHON}=1 if that is intended"
    )


@pytest.mark.subprocess
def test_without_the_c_decoder_the_collector_maps_in_python_and_says_so(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(mapping, "NATIVE", False)
    with caplog.at_level(logging.WARNING, logger="latscope.collector"):
        c = start_collector(store, tmp_path / "spool")
    try:
        warnings = [r.getMessage() for r in caplog.records if "C OTLP decoder" in r.getMessage()]
        assert len(warnings) == 1 and "decoding spans in Python" in warnings[0]
        service = f"py-{random.getrandbits(48):012x}"
        request = make_batch(random.Random(2), 1_763_000_000_000_000_000, 2)
        for rs in request.resource_spans:
            rs.resource.attributes[0].value.string_value = service
        with grpc.insecure_channel(c.grpc) as channel:
            trace_service_pb2_grpc.TraceServiceStub(channel).Export(request, timeout=10)
            with pytest.raises(grpc.RpcError) as err:
                channel.unary_unary(
                    "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                    request_serializer=None,
                    response_deserializer=None,
                )(b"\xff\xff", timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        c.wait_stored()
        assert count_spans(store, service) == 14
    finally:
        c.stop()


def _sanitizer_runtimes() -> list[str]:
    gcc = shutil.which("gcc")
    if gcc is None:
        return []
    out = []
    for lib in ("libasan.so", "libubsan.so"):
        found = subprocess.run([gcc, f"-print-file-name={lib}"], capture_output=True, text=True)
        if not os.path.isabs(found.stdout.strip()):
            return []  # gcc prints the bare name back when it has no such runtime
        out.append(found.stdout.strip())
    return out


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.timeout(600)
def test_the_c_decoder_under_address_and_undefined_behaviour_sanitizers(tmp_path: Path) -> None:
    # The decoder reads untrusted network bytes: any read out of bounds or undefined behaviour,
    # even one that happens to work in the release build, aborts this run.
    runtimes = _sanitizer_runtimes()
    if not runtimes:
        pytest.skip("no gcc with AddressSanitizer and UBSan runtimes on this machine")
    root = Path(__file__).resolve().parents[1]
    built = tmp_path / "_otlp_sanitized.so"
    include = sysconfig.get_paths()["include"]
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O1", "-g", "-fno-omit-frame-pointer",
         "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", f"-I{include}",
         str(root / "collector/_otlp.c"), "-o", str(built)],
        check=True,
    )  # fmt: skip
    env = {
        **os.environ,
        "LD_PRELOAD": ":".join(runtimes),
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
        "PYTHONPATH": str(root),
    }
    count = examples(500)
    run = subprocess.run(
        [sys.executable, str(root / "tests/sanitized_decoder.py"), str(built), str(count)],
        capture_output=True,
        text=True,
        env=env,
        timeout=500,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    decoded, malformed = map(int, run.stdout.split())
    assert decoded > count and malformed > count  # both paths of the decoder were exercised
