"""The answers about many requests as typed models: the domain functions of
``latscope.attribution.answers`` build and return them, the REST API serves them (their JSON
schemas, with examples, are the OpenAPI document's), gRPC converts them and the CLI renders them.

Times are milliseconds as floats. Every model is closed (``base.Answer``).

=================  ===============================================================================
``base``           the closed base, the buckets, the window, percentile figures, examples
``budget``         ``Stats``, ``Summary``, ``Tail``, ``Compare``
``diagnosis``      ``Diagnosis``
``slo``            ``Slo``
``listings``       ``Gpu``, ``Services``, ``Slowest``
``timeseries``     ``Timeseries``, ``Heatmap``
``why``            ``Why``
``coldstart``      ``ColdStart``
``standing``       ``Standing`` (a part of one request's ``Explain``)
``conversations``  ``Conversations``
=================  ===============================================================================
"""

from __future__ import annotations

from latscope.attribution.answers.models.base import (
    ATTRIBUTION_EXAMPLE,
    REQUEST_ID_EXAMPLE,
    TRACE_ID_EXAMPLE,
    WINDOW_EXAMPLE,
    Answer,
    BucketMeans,
    Buckets,
    BucketStats,
    Itl,
    Percentiles,
    Streaming,
    StreamPercentiles,
    StreamStats,
    Window,
    format_ns,
)
from latscope.attribution.answers.models.budget import (
    Compare,
    CompareWindow,
    Delta,
    Stats,
    Summary,
    SummaryGroup,
    Tail,
    TailBucket,
)
from latscope.attribution.answers.models.coldstart import (
    ColdStart,
    Replica,
    ReplicaStartup,
    ScaleUp,
    WarmupRuleModel,
)
from latscope.attribution.answers.models.conversations import (
    CONVERSATION_ID_EXAMPLE,
    Conversations,
    ConversationSeen,
)
from latscope.attribution.answers.models.diagnosis import Diagnosis, Verdict, VerdictWhere
from latscope.attribution.answers.models.listings import (
    Gpu,
    GpuFigure,
    ModelCount,
    Services,
    ServiceSeen,
    Slowest,
    SlowRequest,
)
from latscope.attribution.answers.models.slo import BudgetSplit, ObjectiveStatus, Slo
from latscope.attribution.answers.models.standing import (
    STANDING_EXAMPLE,
    FigurePercentiles,
    Standing,
)
from latscope.attribution.answers.models.timeseries import (
    HeatBin,
    Heatmap,
    ReadSource,
    Series,
    StepBucket,
    StepPercentiles,
    StepPoint,
    Timeseries,
)
from latscope.attribution.answers.models.why import (
    Why,
    WhyBaseline,
    WhyDimension,
    WhyExample,
    WhySelection,
    WhySide,
    WhyTop,
    WhyValue,
)

__all__ = [
    "ATTRIBUTION_EXAMPLE",
    "CONVERSATION_ID_EXAMPLE",
    "REQUEST_ID_EXAMPLE",
    "STANDING_EXAMPLE",
    "TRACE_ID_EXAMPLE",
    "WINDOW_EXAMPLE",
    "Answer",
    "BucketMeans",
    "BucketStats",
    "Buckets",
    "BudgetSplit",
    "ColdStart",
    "Compare",
    "CompareWindow",
    "ConversationSeen",
    "Conversations",
    "Delta",
    "Diagnosis",
    "FigurePercentiles",
    "Gpu",
    "GpuFigure",
    "HeatBin",
    "Heatmap",
    "Itl",
    "ModelCount",
    "ObjectiveStatus",
    "Percentiles",
    "ReadSource",
    "Replica",
    "ReplicaStartup",
    "ScaleUp",
    "Series",
    "ServiceSeen",
    "Services",
    "Slo",
    "SlowRequest",
    "Slowest",
    "Standing",
    "Stats",
    "StepBucket",
    "StepPercentiles",
    "StepPoint",
    "StreamPercentiles",
    "StreamStats",
    "Streaming",
    "Summary",
    "SummaryGroup",
    "Tail",
    "TailBucket",
    "Timeseries",
    "Verdict",
    "VerdictWhere",
    "WarmupRuleModel",
    "Why",
    "WhyBaseline",
    "WhyDimension",
    "WhyExample",
    "WhySelection",
    "WhySide",
    "WhyTop",
    "WhyValue",
    "Window",
    "format_ns",
]
