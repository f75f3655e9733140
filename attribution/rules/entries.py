"""The rulebook's entries as the attributors read them: an engine's request rule, figures,
derived names, phases, stage spans, parts, first token, TPOT and roles (``Engine``), and the
engines in force in the order they are tried (``Rulebook``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from latscope.attribution.model import SpanRecord
from latscope.attribution.rules.expr import (
    MAX_DEPTH,
    VERSION,
    Cond,
    Expr,
    evaluate,
    events,
    figure_ns,
    holds,
)
from latscope.semconv import SpanKind

# -- the rulebook ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    name: str
    attribute: str
    unit: str


@dataclass(frozen=True)
class PhaseRule:
    bucket: str
    start: Expr
    end: Expr
    #: Kept beside the engine's stage spans (which otherwise replace the phases).
    with_stages: bool = False


@dataclass(frozen=True)
class Part:
    """A span below an engine's request span whose own times and events (and its parent's and
    the request span's) place phases (``[[engine.part]]``: Triton's ``compute`` spans). The
    first part whose name, parent name and conditions all hold is the span's."""

    names: tuple[str, ...]
    parents: tuple[str, ...] = ()
    when: tuple[Cond, ...] = ()
    phases: tuple[PhaseRule, ...] = ()

    def exprs(self) -> list[Expr]:
        out = [x for p in self.phases for x in (p.start, p.end)]
        return out + [x for c in self.when for x in (c.left, c.right)]


