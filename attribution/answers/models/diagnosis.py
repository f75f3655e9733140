"""The usual cause of what a window shows and its first fixes (``diagnose``)."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from latscope.attribution.answers.models.base import WINDOW_EXAMPLE, Answer, Window


class VerdictWhere(Answer):
    """The dimension value most over-represented among the requests with the most time in the
    verdict's bucket."""

    dimension: str
    value: str
    selection: str = Field(description="the requests it was found among")
    in_share: float
    out_share: float
    extra_ms: float | None
    since_ns: int | None = Field(description="when those requests began")


class Verdict(Answer):
    id: str
    cause: str
    bucket: str
    fixes: list[str]
    score: float | None
    evidence: dict[str, Any] = Field(description="the numbers behind the verdict, by name")
    where: VerdictWhere | None = Field(
        description="the dimension value that concentrates the problem, and since when"
    )


class Diagnosis(Answer):
    """The dominant bucket, the usual cause and first fix, with the numbers behind each."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "count": 1200,
                    "dominant": "decode",
                    "tail_dominant": "queue",
                    "verdicts": [
                        {
                            "id": "queue_tail",
                            "bucket": "queue",
                            "cause": "load exceeds capacity: the slowest requests wait for a "
                            "worker or batch slot",
                            "fixes": ["cap the queue depth and shed or reject early"],
                            "score": 0.71,
                            "evidence": {"queue_extra_ms": 2520.0, "queue_extra_share": 0.71},
                            "where": {
                                "dimension": "resource.k8s.pod.name",
                                "value": "llm-7",
                                "selection": "queue at or above p95 (900.0 ms)",
                                "in_share": 0.81,
                                "out_share": 0.1,
                                "extra_ms": 2300.0,
                                "since_ns": 1767363900000000000,
                            },
                        }
                    ],
                    "window": WINDOW_EXAMPLE,
                }
            ]
        },
    )

    count: int
    dominant: str | None
    tail_dominant: str | None
    shares: dict[str, float] | None = Field(
        default=None,
        description="each bucket's fraction of all time in the window; null without requests",
    )
    verdicts: list[Verdict]
    window: Window
