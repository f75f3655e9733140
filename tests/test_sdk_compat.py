"""The SDK on any OpenTelemetry in its range: each private shortcut has a tested public path.

CI also runs every SDK test on the lowest declared versions (``scripts/test --sdk-floor``).
"""

from __future__ import annotations

import ast
import asyncio
import contextvars
from pathlib import Path

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace

from latscope import sdk
from latscope.sdk import _otel
from latscope.semconv import LatscopeAttributes
from tests.sdk_support import capture

SDK_DIR = Path(sdk.__file__).parent


@sdk.inference(model="llama")
def handle(n: int) -> None:
    with sdk.phase("decode"):
        for _ in range(n):
            sdk.record_token()


def _offsets(cap) -> tuple[int, ...]:
    return tuple(cap.one("decode").attributes[LatscopeAttributes.TOKEN_OFFSETS_US])


@pytest.mark.parametrize("fast", [True, False], ids=["setitem_locked", "public"])
def test_token_offsets_with_and_without_the_attributes_shortcut(
    monkeypatch: pytest.MonkeyPatch, fast: bool
) -> None:
    if not fast:  # an OpenTelemetry without BoundedAttributes._setitem_locked
        monkeypatch.setattr(_otel, "SETITEM_LOCKED", None)
    elif _otel.SETITEM_LOCKED is None:
        pytest.skip("this OpenTelemetry has no BoundedAttributes._setitem_locked")
    with capture() as cap:
        handle(4)
        assert len(_offsets(cap)) == 4
        assert cap.one("decode").attributes[LatscopeAttributes.TOKEN_COUNT] == 4
        assert sdk.stats()["internal_errors"] == {}


def test_a_changed_internal_falls_back_to_the_public_api(monkeypatch: pytest.MonkeyPatch) -> None:
    def changed(attrs, key, value, extra):  # a signature this SDK does not know
        raise AssertionError("never called with this arity")

    monkeypatch.setattr(_otel, "SETITEM_LOCKED", changed)
    with capture() as cap:
        handle(3)
        assert len(_offsets(cap)) == 3
        assert _otel.SETITEM_LOCKED is None  # switched to set_attribute for good
        assert sdk.stats()["internal_errors"] == {}


def test_detach_from_another_context_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    span = trace.NonRecordingSpan(trace.INVALID_SPAN_CONTEXT)
    token = otel_context.attach(trace.set_span_in_context(span))
    # Restoring from another Context (a framework that hopped threads) does nothing, quietly.
    contextvars.copy_context().run(_otel.detach, token)
    assert trace.get_current_span() is span
    _otel.detach(token)
    assert trace.get_current_span() is not span
    _otel.detach(token)  # used twice: still quiet
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


def test_detach_with_a_non_contextvars_runtime_uses_the_public_api(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[object] = []
    monkeypatch.setattr(otel_context, "detach", seen.append)
    token = object()  # what another runtime context might hand out
    _otel.detach(token)
    assert seen == [token]


def test_async_handlers_keep_the_callers_context() -> None:
    with capture() as cap:

        @sdk.inference(model="ctx")
        async def stream():
            with sdk.phase("decode"):
                for i in range(3):
                    sdk.record_token()
                    yield i

        async def main() -> None:
            before = otel_context.get_current()
            assert [i async for i in stream()] == [0, 1, 2]
            assert otel_context.get_current() == before

        asyncio.run(main())
        assert len(_offsets(cap)) == 3


def test_no_private_opentelemetry_name_outside_the_compat_module() -> None:
    """Private OpenTelemetry internals are reached only in ``sdk/_otel.py``, behind checks."""
    private = {
        "_RUNTIME_CONTEXT",
        "_setitem_locked",
        "_attributes",
        "_immutable",
        "_preferred_temporality",
    }
    for path in sorted(SDK_DIR.glob("*.py")):
        if path.name == "_otel.py":
            continue
        tree = ast.parse(path.read_text())
        used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | {
            n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
        }
        assert not private & used, f"{path.name} uses {private & used}"
