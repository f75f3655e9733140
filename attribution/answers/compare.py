"""Two windows bucket by bucket: p50, p99, mean and share before, after and the change, and the
bucket that moved most.

>>> got = compare(store, before=(t0, t1), after=(t1, t2))  # doctest: +SKIP
>>> got.before.count, got.e2e_ms["p99"].delta, got.mover, got.mover_delta_ms  # doctest: +SKIP
(1200, 52.0, 'queue', 41.3)
"""

from __future__ import annotations

from latscope.attribution import rollups
from latscope.attribution.answers.common import filters, window_params
from latscope.attribution.answers.figures import stats_or_empty
from latscope.attribution.answers.models import Answer, Compare, CompareWindow, Delta, Stats, Window
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
    a: Stats
    b: Stats
    if exact:
        a, b = (
            summary(store, since_ns=s, until_ns=u, service=service, model=model, exact=True)
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


def _compare(a: Stats, b: Stats, before: tuple[int, int], after: tuple[int, int]) -> Compare:
    """The comparison of the figures ``a`` (of the window ``before``) and ``b`` (``after``)."""

    def delta(x: Answer, y: Answer, key: str) -> Delta:
        was, now = getattr(x, key), getattr(y, key)
        return Delta(before=was, after=now, delta=None if was is None or now is None else now - was)

    buckets = {
        bucket: {
            key: delta(a.buckets_ms[bucket], b.buckets_ms[bucket], key)
            for key in ("p50", "p99", "mean", "share")
        }
        for bucket in BUCKETS
    }
    e2e = {key: delta(a.e2e_ms, b.e2e_ms, key) for key in ("p50", "p99", "mean")}

    def mover(key: str) -> str | None:
        moved = {k: buckets[k][key].delta for k in BUCKETS}
        known = [k for k in BUCKETS if moved[k] is not None]
        return max(known, key=lambda k: abs(moved[k] or 0.0), default=None)

    by_mean = mover("mean")
    return Compare(
        before=CompareWindow(**dict(Window.of(*before)), count=a.count),
        after=CompareWindow(**dict(Window.of(*after)), count=b.count),
        e2e_ms=e2e,
        buckets_ms=buckets,
        mover=by_mean,
        mover_delta_ms=buckets[by_mean]["mean"].delta if by_mean else None,
        p99_mover=mover("p99"),
    )
