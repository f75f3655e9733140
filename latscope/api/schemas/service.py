"""The service itself: its health and the traces its attributor has set aside."""

from __future__ import annotations

from pydantic import Field

from latscope.attribution.answers.models.base import TRACE_ID_EXAMPLE, Answer, _example


class Health(Answer):
    model_config = _example({"status": "ok"})

    status: str


class SetAsideTrace(Answer):
    """A trace the attributor failed on alone: set aside, the others attributed without it."""

    trace_id: str
    error: str = Field(description="why ClickHouse refused the statement for it")
    attempts: int = Field(description="how many passes failed on it")
    retry_in_s: float = Field(description="seconds until it is tried again (0: at the next pass)")


class SetAsideTraces(Answer):
    """The traces the attributor of this process has set aside (``latscope_attribution_set_aside
    _traces``), each retried with a backoff that doubles up to an hour."""

    model_config = _example(
        {
            "traces": [
                {
                    "trace_id": TRACE_ID_EXAMPLE,
                    "error": "Code: 70. DB::Exception: Value in column Float64 cannot be safely "
                    "converted into type Int64 (CANNOT_CONVERT_TYPE)",
                    "attempts": 3,
                    "retry_in_s": 38.5,
                }
            ]
        }
    )

    traces: list[SetAsideTrace]
