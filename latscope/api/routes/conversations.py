"""The ``/v1`` routes about conversations across traces."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.responses import Response

from latscope.api import conversations as talks
from latscope.api.routes.params import MANY, ONE, Service, Since, Until, served
from latscope.api.schemas import (
    Conversation,
    Conversations,
)
from latscope.config import Settings
from latscope.storage import Store


def add_conversation_routes(router: APIRouter, store: Store, settings: Settings) -> None:
    """The conversations of a window, and one conversation across its traces."""
    stall = settings.stall_threshold_ms

    @router.get(
        "/conversations", tags=["conversations"], response_model=Conversations, responses=MANY
    )
    def conversations(
        since: Since = None,
        until: Until = None,
        service: Service = None,
        limit: Annotated[
            int,
            Query(description="most conversations, latest first", ge=1,
                  le=talks.MAX_CONVERSATIONS),
        ] = 50,
    ) -> Response:  # fmt: skip
        """The conversations with spans in the window, the latest first: an agent's session
        across traces, named by gen_ai.conversation.id, OpenInference's session.id or
        traceloop's session id."""
        return served(
            talks.conversations(store, since=since, until=until, service=service, limit=limit)
        )

    @router.get(
        "/conversations/{conversation_id:path}",
        tags=["conversations"],
        response_model=Conversation,
        responses=ONE,
    )
    def conversation(
        conversation_id: Annotated[
            str,
            Path(
                description="the value of gen_ai.conversation.id (or session.id, or "
                "traceloop.association.properties.session_id) on the conversation's spans",
                max_length=talks.MAX_ID_CHARS,
                examples=["conv-5f1d7a"],
            ),
        ],
        limit_turns: Annotated[
            int,
            Query(description="the latest turns explained", ge=1, le=talks.MAX_TURNS),
        ] = talks.DEFAULT_TURNS,
    ) -> Response:
        """A conversation across traces: its turns (traces) in order, each turn's critical path
        (LLM buckets, tools, app), and the turns' time added up by bucket, tool and app."""
        return served(
            talks.conversation(
                store, conversation_id, limit_turns=limit_turns, stall_threshold_ms=stall
            )
        )
