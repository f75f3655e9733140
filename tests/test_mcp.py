"""``latscope mcp`` driven by the official MCP SDK's own client, over stdio (the client starts
the command) and streamable HTTP, against a running ``latscope serve`` holding requests, agent
runs and a conversation: every tool listed with the route's description and parameters and the
answer model's schema, every tool called and its answer the REST API's; the bearer token."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from latscope.api.schemas import Heatmap
from latscope.mcp.server import TOOLS, heatmap_table, input_schema, output_schema
from tests.agent_surfaces import export, recent_run, wait_stored
from tests.serve_support import Server, start_serve
from tests.surfaces import FAST_ATTRIBUTION, dataset, send, wait_attributed

pytestmark = pytest.mark.subprocess

TALK = "oncall-talk-1"
TOKEN = "mcp-test-token"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A serve holding the surfaces dataset, and two agent runs that make one conversation."""
    server = start_serve(tmp_path_factory.mktemp("mcp") / "store", *FAST_ATTRIBUTION)
    try:
        specs = send(server.grpc, dataset(time.time_ns()))
        runs = [recent_run(0, ago_s=240), recent_run(16, ago_s=120)]
        for run in runs:
            root = next(s for s in run.built.spans if s.span_id.hex() == run.root_span_id)
            kv = root.attributes.add()
            kv.key, kv.value.string_value = "gen_ai.conversation.id", TALK
            export(server.grpc, run)
        for run in runs:
            wait_stored(server, run)
        wait_attributed(server, len(specs) + sum(len(r.requests) for r in runs))
        stamp = "%Y-%m-%dT%H:%M:%SZ"
        now, since = (time.strftime(stamp, time.gmtime(time.time() - ago)) for ago in (0, 7200))
        yield {"server": server, "specs": specs, "runs": runs, "now": now, "since": since}
    finally:
        server.stop()


def _rest(server: Server, path: str, **params: Any) -> Any:
    response = httpx.get(server.url(path), params=params, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def _calls(data: dict[str, Any]) -> dict[str, tuple[dict[str, Any], str | None, dict[str, Any]]]:
    """Per tool: its arguments, and the REST path and parameters whose answer it must equal
    (None: the answer changes with the clock, it is only checked against its model)."""
    server, specs, runs, now = data["server"], data["specs"], data["runs"], data["now"]
    window = {"since": data["since"], "until": now}
    stepped, objective = {**window, "step": "5m"}, "ttft:500:0.99:30"
    slo = {"objective": objective, "at": now}
    request_id = _rest(server, f"/v1/requests/{specs[3].trace_id}/attribution")["request_id"]
    return {
        "diagnose": ({"since": "1h"}, None, {}),
        "summary": (window, "/v1/attribution/summary", window),
        "tail": (window, "/v1/attribution/tail", window),
        "compare": ({"after_since": "1h", "before_since": "3h", "before_until": "2h"}, None, {}),
        "why": ({"since": "1h", "attribute": ["tenant.id"]}, None, {}),
        "timeseries": (stepped, "/v1/attribution/timeseries", stepped),
        "heatmap": (stepped, "/v1/attribution/heatmap", stepped),
        "coldstart": ({"since": "1h"}, None, {}),
        "slo": ({"objective": [objective], "at": now}, "/v1/slo", slo),
        "explain_request": ({"request_id": request_id}, f"/v1/requests/{request_id}", {}),
        "explain_run": ({"trace_id": runs[0].trace_id}, f"/v1/traces/{runs[0].trace_id}/run", {}),
        "span": (
            {"trace_id": runs[0].trace_id, "span_id": runs[0].root_span_id},
            f"/v1/traces/{runs[0].trace_id}/spans/{runs[0].root_span_id}",
            {},
        ),
        "conversation": ({"conversation_id": TALK}, f"/v1/conversations/{TALK}", {}),
        "conversations": (window, "/v1/conversations", window),
        "slowest": ({**window, "limit": 5}, "/v1/requests", {**window, "limit": 5}),
        "services": (window, "/v1/services", window),
    }


async def _every_tool(client: Client, data: dict[str, Any]) -> None:
    """List every tool and call every one; each answer is the REST API's."""
    listed = {t.name: t for t in (await client.list_tools()).tools}
    assert set(listed) == {t.name for t in TOOLS}
    for tool in TOOLS:
        got = listed[tool.name]
        assert got.input_schema == input_schema(tool), tool.name
        assert got.output_schema == output_schema(tool), tool.name
        assert got.annotations is not None and got.annotations.read_only_hint is True
        assert got.description and "(GET /v1/" in got.description
    calls = _calls(data)
    assert set(calls) == set(listed)  # every tool is called
    for tool in TOOLS:
        arguments, path, params = calls[tool.name]
        result = await client.call_tool(tool.name, arguments)
        text = result.content[0].text  # type: ignore[union-attr]
        assert not result.is_error, (tool.name, text)
        answer = tool.model.model_validate(result.structured_content)
        if path is None:
            continue
        rest = _rest(data["server"], path, **params)
        if tool.name == "heatmap":
            assert answer == heatmap_table(Heatmap.model_validate(rest))
            assert text.splitlines()[1].split()[:2] == ["time", "(UTC)"]
        else:
            assert result.structured_content == rest, tool.name
    bad = await client.call_tool("explain_request", {"request_id": "not-an-id"})
    assert bad.is_error and "invalid_request_id" in bad.content[0].text  # type: ignore[union-attr]


def test_an_mcp_client_lists_and_calls_every_tool_over_stdio(data: dict[str, Any]) -> None:
    server = data["server"]
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "latscope.cli", "mcp", "--url", server.http]
    )

    async def session() -> None:
        async with Client(params) as client:
            await _every_tool(client, data)

    asyncio.run(session())


