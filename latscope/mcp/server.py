"""The MCP server (the official ``mcp`` SDK's low-level ``Server``) over a latscope source.

Every tool is one read-only REST query (``TOOLS``): the tool's description is the route's, its
input schema the route's parameters as the OpenAPI document publishes them (bounds, patterns,
descriptions), its output schema the JSON schema of the answer's model
(``latscope.api.schemas``), and its result that answer, as structured content and as JSON text.
The heatmap's result is a compact table instead (``HeatmapTable``): a grid of counts reads
better as text than as nested arrays.

A tool call asks the source the CLI asks (``latscope.cmd._source``): a running API (``--url``,
with the bearer token of ``--token-file`` / ``LATSCOPE_TOKEN``), so the API's checks, token and
query time limit (``--query-timeout-s``) apply, or a store directly (``--store``). Over streamable
HTTP the MCP endpoint itself needs the same token (``authorization: Bearer``) when one is set.
An answer the API refuses is a tool error whose text says what to change.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from functools import cache
from typing import Any, cast

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from pydantic import BaseModel

from latscope import __version__
from latscope.api import schemas
from latscope.api.schemas import Answer, HeatmapTable
from latscope.auth import UNAUTHORIZED, bearer_ok
from latscope.cmd._source import ANSWERS, QUERIES, Source, SourceError

log = logging.getLogger(__name__)

__all__ = ["TOOLS", "McpTool", "build_server", "heatmap_table", "serve_http", "serve_stdio"]

INSTRUCTIONS = """latscope splits every AI inference request's end-to-end latency into seven
buckets that add up: network, queue, preprocess, prefill, decode, postprocess, other. Times are
milliseconds. Windows take RFC 3339 or a span before now (15m, 2h, 7d). Start with diagnose (the
usual cause, where and since when) or slo (which objective burns, and into which bucket), then
tail, why and compare to narrow it down; explain_request and explain_run open one request or one
agent run (long attribute values cut; span reads one span whole), conversation a whole session
across traces; slowest and services list ids and names to ask about."""


@dataclass(frozen=True)
class McpTool:
    """One tool: the query it asks (``QUERIES``), and a short title."""

    name: str
    query: str
    title: str
    #: Turns the answer into the tool's result (default: the answer itself).
    shape: Callable[[Any], Answer] | None = None
    #: The model of the result when ``shape`` changes it.
    result: type[Answer] | None = None

    @property
    def model(self) -> type[Answer]:
        return self.result or cast(type[Answer], getattr(schemas, ANSWERS[self.query]))


def heatmap_table(heat: schemas.Heatmap) -> HeatmapTable:
    """A heatmap as a table: a row per time step with requests, a column per latency bin with
    requests (latency rows become columns: a table is read across), counts in the cells."""
    used = [j for j, _ in enumerate(heat.bins) if any(row[j] for row in heat.counts)]
    zero = any(heat.zero_counts)
    columns = (["0 ms"] if zero else []) + [
        f"{heat.bins[j].lo_ms:.4g}-{heat.bins[j].hi_ms:.4g} ms" for j in used
    ]
    rows = []
    for t, counts, zeros in zip(heat.times_ns, heat.counts, heat.zero_counts, strict=True):
        cells = ([zeros] if zero else []) + [counts[j] for j in used]
        if any(cells):
            rows.append({"start_ns": t, "counts": cells, "total": sum(cells)})
    return HeatmapTable.model_validate(
        {
            "window": heat.window.model_dump(),
            "metric": heat.metric,
            "step_s": heat.step_s,
            "count": heat.count,
            "columns": columns,
            "rows": rows,
        }
    )


TOOLS: tuple[McpTool, ...] = (
    McpTool("diagnose", "diagnose", "The usual cause, its first fixes, where and since when"),
    McpTool("summary", "summary", "Latency budget: percentiles and share per bucket"),
    McpTool("tail", "tail", "Where the slowest requests spend their extra time"),
    McpTool("compare", "compare", "Two windows bucket by bucket, and what moved"),
    McpTool("why", "why", "What the slow (or SLO-missing) requests have in common"),
    McpTool("timeseries", "timeseries", "Every figure per time step: since when"),
    McpTool(
        "heatmap",
        "heatmap",
        "Requests per time step and latency bin (a compact table)",
        shape=heatmap_table,
        result=HeatmapTable,
    ),
    McpTool("coldstart", "coldstart", "New replicas and their warm-up requests"),
    McpTool("slo", "slo", "Error budget, burn rates and where the budget went"),
    McpTool("explain_request", "explain", "One request: buckets, percentile, spans, tokens"),
    McpTool("explain_run", "run", "An agent run (a trace): critical path in LLM, tool, app"),
    McpTool("span", "span", "One span as stored: every attribute value whole (a prompt)"),
    McpTool("conversation", "conversation", "An agent's session across traces, turn by turn"),
    McpTool("conversations", "conversations", "The conversations of a window"),
    McpTool("slowest", "requests", "The slowest requests of a window, with their ids"),
    McpTool("services", "services", "The services and models seen, with request counts"),
)


@cache
def _openapi() -> dict[str, Any]:
    """The REST API's OpenAPI document, built from the routes themselves (no store is read)."""
    from fastapi import FastAPI

    from latscope.api.routes import v1_router
    from latscope.config import Settings
    from latscope.storage import Store

    app = FastAPI()
    app.include_router(v1_router(cast(Store, None), Settings()))
    return app.openapi()


