"""Attribution engine: a request's spans -> network, queue, preprocess, prefill, decode,
postprocess and other, always adding up to the end-to-end latency.

``attribute_trace`` is the per-request reference, ``attribute_frame`` the same rules vectorised
over many traces, ``Attributor`` the background component that keeps the attribution table up to
date, and ``aggregates`` the ClickHouse queries over that table.
"""

from __future__ import annotations

from latscope.attribution.engine import PHASE_PRIORITY, attribute_trace, sweep
from latscope.attribution.model import RequestAttribution, SpanRecord
from latscope.attribution.spans import load_trace

__all__ = [
    "PHASE_PRIORITY",
    "RequestAttribution",
    "SpanRecord",
    "attribute_trace",
    "load_trace",
    "sweep",
]
