"""Where one request stands among its peers (``standing``)."""

from __future__ import annotations

from pydantic import Field

from latscope.attribution.answers.models.base import Answer, Buckets, _example


class FigurePercentiles(Buckets):
    """A percentile rank (0-100) per bucket and figure; null where the request or its peers
    lack it."""

    e2e: float | None
    ttft: float | None
    tpot: float | None


STANDING_EXAMPLE = {
    "since": "2026-01-02T14:00:00Z",
    "until": "2026-01-02T15:00:00Z",
    "peers": 812,
    "percentiles": {"e2e": 97.4, "network": 40.2, "queue": 99.1, "preprocess": 55.0,
                    "prefill": 61.3, "decode": 48.0, "postprocess": 50.5, "other": 52.0,
                    "ttft": 98.8, "tpot": 47.1},
}  # fmt: skip


class Standing(Answer):
    """Where a request stands among its peers (the requests of its service and model that
    started in the hour before it): the share of them that were faster, per figure."""

    model_config = _example(STANDING_EXAMPLE)

    since: str
    until: str
    peers: int = Field(description="requests of the same service and model in the window")
    percentiles: FigurePercentiles = Field(
        description="the peers below the request's value plus half of those equal, in percent "
        "of the peers that have the figure: 99 means slower than 99 % of them"
    )
