"""How the answers cut time, and what a heatmap bins: the terms both the answers
(``attribution/answers/``) compute with and the CLI (``latscope/cmd/``) lays its output and flags
out by, below both so that a command needs nothing of the answers' code.
"""

from __future__ import annotations

import math

from latscope.semconv import BUCKETS

__all__ = [
    "ALERTS",
    "BURN_WINDOWS_S",
    "FAST_BURN",
    "HEATMAP_METRICS",
    "HOURLY_FROM_S",
    "SLOW_BURN",
    "STEPS_S",
    "TARGET_POINTS",
    "TICKET_BURN",
    "choose_step",
]

#: Steps a window is cut into, shortest first; every one divides a day, so steps line up with
#: hours (and the rollup) whenever they are whole hours.
STEPS_S = (
    10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400,
)  # fmt: skip
#: The step chosen for a window: the shortest giving at most this many points...
TARGET_POINTS = 120
#: ...but whole hours from a day on, so long windows come from the rollup.
HOURLY_FROM_S = 86_400

#: Metrics a series has percentiles of, and the heatmap can count: e2e, a bucket, TTFT (client,
#: else server) or TPOT.
HEATMAP_METRICS: tuple[str, ...] = ("e2e", *BUCKETS, "ttft", "tpot")

#: Google SRE workbook, "Alerting on SLOs": page when 2 % of a 30-day budget burns in 1 h
#: (14.4x) or 5 % in 6 h (6x), open a ticket when 10 % burns in 3 days (1x), each confirmed by a
#: short window (5 m, 30 m, 6 h) so the alert stops soon after the burn does.
FAST_BURN, SLOW_BURN, TICKET_BURN = 14.4, 6.0, 1.0
#: The burn-rate windows (the workbook's): name -> seconds before now.
BURN_WINDOWS_S: dict[str, int] = {
    "5m": 300, "30m": 1800, "1h": 3600, "6h": 21_600, "3d": 259_200,
}  # fmt: skip
#: Each alert: (long window, short window, burn rate both must exceed). The Prometheus rules
#: (deploy/prometheus/latscope-slo.rules.yml) are the same alerts; a test holds them equal.
ALERTS: dict[str, tuple[str, str, float]] = {
    "fast_burn": ("1h", "5m", FAST_BURN),
    "slow_burn": ("6h", "30m", SLOW_BURN),
    "ticket": ("3d", "6h", TICKET_BURN),
}


def choose_step(window_s: float) -> int:
    """The step (s) for a window: the shortest of STEPS_S giving at most TARGET_POINTS points,
    and at least an hour from a day on.

    >>> choose_step(3600), choose_step(6 * 3600), choose_step(7 * 86400)
    (30, 300, 7200)
    """
    floor = 3600 if window_s >= HOURLY_FROM_S else 0
    for step in STEPS_S:
        if step >= floor and math.ceil(window_s / step) <= TARGET_POINTS:
            return step
    return STEPS_S[-1]
