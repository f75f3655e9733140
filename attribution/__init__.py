"""Attribution engine: each inference call's spans -> network, queue, preprocess, prefill,
decode, postprocess and other, always adding up to the end-to-end latency.

``attribute_requests`` is the per-request reference (every call of one trace), ``explain_run``
the critical path of a trace with several calls, ``attribution.sql`` the same rules as one
ClickHouse statement (what the ``Attributor``, the background component, runs), and
``aggregates`` the ClickHouse queries over the attribution table (one module per question in
``answers``).
"""

from __future__ import annotations

from latscope.attribution.engine import (
    PHASE_PRIORITY,
    Request,
    attribute_request,
    attribute_requests,
    find_requests,
    sweep,
)
from latscope.attribution.model import RequestAttribution, SpanRecord, request_id
from latscope.attribution.runs import RunExplanation, explain_run
from latscope.attribution.spans import load_trace

__all__ = [
    "PHASE_PRIORITY",
    "Request",
    "RequestAttribution",
    "RunExplanation",
    "SpanRecord",
    "attribute_request",
    "attribute_requests",
    "explain_run",
    "find_requests",
    "load_trace",
    "request_id",
    "sweep",
]
