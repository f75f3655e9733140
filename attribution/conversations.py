"""Conversations across traces: an agent's session, one trace per turn (or several, where the
context was not propagated), grouped by the conversation id its spans carry
(``semconv.CONVERSATION_KEYS``: ``gen_ai.conversation.id``, OpenInference's ``session.id``,
traceloop's session association property).

ClickHouse does the grouping: the spans table stores each span's conversation id in
``LatscopeConversationId`` with a bloom filter on it (deploy/clickhouse/013_conversations.sql),
so a conversation's traces are one indexed ``GROUP BY TraceId`` over the whole retention, and the
conversations of a window one ``GROUP BY`` over its spans. Each turn is then explained as a run
(``runs.explain_run``: its critical path in LLM buckets, tool and app time) from its own spans, at
most ``max_turns`` of them (the latest): the cost of a conversation's answer follows the turns it
shows, not the traffic stored.

>>> c = explain_conversation(store, "conv-7")  # doctest: +SKIP
>>> [t.trace_id for t in c.turns], c.turn_count  # doctest: +SKIP
(['4bf9...', '9a01...'], 2)
"""

from __future__ import annotations

from dataclasses import dataclass

from latscope.attribution.answers.common import bounded
from latscope.attribution.answers.models import Conversations, ConversationSeen, Window, format_ns
from latscope.attribution.runs import RunExplanation, explain_run
from latscope.attribution.spans import load_trace
from latscope.storage import SPANS_TABLE, Store
from latscope.tokens import DEFAULT_STALL_NS

__all__ = [
    "DEFAULT_TURNS",
    "MAX_CONVERSATIONS",
    "MAX_TURNS",
    "ConversationExplanation",
    "ConversationTrace",
    "conversation_traces",
    "conversations",
    "explain_conversation",
]

#: Turns explained by default, and at most (each is one trace read and walked in Python).
DEFAULT_TURNS = 50
MAX_TURNS = 500
#: Conversations one listing answers with at most.
MAX_CONVERSATIONS = 500

#: The traces of one conversation, by their first span carrying its id.
CONVERSATION_TRACES = f"""
SELECT TraceId AS trace_id, toUnixTimestamp64Nano(min(Timestamp)) AS first_ns
FROM {SPANS_TABLE}
WHERE LatscopeConversationId = {{conversation_id:String}}
GROUP BY TraceId
ORDER BY first_ns, trace_id
"""

#: The conversations with spans in a window, the latest first.
CONVERSATIONS = f"""
SELECT
    LatscopeConversationId AS conversation_id,
    uniqExact(TraceId) AS traces,
    toUnixTimestamp64Nano(min(Timestamp)) AS first_ns,
    max(toUnixTimestamp64Nano(Timestamp) + Duration) AS last_ns,
    arraySort(groupUniqArray(16)(ServiceName)) AS services
FROM {SPANS_TABLE}
WHERE Timestamp >= fromUnixTimestamp64Nano({{since_ns:Int64}})
  AND Timestamp < fromUnixTimestamp64Nano({{until_ns:Int64}})
  AND LatscopeConversationId != ''
GROUP BY conversation_id
HAVING {{service:String}} = '' OR has(services, {{service:String}})
ORDER BY last_ns DESC, conversation_id
LIMIT {{limit:UInt32}}
"""


@dataclass
class ConversationExplanation:
    """A conversation's latest ``max_turns`` turns, each a trace explained as a run, in the
    order they started; ``turn_count`` counts every trace of the conversation, ``truncated``
    says that only the latest ``max_turns`` of them were explained."""

    conversation_id: str
    turn_count: int
    turns: list[RunExplanation]
    truncated: bool


@dataclass(frozen=True)
class ConversationTrace:
    """A trace of a conversation and when its first span carrying the id started."""

    trace_id: str
    first_ns: int


def conversation_traces(store: Store, conversation_id: str) -> list[ConversationTrace]:
    """Every trace of the conversation, by ``first_ns`` (its first span carrying the id)."""
    rows = store.query_rows(CONVERSATION_TRACES, {"conversation_id": conversation_id})
    return [ConversationTrace(trace_id, int(first_ns)) for trace_id, first_ns in rows]


def conversations(
    store: Store, *, since_ns: int, until_ns: int, service: str | None = None, limit: int = 50
) -> Conversations:
    """The conversations with spans in ``[since_ns, until_ns)`` (``service``: those with a span
    of it), the latest first, at most ``limit`` (up to ``MAX_CONVERSATIONS``); ``first`` and
    ``last`` span the window's spans only."""
    params = {
        "since_ns": int(since_ns),
        "until_ns": int(until_ns),
        "service": service or "",
        "limit": bounded(limit, 1, MAX_CONVERSATIONS),
    }
    return Conversations(
        window=Window.of(since_ns, until_ns),
        conversations=[
            ConversationSeen(
                conversation_id=row["conversation_id"],
                traces=row["traces"],
                first=format_ns(row["first_ns"]),
                last=format_ns(row["last_ns"]),
                services=row["services"],
            )
            for row in store.query_arrow(CONVERSATIONS, params).to_pylist()
        ],
    )


def explain_conversation(
    store: Store,
    conversation_id: str,
    *,
    max_turns: int = DEFAULT_TURNS,
    stall_threshold_ns: int = DEFAULT_STALL_NS,
) -> ConversationExplanation | None:
    """The conversation's latest ``max_turns`` turns (up to ``MAX_TURNS``) explained as runs,
    ordered by their roots' starts; None when no span carries ``conversation_id``."""
    traces = conversation_traces(store, conversation_id)
    if not traces:
        return None
    shown = bounded(max_turns, 1, MAX_TURNS)
    turns = []
    for seen in traces[-shown:]:
        run = explain_run(seen.trace_id, load_trace(store, seen.trace_id),
                          stall_threshold_ns=stall_threshold_ns)  # fmt: skip
        if run is not None:
            turns.append(run)
    turns.sort(key=lambda r: (r.root.start_ns, r.trace_id))
    return ConversationExplanation(conversation_id, len(traces), turns, len(traces) > shown)