def _operation(tool: McpTool) -> dict[str, Any]:
    path = QUERIES[tool.query][0]
    paths = _openapi()["paths"]
    # A path parameter may be declared with a converter ({conversation_id:path}).
    found = {p.replace(":path}", "}"): item for p, item in paths.items()}
    return cast(dict[str, Any], found[path]["get"])


def input_schema(tool: McpTool) -> dict[str, Any]:
    """The route's parameters (query and path) as one JSON schema object."""
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in _operation(tool).get("parameters", []):
        schema = dict(param["schema"])
        schema.pop("title", None)
        if param.get("description"):
            schema["description"] = param["description"]
        properties[param["name"]] = schema
        if param.get("required"):
            required.append(param["name"])
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def description(tool: McpTool) -> str:
    """The route's own description (its docstring), and the REST path it is."""
    op = _operation(tool)
    return f"{op.get('description') or op.get('summary', '')}\n\n(GET {QUERIES[tool.query][0]})"


def output_schema(tool: McpTool) -> dict[str, Any]:
    return tool.model.model_json_schema(mode="serialization")


def tool_list() -> list[types.Tool]:
    return [
        types.Tool(
            name=t.name,
            title=t.title,
            description=description(t),
            input_schema=input_schema(t),
            output_schema=output_schema(t),
            annotations=types.ToolAnnotations(
                title=t.title,
                read_only_hint=True,
                destructive_hint=False,
                idempotent_hint=True,
                open_world_hint=False,
            ),
        )
        for t in TOOLS
    ]


def _text(model: BaseModel, tool: McpTool) -> str:
    if isinstance(model, HeatmapTable):
        return model.as_text()
    return json.dumps(model.model_dump(mode="json"), separators=(",", ":"))


def call(source: Source, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
    """One tool call, answered from ``source`` (blocking: the server runs it on a thread)."""
    tool = next((t for t in TOOLS if t.name == name), None)
    if tool is None:
        return _error(f"no tool {name!r}: the tools are {', '.join(t.name for t in TOOLS)}")
    try:
        body = source.query(tool.query, **arguments)
    except SourceError as exc:
        return _error(str(exc))
    except TypeError as exc:  # a direct (--store) query given an argument it does not take
        return _error(f"{name}: {exc}")
    answer = tool.shape(body) if tool.shape else body
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=_text(answer, tool))],
        structured_content=answer.model_dump(mode="json"),
    )


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


def build_server(source: Source) -> Server[Any]:
    """The MCP server answering every tool of ``TOOLS`` from ``source``."""

    async def list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tool_list())

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        arguments = dict(params.arguments or {})
        return await anyio.to_thread.run_sync(call, source, params.name, arguments)

    return Server(
        "latscope",
        version=__version__,
        title="latscope: where the time of AI inference requests went",
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def serve_stdio(source: Source) -> None:
    """Serve over the process's stdin and stdout until the client closes them."""
    from mcp.server.stdio import stdio_server

    server = build_server(source)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


def _require_token(app: ASGIApp, token: str) -> ASGIApp:
    """``app`` behind latscope's bearer check: 401 (``WWW-Authenticate: Bearer``) without it."""

    async def guarded(
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            given = headers.get(b"authorization", b"").decode("latin-1")
            if not bearer_ok(given, token):
                body = json.dumps({"error": "unauthorized", "detail": UNAUTHORIZED}).encode()
                await send({
                    "type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"),
                                (b"www-authenticate", b"Bearer")],
                })  # fmt: skip
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return guarded


def http_app(source: Source, *, host: str, token: str = "") -> ASGIApp:
    """The streamable HTTP app (endpoint ``/mcp``), behind the token when one is set."""
    server = build_server(source)
    app = server.streamable_http_app(streamable_http_path="/mcp", host=host)
    return _require_token(cast(ASGIApp, app), token) if token else cast(ASGIApp, app)


def serve_http(source: Source, *, listen: str, token: str = "") -> None:
    """Serve streamable HTTP on ``listen`` (``HOST:PORT``; port 0 picks one) at ``/mcp`` until
    SIGTERM or Ctrl-C; prints the address bound."""
    import uvicorn

    from latscope.config import Settings, parse_hostport
    from latscope.serve import bind_http

    host, _ = parse_hostport(listen, name="--listen")
    sock, address = bind_http(Settings(http=listen))
    config = uvicorn.Config(
        http_app(source, host=host, token=token), log_level="warning", lifespan="on"
    )
    print(f"latscope mcp: streamable HTTP on http://{address}/mcp", flush=True)
    uvicorn.Server(config).run(sockets=[sock])
