"""latscope's answers as tools for an MCP client (an on-call agent): ``latscope mcp``.

>>> from latscope.mcp import TOOLS, build_server  # doctest: +SKIP
"""

from __future__ import annotations

from latscope.mcp.server import TOOLS, McpTool, build_server, serve_http, serve_stdio

__all__ = ["TOOLS", "McpTool", "build_server", "serve_http", "serve_stdio"]
