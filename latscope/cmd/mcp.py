"""``latscope mcp``: latscope's answers as read-only tools for an MCP client (an on-call agent),
over stdio (the client starts this command) or streamable HTTP (``--transport http``, endpoint
``/mcp``). Each tool asks a running API (``--url``) or a store (``--store``), as the query
commands do; with a token (``--token-file`` / ``LATSCOPE_TOKEN``) the API gets it, and the HTTP
endpoint asks for it too. ``--rules`` puts rule files in force for the answers worked out here
(with ``--store``), as ``latscope serve --rules`` does."""

from __future__ import annotations

import argparse
import sys

import anyio

from latscope.cmd._source import SourceError, _token, add_source_arguments, open_source
from latscope.cmd.rules import add_rules_argument, load_rules

HELP = "an MCP server: the answers as read-only tools for an on-call agent (stdio or HTTP)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--transport",
        choices=("stdio", "http"),
        default="stdio",
        help="stdio (default: the MCP client runs this command) or http (streamable HTTP)",
    )
    parser.add_argument(
        "--listen",
        default="127.0.0.1:8765",
        metavar="HOST:PORT",
        help="where --transport http listens (port 0 picks one; the address is printed)",
    )
    add_source_arguments(parser, json_flag=False)
    add_rules_argument(parser)


def main(args: argparse.Namespace) -> int:
    from latscope.attribution import rules
    from latscope.mcp import serve_http, serve_stdio

    book = load_rules(args.rules, "latscope mcp")
    if book is None:
        return 2
    # The answers worked out here (with --store) read traces by the same rulebook as serve's.
    rules.install(book)
    try:
        with open_source(args) as source:
            if args.transport == "stdio":
                anyio.run(serve_stdio, source)
            else:
                serve_http(source, listen=args.listen, token=_token(args))
    except SourceError as exc:
        print(f"latscope mcp: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"latscope mcp: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0
