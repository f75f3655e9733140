"""The conversations of a window (``conversations``)."""

from __future__ import annotations

from pydantic import Field

from latscope.attribution.answers.models.base import WINDOW_EXAMPLE, Answer, Window, _example

CONVERSATION_ID_EXAMPLE = "conv-5f1d7a"


class ConversationSeen(Answer):
    conversation_id: str
    traces: int = Field(description="traces with spans of the conversation in the window")
    first: str
    last: str
    services: list[str]


class Conversations(Answer):
    """The conversations with spans in the window, the latest first."""

    model_config = _example(
        {
            "window": WINDOW_EXAMPLE,
            "conversations": [
                {
                    "conversation_id": CONVERSATION_ID_EXAMPLE,
                    "traces": 2,
                    "first": "2026-01-02T15:00:00Z",
                    "last": "2026-01-02T15:01:03.6Z",
                    "services": ["agent", "llm-server"],
                }
            ],
        }
    )

    window: Window
    conversations: list[ConversationSeen]
