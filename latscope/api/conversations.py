"""Answers about conversations across traces (``latscope.attribution.conversations``): one
conversation's turns, each explained as a run, and the conversations of a window. The REST API
serves them (``/v1/conversations``), the CLI renders them (``latscope conversation``), the MCP
server lists them as tools.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from latscope.api.errors import InvalidParameter, NotFound
from latscope.api.queries import time_range
from latscope.api.schemas import Conversation, Conversations
from latscope.api.trace import DEFAULT_STALL_MS, run_answer
from latscope.attribution import conversations as found
from latscope.attribution.answers.models.base import format_ns
from latscope.semconv import BUCKETS
from latscope.storage import Store

__all__ = ["DEFAULT_TURNS", "MAX_CONVERSATIONS", "MAX_TURNS", "conversation", "conversations"]

DEFAULT_TURNS, MAX_TURNS = found.DEFAULT_TURNS, found.MAX_TURNS
MAX_CONVERSATIONS = found.MAX_CONVERSATIONS

#: A conversation id is an attribute value: any text, bounded.
MAX_ID_CHARS = 256


def conversation(
    store: Store,
    conversation_id: str,
    *,
    limit_turns: int = DEFAULT_TURNS,
    stall_threshold_ms: float = DEFAULT_STALL_MS,
) -> Conversation:
    """``GET /v1/conversations/{id}``: the conversation's latest ``limit_turns`` turns in order,
    each with its critical path, and their time by bucket, tool and app."""
    if not conversation_id or len(conversation_id) > MAX_ID_CHARS:
        raise InvalidParameter(
            "invalid_conversation_id", f"a conversation id has 1 to {MAX_ID_CHARS} characters"
        )
    explained = found.explain_conversation(
        store,
        conversation_id,
        max_turns=limit_turns,
        stall_threshold_ns=round(stall_threshold_ms * 1e6),
    )
    if explained is None or not explained.turns:
        raise NotFound(
            "conversation_not_found",
            f"no span carries the conversation id {conversation_id!r} (gen_ai.conversation.id, "
            "session.id or traceloop.association.properties.session_id)",
        )
    runs = [run_answer(r) for r in explained.turns]
    first = explained.turns[0].root.start_ns
    ends = [r.root.start_ns + r.e2e_ns for r in explained.turns]
    turns = []
    for i, (run, raw) in enumerate(zip(runs, explained.turns, strict=True)):
        turns.append(
            {
                "trace_id": run.trace_id,
                "start": format_ns(raw.root.start_ns),
                "offset_ms": (raw.root.start_ns - first) / 1e6,
                "gap_ms": None if i == 0 else (raw.root.start_ns - ends[i - 1]) / 1e6,
                "e2e_ms": run.e2e_ms,
                "root": run.root,
                "critical_path_ms": run.critical_path_ms,
                "calls": len(run.calls),
                "tools": len(run.tools),
                "path": run.path,
            }
        )
    budget: dict[str, Any] = {"llm": 0.0, "llm_buckets": dict.fromkeys(BUCKETS, 0.0)}
    budget.update(tool=0.0, app=0.0)
    tools: dict[str, list[float]] = defaultdict(list)
    for run in runs:
        path = run.critical_path_ms
        budget["llm"] += path.llm
        budget["tool"] += path.tool
        budget["app"] += path.app
        for bucket in BUCKETS:
            budget["llm_buckets"][bucket] += path.llm_buckets[bucket]
        for t in run.tools:
            tools[t["tool"] or t["name"]].append(t["on_critical_path_ms"])
    return Conversation.model_validate(
        {
            "conversation_id": conversation_id,
            "turn_count": explained.turn_count,
            "truncated": explained.truncated,
            "start": format_ns(first),
            "end": format_ns(max(ends)),
            "duration_ms": (max(ends) - first) / 1e6,
            "busy_ms": sum(run.e2e_ms for run in runs),
            "critical_path_ms": budget,
            "tools": sorted(
                (
                    {"tool": name, "calls": len(times), "on_critical_path_ms": sum(times)}
                    for name, times in tools.items()
                ),
                key=lambda t: (-t["on_critical_path_ms"], t["tool"]),
            ),
            "turns": turns,
        }
    )


def conversations(
    store: Store,
    *,
    since: str | None = None,
    until: str | None = None,
    service: str | None = None,
    limit: int = 50,
) -> Conversations:
    """``GET /v1/conversations``: the conversations with spans in the window, the latest
    first."""
    r = time_range(since, until)
    return found.conversations(
        store, since_ns=r.since_ns, until_ns=r.until_ns, service=service, limit=limit
    )
