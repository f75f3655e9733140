"""The queries about many requests as the REST API, gRPC and the CLI take them: parameters as
text (time ranges as RFC 3339 or ``15m``, steps as ``5m``, objectives as ``ttft:500:0.99:30``)
parsed and checked, then handed to ``latscope.attribution.aggregates``, which runs the SQL. A
bad parameter is an ``InvalidParameter`` (a 400 with a message saying what to write).

Each function returns the answer's model as the domain built it
(``latscope.attribution.answers.models``, re-exported by ``latscope.api.schemas``), window
included; the matching ``/v1`` route serves it, the gRPC service converts it and the CLI renders
it. Count limits are held to their bounds by the domain (its ``MAX_*``), which the routes declare.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from latscope.api.errors import InvalidParameter
from latscope.api.schemas import (
    ColdStart,
    Compare,
    Diagnosis,
    Gpu,
    Heatmap,
    Services,
    Slo,
    Slowest,
    Summary,
    Tail,
    Timeseries,
    Why,
)
from latscope.api.timerange import TimeRange, TimeRangeError, parse_instant, parse_range
from latscope.attribution import aggregates as agg
from latscope.storage import Store

_T = TypeVar("_T")

#: Objectives used when none is given: typical interactive-chat targets over 30 days.
DEFAULT_OBJECTIVES = ("ttft:500:0.99:30", "tpot:50:0.99:30", "e2e:10000:0.99:30")
MAX_OBJECTIVES = 20
_OBJECTIVE = re.compile(
    r"^(?P<metric>e2e|ttft|tpot):(?P<threshold>\d+(\.\d+)?):(?P<target>0?\.\d+)"
    r"(:(?P<days>\d+(\.\d+)?))?$"
)


def time_range(since: str | None, until: str | None, prefix: str = "") -> TimeRange:
    """The window of two time parameters; ``InvalidParameter`` says what to write instead."""
    try:
        return parse_range(since, until, prefix=prefix)
    except TimeRangeError as exc:
        raise InvalidParameter("invalid_time", str(exc)) from None


def _call(fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``fn(*args, **kwargs)``, the domain's errors as ``InvalidParameter``."""
    try:
        return fn(*args, **kwargs)
    except agg.GroupByError as exc:
        raise InvalidParameter("invalid_group_by", str(exc)) from None
    except agg.AnswerError as exc:
        raise InvalidParameter("invalid_parameter", str(exc)) from None


def _windowed(fn: Callable[..., _T], store: Store, r: TimeRange, **params: Any) -> _T:
    """The domain's answer over the window ``r``: ``fn(store, since_ns=, until_ns=, **params)``,
    errors as ``_call`` maps them."""
    return _call(fn, store, since_ns=r.since_ns, until_ns=r.until_ns, **params)


def _group_by(group_by: str | None) -> str | None:
    """``group_by`` checked by the domain's one rule (``aggregates.check_group_by``), before
    anything else is read."""
    if group_by:
        _call(agg.check_group_by, group_by)
    return group_by


def summary(
    store: Store,
    *,
    since: str | None = None,
    until: str | None = None,
    service: str | None = None,
    model: str | None = None,
    group_by: str | None = None,
    limit_groups: int = 100,
    exact: bool = False,
) -> Summary:
    """Count, percentiles of e2e and of each bucket, and each bucket's share of the time.

    Percentiles are within 0.5 % (logarithmic histograms, merged from hourly rollups where the
    window covers whole settled hours) unless ``exact``."""
    _group_by(group_by)
    r = time_range(since, until)
    return _windowed(
        agg.summary,
        store,
        r,
        service=service,
        model=model,
        group_by=group_by,
        limit_groups=limit_groups,
        exact=bool(exact),
    )


def tail(
    store: Store,
    *,
    since: str | None = None,
    until: str | None = None,
    service: str | None = None,
    model: str | None = None,
    percentile: float = 99,
    exact: bool = False,
) -> Tail:
    """Which bucket the requests above the ``percentile`` spend their extra time in."""
    r = time_range(since, until)
    return _windowed(
        agg.tail,
        store,
        r,
        percentile=float(percentile),
        service=service,
        model=model,
        exact=bool(exact),
    )


def compare(
    store: Store,
    *,
    before_since: str | None = None,
    before_until: str | None = None,
    after_since: str | None = None,
    after_until: str | None = None,
    service: str | None = None,
    model: str | None = None,
    exact: bool = False,
) -> Compare:
    """Two windows bucket by bucket. ``after`` defaults to the last hour, ``before`` to the
    window of the same length just before ``after``."""
    after = time_range(after_since, after_until, prefix="after_")
    if before_since is None and before_until is None:
        length = after.until - after.since
        before = TimeRange(after.since - length, after.since)
    else:
        if before_since is None or before_until is None:
            raise InvalidParameter(
                "invalid_time", "give both before_since and before_until, or neither"
            )
        before = time_range(before_since, before_until, prefix="before_")
    return _call(
        agg.compare,
        store,
        before=(before.since_ns, before.until_ns),
        after=(after.since_ns, after.until_ns),
        service=service,
        model=model,
        exact=bool(exact),
    )


