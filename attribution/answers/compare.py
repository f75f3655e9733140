"""Two windows bucket by bucket: p50, p99, mean and share before, after and the change, and the
bucket that moved most.

>>> got = compare(store, before=(t0, t1), after=(t1, t2))  # doctest: +SKIP
>>> got.before.count, got.e2e_ms["p99"].delta, got.mover, got.mover_delta_ms  # doctest: +SKIP
(1200, 52.0, 'queue', 41.3)
"""

from __future__ import annotations

from typing import Any

from latscope.attribution import rollups
from latscope.attribution.answers.common import filters, window_params
from latscope.attribution.answers.figures import stats_or_empty
from latscope.attribution.answers.models import Compare, Window
from latscope.attribution.answers.summary import approx_summary, summary
from latscope.attribution.answers.window import plan_windows
from latscope.semconv import BUCKETS
from latscope.storage import Store

__all__ = ["compare"]


def compare(
    store: Store,
    *,
    before: tuple[int, int],
    after: tuple[int, int],
    service: str | None = None,
    model: str | None = None,
    exact: bool = False,
    use_rollups: bool = True,
) -> Compare:
    """Two windows bucket by bucket: p50 / p99 / mean / share before, after and the delta.

    ``mover`` names the bucket whose mean changed most (means add up to the e2e mean, so the
    movers explain the e2e change); ``e2e_ms`` carries the same figures for the whole request.
    """
    if exact:
        a, b = (
            summary(
                store, since_ns=s, until_ns=u, service=service, model=model, exact=True
            ).model_dump()
            for s, u in (before, after)
        )
    else:
        # Both windows in one pass: their hours looked up once, one figures query and one
        # histogram query over both.
        window_params(after[0], after[1], service, model)  # both windows must be non-empty
        params = window_params(before[0], before[1], service, model)
        windows = plan_windows(store, [before, after], use_rollups)
        totals, _ = approx_summary(
            store, windows, params, group=None, dims=rollups.level_for(filters(service, model))
        )
        a, b = (stats_or_empty(t) for t in totals)
    return _compare(a, b, before, after)


def _compare(
    a: dict[str, Any], b: dict[str, Any], before: tuple[int, int], after: tuple[int, int]
) -> Compare:
    """The comparison of the figures ``a`` (of the window ``before``) and ``b`` (``after``)."""

    def delta(x: float | None, y: float | None) -> float | None:
        return None if x is None or y is None else y - x

    buckets = {}
    for bucket in BUCKETS:
        fa, fb = a["buckets_ms"][bucket], b["buckets_ms"][bucket]
        buckets[bucket] = {
            key: {"before": fa[key], "after": fb[key], "delta": delta(fa[key], fb[key])}
            for key in ("p50", "p99", "mean", "share")
        }
    e2e = {
        key: {
            "before": a["e2e_ms"][key],
            "after": b["e2e_ms"][key],
            "delta": delta(a["e2e_ms"][key], b["e2e_ms"][key]),
        }
        for key in ("p50", "p99", "mean")
    }
    movers = [b for b in BUCKETS if buckets[b]["mean"]["delta"] is not None]
    mover = max(movers, key=lambda k: abs(buckets[k]["mean"]["delta"]), default=None)
    return Compare.model_validate(
        {
            "before": Window.of(*before).json_dict() | {"count": a["count"]},
            "after": Window.of(*after).json_dict() | {"count": b["count"]},
            "e2e_ms": e2e,
            "buckets_ms": buckets,
            "mover": mover,
            "mover_delta_ms": buckets[mover]["mean"]["delta"] if mover else None,
            "p99_mover": max(
                (k for k in BUCKETS if buckets[k]["p99"]["delta"] is not None),
                key=lambda k: abs(buckets[k]["p99"]["delta"]),
                default=None,
            ),
        }
    )
