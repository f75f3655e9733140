"""Response models of the REST API: they document the JSON (with examples) in the OpenAPI spec.

Times are milliseconds as floats. Every route returns one of these models, built once: the
answers about many requests are the domain's own (``latscope.attribution.answers.models``,
re-exported here), built by the functions that compute their figures; the rest are grouped by
family below.

=================  =============================================================================
``trace``          one request and one trace: attribution, spans, tokens, run, live
``service``        health and the attributor's set-aside traces
``conversations``  conversations across traces
``tables``         the heatmap as a table (the MCP server's heatmap tool)
=================  =============================================================================
"""

from __future__ import annotations

from latscope.api.schemas.conversations import (
    CONVERSATION_EXAMPLE,
    Conversation,
    ConversationTool,
    ConversationTurn,
)
from latscope.api.schemas.service import Health, SetAsideTrace, SetAsideTraces
from latscope.api.schemas.tables import HeatmapRow, HeatmapTable
from latscope.api.schemas.trace import (
    RUN_EXAMPLE,
    SPAN_EXAMPLE,
    TOKENS_EXAMPLE,
    Attribution,
    Explain,
    Live,
    LiveRequest,
    PathBuckets,
    PathStep,
    RequestTokens,
    Run,
    RunBudget,
    RunCall,
    RunRoot,
    RunTool,
    Span,
    SpanEvent,
    Stall,
    StoredEvent,
    StoredLink,
    StoredSpan,
    TokenTimeline,
    TraceExplain,
    TraceRequests,
    TraceSpans,
)
from latscope.attribution.answers.models import *  # noqa: F403 (every answer model, re-exported)
from latscope.attribution.answers.models import __all__ as _answers

__all__ = [
    *_answers,
    "Attribution",
    "CONVERSATION_EXAMPLE",
    "Conversation",
    "ConversationTool",
    "ConversationTurn",
    "Explain",
    "Health",
    "HeatmapRow",
    "HeatmapTable",
    "Live",
    "LiveRequest",
    "PathBuckets",
    "PathStep",
    "RUN_EXAMPLE",
    "RequestTokens",
    "Run",
    "RunBudget",
    "RunCall",
    "RunRoot",
    "RunTool",
    "SPAN_EXAMPLE",
    "SetAsideTrace",
    "SetAsideTraces",
    "Span",
    "SpanEvent",
    "Stall",
    "StoredEvent",
    "StoredLink",
    "StoredSpan",
    "TOKENS_EXAMPLE",
    "TokenTimeline",
    "TraceExplain",
    "TraceRequests",
    "TraceSpans",
]