def diagnose(
    store: Store,
    *,
    since: str | None = None,
    until: str | None = None,
    service: str | None = None,
    model: str | None = None,
    percentile: float = 99,
    warmup_requests: int = 10,
    warmup_s: float = 60.0,
) -> Diagnosis:
    """The usual cause of what the window shows, its first fixes and the numbers behind it
    (``warmup_*``: the cold-start rule, see ``coldstart``)."""
    r = time_range(since, until)
    return _windowed(
        agg.diagnose,
        store,
        r,
        service=service,
        model=model,
        percentile=float(percentile),
        warmup=_call(
            agg.WarmupRule, warmup_requests=int(warmup_requests), warmup_s=float(warmup_s)
        ),
    )


def parse_objective(text: str) -> agg.Objective:
    """``METRIC:THRESHOLD_MS:TARGET[:WINDOW_DAYS]``, e.g. ``ttft:500:0.99:30``."""
    m = _OBJECTIVE.match(text.strip())
    if not m:
        raise InvalidParameter(
            "invalid_objective",
            f"objective {text!r}: write METRIC:THRESHOLD_MS:TARGET[:WINDOW_DAYS] with METRIC "
            "e2e, ttft or tpot, e.g. ttft:500:0.99:30 (99% of requests TTFT <= 500 ms over "
            "30 days)",
        )
    days = float(m.group("days") or 30)
    threshold, target = float(m.group("threshold")), float(m.group("target"))
    if not 0 < target < 1 or threshold <= 0 or not 0 < days <= 400:
        raise InvalidParameter(
            "invalid_objective",
            f"objective {text!r}: target in (0, 1), threshold > 0, window 1..400 days",
        )
    return agg.Objective(m.group("metric"), threshold_ms=threshold, target=target, window_days=days)


def slo(
    store: Store,
    *,
    objective: list[str] | tuple[str, ...] | str | None = None,
    at: str | None = None,
    service: str | None = None,
    model: str | None = None,
) -> Slo:
    """Error budget left and burn rates (5m, 30m, 1h, 6h, 3d) of each objective, as of ``at``."""
    texts = [objective] if isinstance(objective, str) else list(objective or DEFAULT_OBJECTIVES)
    if len(texts) > MAX_OBJECTIVES:
        raise InvalidParameter("invalid_objective", f"at most {MAX_OBJECTIVES} objectives")
    objectives = [parse_objective(t) for t in texts]
    now = datetime.now(UTC)
    try:
        when = parse_instant(at, now=now, name="at") if at else now
    except TimeRangeError as exc:
        raise InvalidParameter("invalid_time", str(exc)) from None
    if when - timedelta(days=max(o.window_days for o in objectives)) < datetime(
        1970, 1, 1, tzinfo=UTC
    ):
        raise InvalidParameter("invalid_time", "at: the objective window starts before 1970")
    r = TimeRange(when - timedelta(microseconds=1), when)
    return _call(
        agg.slo, store, objectives=objectives, now_ns=r.until_ns, service=service, model=model
    )


def gpu(
    store: Store,
    *,
    since: str | None = None,
    until: str | None = None,
    service: str | None = None,
    model: str | None = None,
) -> Gpu:
    """GPU figures per phase (utilization, memory, power, SM clock, energy)."""
    r = time_range(since, until)
    return _windowed(
        agg.gpu_by_phase,
        store,
        r,
        service=service,
        model=model,
    )


def services(store: Store, *, since: str | None = None, until: str | None = None) -> Services:
    """The services seen in the window, each with its models and request counts."""
    r = time_range(since, until)
    return _windowed(agg.services, store, r)


def slowest(
    store: Store,
    *,
    since: str | None = None,
    until: str | None = None,
    service: str | None = None,
    model: str | None = None,
    limit: int = 20,
) -> Slowest:
    """The slowest requests of the window, slowest first, each with its buckets."""
    r = time_range(since, until)
    return _windowed(agg.slowest, store, r, service=service, model=model, limit=limit)


# -- over time, what is different, cold starts -------------------------------------------------

_STEP = re.compile(r"^\s*(\d{1,7})\s*(s|m|h|d)\s*$")
_STEP_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
_SLO_SELECTION = re.compile(r"^(?P<metric>e2e|ttft|tpot):(?P<threshold>\d+(\.\d+)?)(:.*)?$")


def parse_step(text: str | None) -> int | None:
    """``30s``, ``5m``, ``1h``, ``1d`` -> seconds (None: choose from the window)."""
    if text is None or text == "":
        return None
    m = _STEP.match(text)
    if not m or int(m.group(1)) == 0:
        raise InvalidParameter(
            "invalid_step", f"step {text!r}: write a duration such as 30s, 5m, 1h or 1d"
        )
    return int(m.group(1)) * _STEP_UNITS[m.group(2)]


