"""The process's Prometheus registry: every stage registers its metrics here, ``/metrics``
renders it."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

REGISTRY = CollectorRegistry(auto_describe=True)
