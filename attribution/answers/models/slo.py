"""Objectives: error budget, burn rates, alerts and where the budget went (``slo``)."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from latscope.attribution.answers.models.base import Answer, BucketMeans


class BudgetSplit(Answer):
    bad: int = Field(description="requests that missed the objective")
    good: int
    extra_e2e_ms: float | None = Field(description="bad requests' mean e2e minus the good ones'")
    extra_buckets_ms: BucketMeans
    dominant: str | None


class ObjectiveStatus(Answer):
    name: str
    metric: str
    threshold_ms: float
    target: float
    window_days: float
    total: int
    bad: int
    compliance: float | None
    met: bool | None
    error_budget: float
    budget_left: float | None
    burn_rates: dict[str, float | None]
    alerts: dict[str, bool]
    budget_by_bucket: dict[str, BudgetSplit] | None = Field(
        None,
        description="per window (the objective's, then each burn rate's): where the budget went",
    )


class Slo(Answer):
    """Per objective: compliance, error budget left, burn rates and the fast/slow-burn alerts."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "at": "2026-01-02T15:00:00Z",
                    "now_ns": 1767366000000000000,
                    "objectives": [
                        {
                            "name": "ttft p99 < 500 ms",
                            "metric": "ttft",
                            "threshold_ms": 500,
                            "target": 0.99,
                            "window_days": 30,
                            "total": 120000,
                            "bad": 600,
                            "compliance": 0.995,
                            "met": True,
                            "error_budget": 0.01,
                            "budget_left": 0.5,
                            "burn_rates": {"5m": 0.4, "30m": 0.6, "1h": 0.5, "6h": 0.5, "3d": 0.5},
                            "alerts": {"fast_burn": False, "slow_burn": False, "ticket": False},
                        }
                    ],
                }
            ]
        },
    )

    at: str
    now_ns: int
    objectives: list[ObjectiveStatus]
