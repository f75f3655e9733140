"""The answers about many requests, re-exported: the public face of ``attribution/answers``
(one module per question; see its docstring for which is where).

>>> from latscope.attribution import aggregates
>>> aggregates.summary(store, since_ns=t0, until_ns=t1, group_by="model")  # doctest: +SKIP
Summary(count=1200, e2e_ms=Percentiles(p50=..., ...), buckets_ms={...}, groups=[...], ...)
"""

from __future__ import annotations

from latscope.attribution.answers.coldstart import WarmupRule, coldstart
from latscope.attribution.answers.compare import compare
from latscope.attribution.answers.diagnose import CAUSES, diagnose
from latscope.attribution.answers.dimensions import (
    MAX_EXAMPLES,
    MAX_VALUES,
    Selection,
    concentration,
    slo_buckets,
    why,
)
from latscope.attribution.answers.errors import (
    AggregateError,
    AnswerError,
    ColdStartError,
    DimensionError,
    GroupByError,
    TimeseriesError,
)
from latscope.attribution.answers.figures import BUCKET_LEVELS, E2E_LEVELS, STREAM_LEVELS
from latscope.attribution.answers.groups import GROUP_BY_COLUMNS, check_group_by
from latscope.attribution.answers.listings import MAX_SLOWEST, gpu_by_phase, services, slowest
from latscope.attribution.answers.slo import Objective, slo
from latscope.attribution.answers.standing import standing
from latscope.attribution.answers.summary import MAX_GROUPS, summary
from latscope.attribution.answers.tail import tail
from latscope.attribution.answers.timeseries import MAX_SERIES, choose_step, heatmap, timeseries

__all__ = [
    "BUCKET_LEVELS",
    "CAUSES",
    "E2E_LEVELS",
    "GROUP_BY_COLUMNS",
    "MAX_EXAMPLES",
    "MAX_GROUPS",
    "MAX_SERIES",
    "MAX_SLOWEST",
    "MAX_VALUES",
    "STREAM_LEVELS",
    "AggregateError",
    "AnswerError",
    "ColdStartError",
    "DimensionError",
    "GroupByError",
    "Objective",
    "Selection",
    "TimeseriesError",
    "WarmupRule",
    "check_group_by",
    "choose_step",
    "coldstart",
    "compare",
    "concentration",
    "diagnose",
    "gpu_by_phase",
    "heatmap",
    "services",
    "slo",
    "slo_buckets",
    "slowest",
    "standing",
    "summary",
    "tail",
    "timeseries",
    "why",
]
