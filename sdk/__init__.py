"""The latscope SDK: what app code imports to instrument inference servers and clients."""

from __future__ import annotations

__all__: list[str] = []
