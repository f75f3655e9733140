"""latscope: distributed tracing and latency attribution for AI inference."""

from __future__ import annotations

__version__ = "0.1.0"
