"""The answers' errors: a question asked in a way it cannot be answered.

Every one is a ``ValueError`` whose message says what to write instead; the REST API turns them
into 400s (``invalid_parameter``, or ``invalid_group_by`` for a ``GroupByError``)::

    AnswerError
    ├── AggregateError      summary, tail, compare, diagnose, slo and the listings
    ├── TimeseriesError     timeseries, heatmap
    ├── DimensionError      why, concentration
    ├── ColdStartError      coldstart, the warm-up rule
    └── GroupByError        a group_by naming no dimension (an AggregateError and a
                            TimeseriesError: the one rule both answers use, groups.py)
"""

from __future__ import annotations

__all__ = [
    "AggregateError",
    "AnswerError",
    "ColdStartError",
    "DimensionError",
    "GroupByError",
    "TimeseriesError",
]


class AnswerError(ValueError):
    """A question the answers cannot answer as asked; the message says what to write instead."""


class AggregateError(AnswerError):
    """An aggregate was asked something it cannot answer (bad group_by, empty window...)."""


class TimeseriesError(AnswerError):
    """The question cannot be answered as asked (bad step, metric or group); says what to do."""


class DimensionError(AnswerError):
    """The question cannot be answered as asked; the message says what to write instead."""


class ColdStartError(AnswerError):
    """The rule or window cannot be used; the message says what to write instead."""


class GroupByError(AggregateError, TimeseriesError):
    """``group_by`` names no dimension to group by (``groups.check_group_by``)."""
