"""Synthetic span and trace ids made in SQL, shaped as the collector stores OTLP's: lowercase hex,
16 characters a span id, 32 a trace id (two words).

``hex`` of an integer drops its leading zero bytes, so ``lower(hex(cityHash64(...)))`` alone
came out two or more characters short for 1 id in 256."""

from __future__ import annotations


def hex_word(*args: object) -> str:
    """SQL for 16 lowercase hex characters from ``cityHash64`` of ``args`` (SQL expressions)."""
    return f"leftPad(lower(hex(cityHash64({', '.join(str(a) for a in args)}))), 16, '0')"


def hex_trace_id(*args: object) -> str:
    """SQL for a 32-character lowercase hex trace id from ``args`` (SQL expressions): two
    ``hex_word`` of them, told apart by a last argument of 1 and 2."""
    return f"{hex_word(*args, 1)} || {hex_word(*args, 2)}"
