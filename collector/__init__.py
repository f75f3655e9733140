"""The collector: OTLP in, validated spans out to ClickHouse."""

from __future__ import annotations
