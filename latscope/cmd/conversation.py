"""``latscope conversation [ID]``: an agent's session across traces (named by
``gen_ai.conversation.id``, OpenInference's ``session.id`` or traceloop's session id): its turns
in order, each turn's critical path, and their time by bucket, tool and app. Without an id, the
conversations of the window, the latest first."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from latscope.cmd import _render as r
from latscope.cmd._source import add_filter_arguments, add_source_arguments, filters, run_query
from latscope.cmd.explain import (
    APP,
    RUN_COLOURS,
    RUN_GLYPHS,
    TOOL,
    budget_table,
    run_bar,
    run_parts,
)

if TYPE_CHECKING:
    from latscope.api.schemas import Conversations

HELP = "a conversation across traces (turns, critical paths, time by bucket, tool, app)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "id",
        metavar="ID",
        nargs="?",
        help="the conversation id (gen_ai.conversation.id, session.id or traceloop's "
        "session_id); without it, list the window's conversations",
    )
    parser.add_argument(
        "--turns", type=int, default=50, help="explain at most the latest N turns (default 50)"
    )
    parser.add_argument(
        "--limit", type=int, default=50, help="list at most N conversations (default 50)"
    )
    add_filter_arguments(parser)
    add_source_arguments(parser)


def _largest(budget: dict[str, Any]) -> str:
    parts = run_parts(budget)
    return max(parts, key=lambda k: parts[k]) if any(parts.values()) else "—"


def render(body: dict[str, Any]) -> None:
    out = r.console()
    header = Text(f"conversation {body['conversation_id']}", style="bold")
    shown = len(body["turns"])
    header.append(
        f"  {shown} turn(s)"
        + (f" (the latest of {body['turn_count']})" if body["truncated"] else "")
        + f"  {body['start']} → {body['end']} ({r.ms(body['duration_ms'])})"
        + f"  busy {r.ms(body['busy_ms'])}"
    )
    out.print(header)
    out.print("along the turns' critical paths, the time went to:")
    out.print(run_bar(run_parts(body["critical_path_ms"])))
    out.print(r.legend(RUN_COLOURS, RUN_GLYPHS))
    busy = {"e2e_ms": body["busy_ms"], "critical_path_ms": body["critical_path_ms"]}
    out.print(budget_table(busy, total="the turns' e2e"))
    out.print()
    out.print(Text("turns", style="bold"))
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("turn", "at", "gap", "e2e", "LLM", TOOL, APP, "most", "calls"):
        table.add_column(col, justify="left" if col == "most" else "right", no_wrap=True)
    for i, t in enumerate(body["turns"], 1):
        path = t["critical_path_ms"]
        table.add_row(
            str(i),
            r.ms(t["offset_ms"]),
            r.ms(t["gap_ms"]),
            r.ms(t["e2e_ms"]),
            r.ms(path["llm"]),
            r.ms(path["tool"]),
            r.ms(path["app"]),
            _largest(path),
            f"{t['calls']}/{t['tools']}",
        )
    out.print(table)
    # The ids on lines of their own, whole, to copy into `latscope explain`.
    for i, t in enumerate(body["turns"], 1):
        out.print(f"  turn {i}: {t['trace_id']}  {t['root']['name']} ({t['root']['service']})")
    out.print(
        "at: from the first turn's start; gap: idle since the previous turn ended; most: where "
        "most of the turn's critical path went; calls: inference calls / tool calls. "
        "`latscope explain TRACE_ID` opens a turn.",
        style="dim",
    )
    if body["tools"]:
        out.print()
        out.print(Text("tools", style="bold"))
        for t in body["tools"]:
            out.print(f"  {t['tool']}: {t['calls']} call(s), {r.ms(t['on_critical_path_ms'])} "
                      "on the critical path")  # fmt: skip


def render_list(body: Conversations) -> None:
    out = r.console()
    window = body.window
    found = body.conversations
    if not found:
        out.print(f"no conversation in {window.since} → {window.until} (no span carries "
                  "gen_ai.conversation.id, session.id or a traceloop session_id)")  # fmt: skip
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("conversation", "traces", "first", "last", "services"):
        table.add_column(col, justify="right" if col == "traces" else "left")
    for c in found:
        table.add_row(c.conversation_id, str(c.traces), c.first, c.last, ", ".join(c.services))
    out.print(Text(f"conversations {window.since} → {window.until}", style="bold"))
    out.print(table)


def main(args: argparse.Namespace) -> int:
    from latscope.api.schemas import Conversation, Conversations

    if args.id is None:
        params = {k: v for k, v in filters(args).items() if k != "model"}
        return run_query(
            args,
            "listing conversations",
            lambda source: source.ask(Conversations, "conversations", limit=args.limit, **params),
            render_list,
        )
    # A conversation's answer is rendered from its JSON.
    return run_query(
        args,
        "explaining the conversation",
        lambda source: source.ask(
            Conversation, "conversation", conversation_id=args.id, limit_turns=args.turns
        ),
        lambda answer: render(answer.json_dict()),
    )