class McpHttp:
    """``latscope mcp --transport http`` on a free port, until stopped."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "latscope.cli", "mcp", "--transport", "http",
             "--listen", "127.0.0.1:0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(self.proc.stdout or []), daemon=True)
        reader.start()
        deadline = time.monotonic() + 60
        while not any("streamable HTTP on" in line for line in lines):
            assert self.proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.05)
        self.url = re.search(r"(http://\S+/mcp)", "".join(lines)).group(1)  # type: ignore[union-attr]
        self._reader = reader

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@asynccontextmanager
async def _client(url: str, token: str = "") -> AsyncIterator[Client]:
    """The SDK's client over streamable HTTP, sending ``token`` when given."""
    headers = {"authorization": f"Bearer {token}"} if token else None
    # A client passed to the transport is the caller's to close.
    async with (
        create_mcp_http_client(headers=headers) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        yield client


def test_an_mcp_client_lists_and_calls_every_tool_over_http(data: dict[str, Any]) -> None:
    mcp = McpHttp("--url", data["server"].http)
    try:

        async def session() -> None:
            async with _client(mcp.url) as client:
                await _every_tool(client, data)

        asyncio.run(session())
    finally:
        mcp.stop()


def test_the_http_endpoint_and_the_api_take_the_same_token(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    folder = tmp_path_factory.mktemp("mcp-token")
    (folder / "token").write_text(TOKEN + "\n")
    (folder / "wrong").write_text("not-the-token\n")
    server = start_serve(folder / "store", env={"LATSCOPE_TOKEN": TOKEN})
    good = McpHttp("--url", server.http, "--token-file", str(folder / "token"))
    wrong = McpHttp("--url", server.http, "--token-file", str(folder / "wrong"))
    try:
        # No token, or the wrong one: the endpoint refuses before any MCP is spoken.
        for headers in ({}, {"authorization": "Bearer nope"}):
            refused = httpx.post(good.url, json={}, headers=headers, timeout=10)
            assert refused.status_code == 401
            assert refused.headers["www-authenticate"] == "Bearer"

        async def session() -> None:
            async with _client(good.url, TOKEN) as client:
                tools = (await client.list_tools()).tools
                assert len(tools) == len(TOOLS)
                # The token reached the API too: an empty store's services, not a 401.
                result = await client.call_tool("services", {"since": "1h"})
                assert not result.is_error and result.structured_content["services"] == []
            async with _client(wrong.url, "not-the-token") as client:
                result = await client.call_tool("services", {"since": "1h"})
                assert result.is_error
                assert "needs a token" in result.content[0].text  # type: ignore[union-attr]

        asyncio.run(session())
    finally:
        good.stop()
        wrong.stop()
        server.stop()
