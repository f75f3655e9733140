"""The collector: OTLP in, validated spans out to ClickHouse."""

from __future__ import annotations

from latscope.collector.receiver import TraceReceiver, span_problem

__all__ = ["TraceReceiver", "span_problem"]