@dataclass(frozen=True)
class Engine:
    """One engine's rules (see the module docstring and docs/attribution.md)."""

    name: str
    doc: str = ""
    sources: tuple[str, ...] = ()
    origin: str = ""
    #: The request span: exact names, a regular expression, kinds, attribute keys.
    names: tuple[str, ...] = ()
    name_regex: str = ""
    kinds: tuple[str, ...] = ()
    any_attribute: tuple[str, ...] = ()
    all_attributes: tuple[str, ...] = ()
    numeric: bool = False
    any_event: tuple[str, ...] = ()
    #: A serving system (``[engine.system]``: Dynamo's frontend, TensorRT-LLM's disaggregated
    #: proxy), not an engine: its request span is the window of the engine spans at most this
    #: many levels below it, and the client is found above it (0: an engine).
    system_depth: int = 0
    figures: tuple[Figure, ...] = ()
    derive: tuple[tuple[str, tuple[Expr, ...]], ...] = ()
    phases: tuple[PhaseRule, ...] = ()
    #: Stage spans below the request span: name -> bucket, within ``stage_depth`` levels; the
    #: earliest span of a name in ``first_stages`` stands for that bucket instead.
    stages: tuple[tuple[str, str], ...] = ()
    first_stages: tuple[tuple[str, str], ...] = ()
    stage_depth: int = MAX_DEPTH
    first_token: tuple[Expr, ...] = ()
    #: Without ``first_token`` figures: the first token is at the end of the earliest stage span
    #: of this bucket (TGI's first ``infer`` step).
    first_token_after: str = ""
    tpot_decode: tuple[Expr, ...] = ()
    tpot_when: tuple[str, ...] = ()
    #: Disaggregated roles: ("prefill" | "decode", the request span's name prefix).
    roles: tuple[tuple[str, str], ...] = ()
    #: Parts (``[[engine.part]]``) of spans at most ``part_depth`` levels below the request span;
    #: every SERVER span that deep is the request's own, never an inference call of its own.
    parts: tuple[Part, ...] = ()
    part_depth: int = 0
    #: A replica's startup spans (``[engine.startup]``): ``root`` (the whole load, its end the
    #: replica ready), ``load`` (the weights), ``prepare`` (KV cache, warm-up) -> span name.
    startup: tuple[tuple[str, str], ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # -- matching and evaluating one span (the reference engine) --------------------------------

    def matches(self, span: SpanRecord) -> bool:
        """``span`` is this engine's request span."""
        if self.names and span.name not in self.names:
            return False
        # What the attribute rules need at the least, by key alone (most spans have none).
        if self.any_attribute and self._any_keys.isdisjoint(span.attributes):
            return False
        if self.all_attributes and not self._all_keys.issubset(span.attributes):
            return False
        if self.name_regex and not re.search(self.name_regex, span.name):
            return False
        if self.kinds and kind_name(span.kind) not in self.kinds:
            return False
        if self.all_attributes and not all(self._present(span, k) for k in self.all_attributes):
            return False
        if self.any_event and not any(n in self.any_event for n, _ in span.events):
            return False
        return not self.any_attribute or any(self._present(span, k) for k in self.any_attribute)

    @cached_property
    def _any_keys(self) -> frozenset[str]:
        return frozenset(self.any_attribute)

    @cached_property
    def _all_keys(self) -> frozenset[str]:
        return frozenset(self.all_attributes)

    def _present(self, span: SpanRecord, key: str) -> bool:
        if self.numeric:
            return span.attr_float(key) is not None
        return span.attributes.get(key, "") != ""

    def values(self, span: SpanRecord) -> dict[str, int | None]:
        """The span's figures (ns), then the derived names, in order; None where absent."""
        out: dict[str, int | None] = {
            f.name: figure_ns(span.attributes.get(f.attribute), f.unit) for f in self.figures
        }
        figures = dict(out)
        for name, alternatives in self.derive:
            value = None
            for alt in alternatives:
                # Inside its own alternatives a derived name is the figure of that name.
                value = evaluate(alt, span, {**out, name: figures.get(name)})
                if value is not None:
                    break
            out[name] = value
        return out

    def phase_list(self, span: SpanRecord, *, stages: bool) -> list[tuple[str, int, int]]:
        """The span's phases ``(bucket, start, end)`` from its figures (unclipped; those whose
        ends are absent left out). With ``stages`` (stage spans own parts of it) only the phases
        kept beside them."""
        values = self.values(span)
        out = []
        for p in self.phases:
            if stages and not p.with_stages:
                continue
            lo, hi = evaluate(p.start, span, values), evaluate(p.end, span, values)
            if lo is not None and hi is not None:
                out.append((p.bucket, lo, hi))
        return out

    def first_token_ns(self, span: SpanRecord) -> int | None:
        """The first token's time from the span's start, where its figures say."""
        values = self.values(span)
        for alt in self.first_token:
            at = evaluate(alt, span, values)
            if at is not None:
                return at - span.start_ns
        return None

    def tpot_decode_ns(self, span: SpanRecord) -> int | None:
        """The decode time TPOT divides (over the output tokens but one), where figures say."""
        values = self.values(span)
        if any(values.get(n) is None for n in self.tpot_when):
            return None
        for alt in self.tpot_decode:
            value = evaluate(alt, span, values)
            if value is not None:
                return value
        return None

    def role(self, span: SpanRecord) -> str | None:
        for role, prefix in self.roles:
            if span.name.startswith(prefix):
                return role
        return None

    def stage_bucket(self, name: str) -> str | None:
        return self._stage_buckets.get(name)

    @cached_property
    def _stage_buckets(self) -> dict[str, str]:
        return dict(self.stages)

    def part_of(
        self, span: SpanRecord, parent: SpanRecord | None, request: SpanRecord
    ) -> Part | None:
        """The first part ``span`` is (None: none), below ``request``."""
        near = {"parent": parent, "request": request}
        for part in self.parts:
            if span.name not in part.names:
                continue
            if part.parents and (parent is None or parent.name not in part.parents):
                continue
            if all(holds(c, span, {}, near) for c in part.when):
                return part
        return None

    def part_phases(
        self, part: Part, span: SpanRecord, parent: SpanRecord | None, request: SpanRecord
    ) -> list[tuple[str, int, int]]:
        """A part's phases ``(bucket, start, end)`` (unclipped; those with an absent end left
        out)."""
        near = {"parent": parent, "request": request}
        out = []
        for p in part.phases:
            lo, hi = evaluate(p.start, span, {}, near), evaluate(p.end, span, {}, near)
            if lo is not None and hi is not None:
                out.append((p.bucket, lo, hi))
        return out

    # -- what the SQL attributor needs to read ---------------------------------------------------

    def attributes(self) -> list[str]:
        keys = [*self.any_attribute, *self.all_attributes, *(f.attribute for f in self.figures)]
        return list(dict.fromkeys(keys))

    def event_names(self) -> list[tuple[str, str]]:
        """The (event name, ordinal) pairs the rules read, on whichever span."""
        exprs = [*self.first_token, *self.tpot_decode]
        exprs += [a for _, alts in self.derive for a in alts]
        exprs += [x for p in self.phases for x in (p.start, p.end)]
        exprs += [x for part in self.parts for x in part.exprs()]
        named = {(n, "first") for n in self.any_event}
        return sorted(named.union(*(events(e) for e in exprs)))


def kind_name(kind: str) -> str:
    current = SpanKind.LEGACY.get(kind, kind)
    if current == SpanKind.SERVER:
        return "server"
    if current == SpanKind.CLIENT:
        return "client"
    return "internal"


@dataclass(frozen=True)
class Rulebook:
    """The engines in force, in the order they are tried."""

    engines: tuple[Engine, ...]

    def engine_of(self, span: SpanRecord) -> Engine | None:
        """The first engine whose request rule ``span`` matches."""
        matched = span.matched
        if matched is None or matched[0] is not self:
            matched = self._match(span)
        return matched[1]

    def system_of(self, span: SpanRecord) -> Engine | None:
        """The first serving system whose request rule ``span`` matches."""
        matched = span.matched
        if matched is None or matched[0] is not self:
            matched = self._match(span)
        return matched[2]

    def _match(self, span: SpanRecord) -> tuple[Rulebook, Engine | None, Engine | None]:
        """The span's engine and serving system, kept on the span (``SpanRecord.matched``)."""
        engine = system = None
        for e in self.engines:
            if e.system_depth:
                if system is None and e.matches(span):
                    system = e
            elif engine is None and e.matches(span):
                engine = e
        matched = (self, engine, system)
        # The span is frozen for its fields; ``matched`` is a cache, not one of them.
        object.__setattr__(span, "matched", matched)
        return matched

    def part_names(self) -> list[str]:
        """Every span name a part names (as its own or its parent's), in a fixed order (their
        codes in SQL: index + 1)."""
        names: dict[str, None] = {}
        for engine in self.engines:
            for part in engine.parts:
                for name in (*part.names, *part.parents):
                    names.setdefault(name)
        return list(names)

    def startups(self) -> list[dict[str, str]]:
        """Each engine's startup span names (``root``, ``load``, ``prepare``), in order."""
        return [dict(e.startup) for e in self.engines if e.startup]

    def part_depth(self) -> int:
        return max((e.part_depth for e in self.engines), default=0)

    def stage_names(self) -> list[str]:
        """Every stage name of every engine, in a fixed order (their codes in SQL: index + 1)."""
        names: dict[str, None] = {}
        for engine in self.engines:
            for name, _ in (*engine.stages, *engine.first_stages):
                names.setdefault(name)
        return list(names)

    def stage_bucket(self, name: str) -> str | None:
        """The bucket a stage name stands for (the same in every engine that names it)."""
        return self._stage_buckets.get(name)

    @cached_property
    def _stage_buckets(self) -> dict[str, str]:
        buckets: dict[str, str] = {}
        for engine in self.engines:
            for name, bucket in engine.stages:
                buckets.setdefault(name, bucket)
        return buckets

    def to_toml(self) -> str:
        """The rulebook in force as one TOML document, each entry with its origin."""
        out = [f"rulebook = {VERSION}"]
        for engine in self.engines:
            out += ["", f"# from {engine.origin}", "[[engine]]"]
            out += _toml_table(engine.raw, "engine")
        return "\n".join(out) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        if "\n" in value:
            return '"""\n' + value.replace("\\", "\\\\").replace('"""', '\\"""') + '"""'
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(type(value))


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _toml_value(key)


#: Tables printed as sections of their own even when they hold only scalars.
_SECTIONS = (
    "request", "figures", "derive", "stages", "names", "first", "first_token", "tpot", "roles",
    "system", "parts", "startup",
)  # fmt: skip


def _toml_table(table: Mapping[str, Any], path: str) -> list[str]:
    """``table`` as TOML lines under ``path``: scalars and inline values first, then its
    sections and arrays of tables."""
    lines, subs = [], []
    for key, value in table.items():
        section = isinstance(value, dict) and key in _SECTIONS
        tables = isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)
        if section or tables:
            subs.append((key, value))
        else:
            lines.append(f"{_key(key)} = {_toml_value(value)}")
    for key, value in subs:
        if isinstance(value, list):
            for item in value:
                lines += ["", f"[[{path}.{key}]]", *_toml_table(item, f"{path}.{key}")]
        else:
            lines += ["", f"[{path}.{key}]", *_toml_table(value, f"{path}.{key}")]
    return lines
