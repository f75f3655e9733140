"""The SDK's public face: a short, explicit ``__all__`` and wrong arguments failing at once."""

from __future__ import annotations

import pytest

from latscope import sdk

EXPECTED = {
    "ClientCall",
    "ExportOptions",
    "GpuOptions",
    "TraceparentMiddleware",
    "atraced_tokens",
    "client_call",
    "configure",
    "current_span",
    "extract_context",
    "force_flush",
    "inference",
    "inject_context",
    "instrument_httpx",
    "phase",
    "record_token",
    "set_usage",
    "shutdown",
    "stats",
    "traced_tokens",
}


def test_all_is_the_public_surface() -> None:
    assert set(sdk.__all__) == EXPECTED
    assert len(sdk.__all__) == len(set(sdk.__all__))
    for name in sdk.__all__:
        obj = getattr(sdk, name)
        assert not name.startswith("_")
        assert obj.__doc__, f"{name} needs a docstring"


def test_unknown_phase_fails_at_once() -> None:
    with pytest.raises(ValueError, match="prefill"):
        sdk.phase("prefil")


def test_configure_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        sdk.configure("svc")  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs",
    [{"max_tokens_per_span": -1}, {"gpu_sample_hz": -2}, {"clock": 5}, {"gpu": "yes"}],
)
def test_configure_rejects_bad_values(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        sdk.configure(**kwargs)


def test_inference_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="operation"):
        sdk.inference(operation="")
    with pytest.raises(ValueError):
        sdk.inference(42)  # type: ignore[call-overload]
