"""Conversations across traces."""

from __future__ import annotations

from pydantic import Field

from latscope.api.schemas.trace import RUN_EXAMPLE, PathStep, RunBudget, RunRoot
from latscope.attribution.answers.models.base import TRACE_ID_EXAMPLE, Answer, _example, _means
from latscope.attribution.answers.models.conversations import (
    CONVERSATION_ID_EXAMPLE,
)


class ConversationTurn(Answer):
    """One turn: a trace of the conversation, explained as a run."""

    trace_id: str
    start: str = Field(description="the root span's start, RFC 3339")
    offset_ms: float = Field(description="from the first turn's start")
    gap_ms: float | None = Field(
        description="since the previous turn ended (negative: they overlap); null for the first"
    )
    e2e_ms: float = Field(description="the root span's duration")
    root: RunRoot
    critical_path_ms: RunBudget
    calls: int = Field(description="inference calls in the turn")
    tools: int = Field(description="tool calls in the turn")
    path: list[PathStep] = Field(description="the turn's critical path, ms from its root's start")


class ConversationTool(Answer):
    tool: str = Field(description="gen_ai.tool.name (the span name when it has none)")
    calls: int
    on_critical_path_ms: float


CONVERSATION_EXAMPLE = {
    "conversation_id": CONVERSATION_ID_EXAMPLE,
    "turn_count": 2,
    "truncated": False,
    "start": "2026-01-02T15:00:00Z",
    "end": "2026-01-02T15:01:03.6Z",
    "duration_ms": 63600.0,
    "busy_ms": 3600.0,
    "critical_path_ms": {
        "llm": 2000.0,
        "llm_buckets": _means(prefill=400.0, decode=1560.0),
        "tool": 1300.0,
        "app": 300.0,
    },
    "tools": [{"tool": "search", "calls": 2, "on_critical_path_ms": 1300.0}],
    "turns": [{
        "trace_id": TRACE_ID_EXAMPLE,
        "start": "2026-01-02T15:00:00Z",
        "offset_ms": 0.0,
        "gap_ms": None,
        "e2e_ms": 1800.0,
        "root": RUN_EXAMPLE["root"],
        "critical_path_ms": RUN_EXAMPLE["critical_path_ms"],
        "calls": 1,
        "tools": 1,
        "path": RUN_EXAMPLE["path"],
    }],
}  # fmt: skip


class Conversation(Answer):
    """A conversation across traces (``gen_ai.conversation.id``, OpenInference's ``session.id``
    or traceloop's session id): its turns in order, each turn's critical path, and the time of
    the turns shown by bucket, tool and app (summed over their critical paths)."""

    model_config = _example(CONVERSATION_EXAMPLE)

    conversation_id: str
    turn_count: int = Field(description="traces of the conversation")
    truncated: bool = Field(description="only the latest turns are shown (limit_turns)")
    start: str = Field(description="the first shown turn's start, RFC 3339")
    end: str = Field(description="the last shown turn's end, RFC 3339")
    duration_ms: float = Field(description="from the first shown turn's start to the last's end")
    busy_ms: float = Field(description="the shown turns' e2e, added up")
    critical_path_ms: RunBudget = Field(
        description="the shown turns' critical paths added up: LLM buckets, tools, app"
    )
    tools: list[ConversationTool] = Field(description="per tool, most time on the path first")
    turns: list[ConversationTurn]
