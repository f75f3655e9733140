"""The rulebook's vocabulary and its one small expression language.

Units and buckets a rule may name, and the expressions of ``[engine.derive]``, phases, parts,
first token and TPOT: Int64 ns arithmetic over a span's figures, times and events, and the times
and events of its parent and of the engine's request span (``latscope.attribution.rules``). The
reference engine evaluates them here (``evaluate``); the SQL attributor renders the same tree
(``latscope.attribution.sql.engines``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from latscope.attribution.model import SpanRecord, parse_float
from latscope.semconv import KV_TRANSFER, Phase

#: The format version this latscope reads.
VERSION = 1
#: What a phase or a stage may stand for: a bucket of the sweep, or a KV-cache transfer (counted
#: in ``other`` and named on its own).
PHASE_BUCKETS: tuple[str, ...] = (*Phase.ALL, KV_TRANSFER)
#: Units of a figure, and how many ns one of each is (``rust_duration``: a Rust ``Duration``'s
#: Debug text, ``"12.0345ms"``, read exactly from its digits).
UNITS: dict[str, int] = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1, "rust_duration": 0}
#: A figure in any unit reads as at most this many seconds in magnitude (as ``seconds_to_ns``), so
#: that every time derived from a few of them stays far inside Int64 ns, in Python as in SQL.
MAX_SECONDS = 1e6
#: Rust's ``Duration`` Debug format: the integer part, the fraction's non-zero digits, the largest
#: unit reached (``µ`` as U+00B5, also U+03BC and ``us``).
RUST_DURATION = re.compile(r"^([0-9]{1,12})(?:\.([0-9]{1,9}))?(s|ms|µs|μs|us|ns)$")
RUST_UNITS: dict[str, int] = {"s": 9, "ms": 6, "µs": 3, "μs": 3, "us": 3, "ns": 0}
#: Span kinds a request rule may name (``internal``: any kind but SERVER and CLIENT, as the SQL
#: attributor tells kinds apart).
KINDS = ("server", "client", "internal")
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
MAX_DEPTH = 8

# -- expressions -----------------------------------------------------------------------------------
#
# expr  := term (("+" | "-") term)*     Int64 ns arithmetic; an absent input makes it absent
# term  := INTEGER | NAME | point | "max0(" expr ")" | "(" expr ")"
# point := [SPAN "."] ("start" | "end" | "event(" EVENT ["," ("first" | "last")] ")")
# SPAN  := "parent" | "request"
# cond  := expr ("<" | "<=" | ">" | ">=") expr
#
# Points are instants: the span's own (no prefix), its parent's, or the engine's request span's
# (in a part's rules, ``[[engine.part]]``); an event's first time unless ``last`` is given.
# Figures, derived names and integers are durations; instant +- duration is an instant, instant -
# instant a duration.

INSTANT, DURATION = "instant", "duration"
#: The spans a point may name besides the span itself ("").
SPANS = ("parent", "request")
ORDINALS = ("first", "last")
COMPARISONS = ("<=", ">=", "<", ">")
_TOKEN = re.compile(r"\s*(?:(?P<num>[0-9]+)|(?P<name>[A-Za-z_][A-Za-z0-9_.]*)|(?P<op>[-+()]))")
_EVENT = re.compile(
    r"\s*(?:(?P<span>[A-Za-z_]+)\.)?event\(\s*(?P<name>[^(),]+?)\s*(?:,\s*(?P<ord>[a-z]+)\s*)?\)"
)


@dataclass(frozen=True)
class Expr:
    """A parsed expression: ``kind`` is ``num``, ``ref`` (a figure or derived name), ``start``,
    ``end``, ``event`` (value: (name, ordinal)), ``max0``, ``add`` or ``sub``; ``at`` the span a
    point is on ("" the span itself, ``parent``, ``request``)."""

    kind: str
    value: Any = None
    args: tuple[Expr, ...] = ()
    at: str = ""


def parse_expr(text: str) -> Expr:
    """Parse one expression; ValueError with what is wrong."""
    pos = 0

    def token(at: int) -> tuple[str, Any, int] | None:
        m = _EVENT.match(text, at)
        if m:
            span, ordinal = m.group("span") or "", m.group("ord") or "first"
            if span and span not in SPANS:
                raise ValueError(f"{span!r} is not one of {', '.join(SPANS)}")
            if ordinal not in ORDINALS:
                raise ValueError(f"{ordinal!r} is not one of {', '.join(ORDINALS)}")
            return ("event", (span, m.group("name"), ordinal), m.end())
        m = _TOKEN.match(text, at)
        if not m or m.end() == at:
            return None
        kind = m.lastgroup
        assert kind is not None
        return (kind, m.group(kind), m.end())

    def peek() -> tuple[str, Any] | None:
        found = token(pos)
        return None if found is None else found[:2]

    def take() -> tuple[str, Any]:
        nonlocal pos
        found = token(pos)
        if found is None:
            rest = text[pos:].strip()
            raise ValueError(f"cannot read {rest!r}" if rest else "ends too soon")
        pos = found[2]
        return found[:2]

    def term() -> Expr:
        kind, value = take()
        if kind == "num":
            return Expr("num", int(value))
        if kind == "event":
            span, name, ordinal = value
            return Expr("event", (name, ordinal), at=span)
        if kind == "op" and value == "(":
            inner = expr()
            closing(")")
            return inner
        if kind == "name":
            if value == "max0":
                closing("(")
                inner = expr()
                closing(")")
                return Expr("max0", args=(inner,))
            span, _, point = value.rpartition(".")
            if point in ("start", "end") and (span == "" or span in SPANS):
                return Expr(point, at=span)
            return Expr("ref", value)
        raise ValueError(f"unexpected {value!r}")

    def closing(char: str) -> None:
        kind, value = take()
        if (kind, value) != ("op", char):
            raise ValueError(f"expected {char!r}, found {value!r}")

    def expr() -> Expr:
        out = term()
        while (nxt := peek()) is not None and nxt[0] == "op" and nxt[1] in "+-":
            take()
            out = Expr("add" if nxt[1] == "+" else "sub", args=(out, term()))
        return out

    result = expr()
    if text[pos:].strip():
        raise ValueError(f"cannot read {text[pos:].strip()!r}")
    return result


@dataclass(frozen=True)
class Cond:
    """``left op right``: holds when both sides are present and compare so."""

    op: str
    left: Expr
    right: Expr


def parse_cond(text: str) -> Cond:
    """Parse one condition; ValueError with what is wrong."""
    for op in COMPARISONS:
        if op in text:
            left, right = text.split(op, 1)
            return Cond(op, parse_expr(left), parse_expr(right))
    raise ValueError(f"a comparison ({', '.join(COMPARISONS)}) is needed")


def refs(e: Expr) -> set[str]:
    """The figure and derived names an expression reads."""
    if e.kind == "ref":
        return {e.value}
    return set().union(*(refs(a) for a in e.args)) if e.args else set()


def events(e: Expr) -> set[tuple[str, str]]:
    """The (event name, ordinal) pairs an expression reads, on whichever span."""
    if e.kind == "event":
        return {e.value}
    return set().union(*(events(a) for a in e.args)) if e.args else set()


def spans(e: Expr) -> set[str]:
    """The spans other than its own an expression reads (``parent``, ``request``)."""
    own = {e.at} if e.at else set()
    return own.union(*(spans(a) for a in e.args)) if e.args else own


def expr_type(e: Expr, types: Mapping[str, str]) -> str:
    """INSTANT or DURATION; ValueError where the arithmetic mixes them wrongly."""
    if e.kind in ("start", "end", "event"):
        return INSTANT
    if e.kind == "num":
        return DURATION
    if e.kind == "ref":
        if e.value not in types:
            raise ValueError(f"unknown name {e.value!r}")
        return types[e.value]
    if e.kind == "max0":
        if expr_type(e.args[0], types) != DURATION:
            raise ValueError("max0 takes a duration")
        return DURATION
    a, b = (expr_type(x, types) for x in e.args)
    if e.kind == "add":
        if a == b == INSTANT:
            raise ValueError("an instant plus an instant")
        return INSTANT if INSTANT in (a, b) else DURATION
    if a == DURATION and b == INSTANT:
        raise ValueError("a duration minus an instant")
    return DURATION if a == b else INSTANT


def figure_ns(raw: str | None, unit: str) -> int | None:
    """A figure's value in ns: a decimal number in ``unit`` (clamped to +-MAX_SECONDS, rounded
    half up: the SQL attributor rounds the same), or a Rust ``Duration`` Debug text read exactly;
    None where it does not read."""
    if raw is None:
        return None
    if unit == "rust_duration":
        m = RUST_DURATION.fullmatch(raw)
        if m is None:
            return None
        digits = RUST_UNITS[m.group(3)]
        fraction = (m.group(2) or "").ljust(digits, "0")[:digits]
        return int(m.group(1)) * 10**digits + (int(fraction) if fraction else 0)
    value = parse_float(raw)
    if value is None:
        return None
    scale = UNITS[unit]
    bound = MAX_SECONDS * (10**9 // scale)
    return math.floor(min(max(value, -bound), bound) * scale + 0.5)


def evaluate(
    e: Expr,
    span: SpanRecord,
    values: Mapping[str, int | None],
    near: Mapping[str, SpanRecord | None] | None = None,
) -> int | None:
    """An expression's value in ns on ``span`` (None where an input is absent); ``near``: the
    spans its ``parent.`` and ``request.`` points read."""
    if e.kind == "num":
        return int(e.value)
    if e.kind in ("start", "end", "event"):
        on = span if not e.at else (near or {}).get(e.at)
        if on is None:
            return None
        if e.kind == "start":
            return on.start_ns
        if e.kind == "end":
            return on.end_ns
        name, ordinal = e.value
        times = [t for n, t in on.events if n == name]
        if not times:
            return None
        return min(times) if ordinal == "first" else max(times)
    if e.kind == "ref":
        return values.get(e.value)
    args = [evaluate(a, span, values, near) for a in e.args]
    if any(a is None for a in args):
        return None
    if e.kind == "max0":
        return max(0, args[0])  # type: ignore[type-var]
    a, b = args
    assert a is not None and b is not None
    return a + b if e.kind == "add" else a - b


def holds(
    cond: Cond,
    span: SpanRecord,
    values: Mapping[str, int | None],
    near: Mapping[str, SpanRecord | None] | None = None,
) -> bool:
    """Whether ``cond`` holds on ``span`` (false where a side is absent)."""
    a, b = evaluate(cond.left, span, values, near), evaluate(cond.right, span, values, near)
    if a is None or b is None:
        return False
    return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[cond.op]