def timeseries(
    store: Store,
    *,
    since: str | None = None,
    until: str | None = None,
    service: str | None = None,
    model: str | None = None,
    step: str | None = None,
    group_by: str | None = None,
    limit_groups: int = 10,
) -> Timeseries:
    """Every figure of the summary per time step, for the window and per group."""
    _group_by(group_by)
    r = time_range(since, until)
    return _windowed(
        agg.timeseries,
        store,
        r,
        step_s=parse_step(step),
        service=service,
        model=model,
        group_by=group_by,
        limit_groups=limit_groups,
    )


def heatmap(
    store: Store,
    *,
    since: str | None = None,
    until: str | None = None,
    service: str | None = None,
    model: str | None = None,
    step: str | None = None,
    metric: str = "e2e",
    bins_per_decade: int = 10,
) -> Heatmap:
    """Requests per time step and log-scaled latency bin."""
    r = time_range(since, until)
    return _windowed(
        agg.heatmap,
        store,
        r,
        step_s=parse_step(step),
        metric=metric,
        service=service,
        model=model,
        bins_per_decade=int(bins_per_decade),
    )


def why(
    store: Store,
    *,
    since: str | None = None,
    until: str | None = None,
    service: str | None = None,
    model: str | None = None,
    selection: str = "percentile",
    metric: str = "e2e",
    percentile: float = 99,
    objective: str | None = None,
    sel_since: str | None = None,
    sel_until: str | None = None,
    min_ms: float | None = None,
    max_ms: float | None = None,
    resource: list[str] | tuple[str, ...] | str | None = None,
    attribute: list[str] | tuple[str, ...] | str | None = None,
    limit_values: int = 5,
    examples: int = 5,
) -> Why:
    """What is different about the selected requests, dimension by dimension, and the extra
    time each top value carries, by bucket."""
    r = time_range(since, until)
    chosen: dict[str, Any] = {"kind": selection, "metric": metric, "percentile": float(percentile)}
    if selection == "slo":
        m = _SLO_SELECTION.match((objective or "").strip())
        if not m:
            raise InvalidParameter(
                "invalid_objective",
                "selection=slo needs objective=METRIC:THRESHOLD_MS (e.g. ttft:500 or "
                "ttft:500:0.99:30), METRIC e2e, ttft or tpot",
            )
        chosen.update(metric=m.group("metric"), threshold_ms=float(m.group("threshold")))
    if selection == "region":
        for name, text in (("sel_since", sel_since), ("sel_until", sel_until)):
            if text:
                try:
                    instant = parse_instant(text, now=datetime.now(UTC), name=name)
                except TimeRangeError as exc:
                    raise InvalidParameter("invalid_time", str(exc)) from None
                chosen[name.removeprefix("sel_") + "_ns"] = TimeRange(instant, instant).since_ns
        chosen.update(min_ms=min_ms, max_ms=max_ms)

    def keys(value: list[str] | tuple[str, ...] | str | None) -> list[str]:
        return [value] if isinstance(value, str) else list(value or ())

    return _windowed(
        agg.why,
        store,
        r,
        selection=agg.Selection(**chosen),
        service=service,
        model=model,
        resources=keys(resource),
        attributes=keys(attribute),
        limit_values=limit_values,
        examples=examples,
    )


def coldstart(
    store: Store,
    *,
    since: str | None = None,
    until: str | None = None,
    service: str | None = None,
    model: str | None = None,
    warmup_requests: int = 10,
    warmup_s: float = 60.0,
    lookback_s: float = 3600.0,
) -> ColdStart:
    """Replicas that appeared, their warm-up requests, and warm-up against warm by bucket."""
    r = time_range(since, until)
    rule = agg.WarmupRule(
        warmup_requests=int(warmup_requests), warmup_s=float(warmup_s), lookback_s=lookback_s
    )
    return _windowed(
        agg.coldstart,
        store,
        r,
        service=service,
        model=model,
        rule=rule,
    )


# -- export ----------------------------------------------------------------------------------

#: Most requests one REST export answers with: the Parquet file is built in the API's memory
#: (about 300 bytes a request compressed, several times that while polars builds it), so a
#: bigger export goes through the CLI on the store itself or several windows.
MAX_EXPORT = 200_000


def export_requests(
    store: Store,
    *,
    since: str | None = None,
    until: str | None = None,
    service: str | None = None,
    model: str | None = None,
    limit: int = MAX_EXPORT,
) -> tuple[bytes, int]:
    """The window's attributed requests as a Parquet file (``frames.requests``' columns, oldest
    first), and how many rows it holds."""
    import io

    from latscope.attribution import frames

    r = time_range(since, until)
    frame = frames.requests(
        store,
        since_ns=r.since_ns,
        until_ns=r.until_ns,
        service=service,
        model=model,
        limit=max(1, min(int(limit), MAX_EXPORT)),
    )
    out = io.BytesIO()
    frame.write_parquet(out, compression="zstd")
    return out.getvalue(), frame.height
