"""The REST query API, the gRPC query service and the answers they share."""

from __future__ import annotations

from latscope.api.app import create_app

__all__ = ["create_app"]
