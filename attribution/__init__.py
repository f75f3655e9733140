"""Attribution engine: a request's spans -> network, queue, preprocess, prefill, decode,
postprocess and other, always adding up to the end-to-end latency."""

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
