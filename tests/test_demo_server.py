"""The simulated LLM server over real HTTP: OpenAI's client talks to it, errors are OpenAI-shaped,
and it keeps the ground truth of every request. Its SDK points at a port nobody listens on: the
server must not care."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import openai
import pytest

from latscope.demo import processes


@pytest.fixture(scope="module")
def simulator() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # closed again when the block ends: nobody listens there
    # Its last export at shutdown fails fast instead of waiting out the default timeout.
    child = processes.start_simulator(
        "healthy", f"http://127.0.0.1:{dead}", 0.0, env={"LATSCOPE_EXPORT_TIMEOUT_S": "1"}
    )
    try:
        yield child.found["url"]
    finally:
        assert child.stop() == 0, child.tail()


def test_openai_client_streams_and_gets_usage(simulator: str) -> None:
    client = openai.OpenAI(base_url=simulator + "/v1", api_key="unused")
    stream = client.chat.completions.create(
        model="sim-llama-3-8b",
        messages=[{"role": "user", "content": "one two three four"}],
        max_tokens=7,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"x-request-id": "stream-1"},
    )
    pieces, usage = [], None
    for event in stream:
        if event.usage:
            usage = event.usage
        for choice in event.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
    assert len(pieces) == 7
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (4 + 4, 7)


def test_openai_client_one_answer(simulator: str) -> None:
    client = openai.OpenAI(base_url=simulator + "/v1", api_key="unused")
    answer = client.chat.completions.create(
        model="sim-llama-3-8b",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        max_tokens=3,
        extra_headers={"x-request-id": "json-1"},
    )
    assert answer.choices[0].finish_reason == "length"
    assert len(answer.choices[0].message.content.split()) == 3
    assert answer.usage.prompt_tokens == 2 + 1 + 2 * 4


def test_bad_requests_get_openai_shaped_errors(simulator: str) -> None:
    r = httpx.post(simulator + "/v1/chat/completions", json={"messages": [], "max_tokens": 0})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and "messages" in error["message"]
    r = httpx.post(
        simulator + "/v1/chat/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400


def test_truth_has_every_phase_and_adds_up(simulator: str) -> None:
    httpx.post(
        simulator + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "a b"}], "max_tokens": 5, "stream": True},
        headers={"x-request-id": "truth-1"},
        timeout=30,
    ).raise_for_status()
    truth = httpx.get(simulator + "/demo/truth").json()
    record = next(r for r in truth["requests"] if r["request_id"] == "truth-1")
    phases = record["phases_ns"]
    assert set(phases) == {"preprocess", "queue", "prefill", "decode", "postprocess"}
    server_low, server_high = record["server_ns"]
    assert 0 < server_low <= server_high
    for low, high in phases.values():
        assert 0 <= low <= high
    assert sum(low for low, _ in phases.values()) <= server_high
    assert record["output_tokens"] == 5 and record["status"] == 200
    stats = httpx.get(simulator + "/demo/stats").json()
    assert stats["prefill_steps"] >= 1 and stats["decode_steps"] >= 4
