"""The rulebook: what each serving engine writes, mapped to latscope's phases, as data.

One TOML file per engine (``attribution/rules/*.toml``) says which span is the engine's request
span, which figures it carries (attribute, unit), how they become phase intervals, which spans
below it are its stages, where its first token is, and how its disaggregated roles are named.
Both attributors take their engine rules from here: the reference engine evaluates the entries
in Python (``Engine.phases`` and friends), and the SQL attributor renders the same entries into
its statement (``latscope.attribution.sql.engines``), so a new engine is data and a test, never
SQL. docs/attribution.md ("Engines") has the format, the shipped table and how to add an engine.

``latscope serve --rules FILE`` adds or overrides entries (``load(extra=...)``); every file is
validated as it is read, each problem reported as ``FILE:LINE: engine "name": what`` and the
server refuses to start. ``latscope rules`` prints the rulebook in force.
"""

from __future__ import annotations

import difflib
import math
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from latscope.attribution.model import SpanRecord, parse_float
from latscope.semconv import BUCKETS, KV_TRANSFER, Phase, SpanKind

#: The format version this latscope reads.
VERSION = 1
#: The shipped files, tried in this order (user files go first): an entry that matches a narrower
#: shape comes before the generic ``gen_ai.latency`` one.
SHIPPED = ("dynamo", "trtllm", "tgi", "sglang", "vllm")
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

_TOP_KEYS = {"rulebook", "engine"}
_ENGINE_KEYS = {
    "name",
    "doc",
    "sources",
    "request",
    "figures",
    "derive",
    "phase",
    "stages",
    "first_token",
    "tpot",
    "roles",
    "system",
}
_REQUEST_KEYS = {
    "name",
    "name_regex",
    "kind",
    "any_attribute",
    "all_attributes",
    "numeric",
    "any_event",
}
_SYSTEM_KEYS = {"depth"}
_FIGURE_KEYS = {"attribute", "unit", "doc"}
_PHASE_KEYS = {"bucket", "from", "to", "with_stages", "doc"}
_STAGES_KEYS = {"depth", "names", "first"}
_FIRST_TOKEN_KEYS = {"at", "after_stage"}
_TPOT_KEYS = {"decode", "when"}
_ROLE_NAMES = ("prefill", "decode")


class RulebookError(ValueError):
    """A rule file that can not be used: every problem, one ``FILE:LINE: ...`` line each."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


# -- expressions -----------------------------------------------------------------------------------
#
# expr := term (("+" | "-") term)*      Int64 ns arithmetic; an absent input makes it absent
# term := INTEGER | NAME | "start" | "end" | "event(" EVENT ")" | "max0(" expr ")" | "(" expr ")"
#
# start, end and event(...) are instants; figures, derived names and integers durations;
# instant +- duration is an instant, instant - instant a duration.

INSTANT, DURATION = "instant", "duration"
_TOKEN = re.compile(r"\s*(?:(?P<num>[0-9]+)|(?P<name>[A-Za-z_][A-Za-z0-9_.]*)|(?P<op>[-+()]))")
_EVENT = re.compile(r"\s*event\(\s*([^()]+?)\s*\)")


@dataclass(frozen=True)
class Expr:
    """A parsed expression: ``kind`` is ``num``, ``ref`` (a figure or derived name), ``start``,
    ``end``, ``event``, ``max0``, ``add`` or ``sub``."""

    kind: str
    value: Any = None
    args: tuple[Expr, ...] = ()


def parse_expr(text: str) -> Expr:
    """Parse one expression; ValueError with what is wrong."""
    pos = 0

    def peek() -> tuple[str, str] | None:
        m = _EVENT.match(text, pos)
        if m:
            return ("event", m.group(1))
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            return None
        kind = m.lastgroup
        assert kind is not None
        return (kind, m.group(kind))

    def take() -> tuple[str, str]:
        nonlocal pos
        m = _EVENT.match(text, pos) or _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            rest = text[pos:].strip()
            raise ValueError(f"cannot read {rest!r}" if rest else "ends too soon")
        pos = m.end()
        found = peek_at(m)
        return found

    def peek_at(m: re.Match[str]) -> tuple[str, str]:
        if m.re is _EVENT:
            return ("event", m.group(1))
        kind = m.lastgroup
        assert kind is not None
        return (kind, m.group(kind))

    def term() -> Expr:
        kind, value = take()
        if kind == "num":
            return Expr("num", int(value))
        if kind == "event":
            return Expr("event", value)
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
            if value in ("start", "end"):
                return Expr(value)
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


def refs(e: Expr) -> set[str]:
    """The figure and derived names an expression reads."""
    if e.kind == "ref":
        return {e.value}
    return set().union(*(refs(a) for a in e.args)) if e.args else set()


def events(e: Expr) -> set[str]:
    if e.kind == "event":
        return {e.value}
    return set().union(*(events(a) for a in e.args)) if e.args else set()


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
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # -- matching and evaluating one span (the reference engine) --------------------------------

    def matches(self, span: SpanRecord) -> bool:
        """``span`` is this engine's request span."""
        if self.names and span.name not in self.names:
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
        return dict(self.stages).get(name)

    # -- what the SQL attributor needs to read ---------------------------------------------------

    def attributes(self) -> list[str]:
        keys = [*self.any_attribute, *self.all_attributes, *(f.attribute for f in self.figures)]
        return list(dict.fromkeys(keys))

    def event_names(self) -> list[str]:
        exprs = [*self.first_token, *self.tpot_decode]
        exprs += [a for _, alts in self.derive for a in alts]
        exprs += [x for p in self.phases for x in (p.start, p.end)]
        named = set(self.any_event)
        return sorted(named.union(*(events(e) for e in exprs)))


def kind_name(kind: str) -> str:
    current = SpanKind.LEGACY.get(kind, kind)
    if current == SpanKind.SERVER:
        return "server"
    if current == SpanKind.CLIENT:
        return "client"
    return "internal"


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


def evaluate(e: Expr, span: SpanRecord, values: Mapping[str, int | None]) -> int | None:
    """An expression's value in ns on ``span`` (None where an input is absent)."""
    if e.kind == "num":
        return int(e.value)
    if e.kind == "start":
        return span.start_ns
    if e.kind == "end":
        return span.end_ns
    if e.kind == "event":
        return min((t for n, t in span.events if n == e.value), default=None)
    if e.kind == "ref":
        return values.get(e.value)
    args = [evaluate(a, span, values) for a in e.args]
    if any(a is None for a in args):
        return None
    if e.kind == "max0":
        return max(0, args[0])  # type: ignore[type-var]
    a, b = args
    assert a is not None and b is not None
    return a + b if e.kind == "add" else a - b


@dataclass(frozen=True)
class Rulebook:
    """The engines in force, in the order they are tried."""

    engines: tuple[Engine, ...]

    def engine_of(self, span: SpanRecord) -> Engine | None:
        """The first engine whose request rule ``span`` matches."""
        for engine in self.engines:
            if not engine.system_depth and engine.matches(span):
                return engine
        return None

    def system_of(self, span: SpanRecord) -> Engine | None:
        """The first serving system whose request rule ``span`` matches."""
        for engine in self.engines:
            if engine.system_depth and engine.matches(span):
                return engine
        return None

    def stage_names(self) -> list[str]:
        """Every stage name of every engine, in a fixed order (their codes in SQL: index + 1)."""
        names: dict[str, None] = {}
        for engine in self.engines:
            for name, _ in (*engine.stages, *engine.first_stages):
                names.setdefault(name)
        return list(names)

    def stage_bucket(self, name: str) -> str | None:
        """The bucket a stage name stands for (the same in every engine that names it)."""
        for engine in self.engines:
            bucket = engine.stage_bucket(name)
            if bucket is not None:
                return bucket
        return None

    def to_toml(self) -> str:
        """The rulebook in force as one TOML document, each entry with its origin."""
        out = [f"rulebook = {VERSION}"]
        for engine in self.engines:
            out += ["", f"# from {engine.origin}", "[[engine]]"]
            out += _toml_table(engine.raw, "engine")
        return "\n".join(out) + "\n"


# -- reading and checking files --------------------------------------------------------------------


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
    "system",
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


class _Lines:
    """Where each ``[[engine]]`` entry and each key of it starts in a file's text, for messages."""

    def __init__(self, text: str) -> None:
        self.entries: list[int] = []
        self.keys: list[list[tuple[str, str, int]]] = []
        section = ""
        for number, line in enumerate(text.splitlines(), 1):
            stripped = line.strip()
            if stripped.startswith("[[engine]]"):
                self.entries.append(number)
                self.keys.append([])
                section = ""
            elif stripped.startswith("["):
                section = stripped.strip("[] ").removeprefix("engine.").removeprefix("engine")
                if self.keys:
                    self.keys[-1].append((section, "", number))
            elif "=" in stripped and not stripped.startswith("#") and self.keys:
                key = stripped.split("=", 1)[0].strip().strip('"')
                self.keys[-1].append((section, key, number))

    def line(self, entry: int | None, section: str = "", key: str = "", nth: int = 0) -> int:
        """The line of ``key`` in ``section`` (its ``nth`` occurrence of that section header for
        arrays of tables) of entry ``entry``; the entry's or the section's line when not found."""
        if entry is None or entry >= len(self.keys):
            return 1
        found = self.entries[entry]
        seen = -1
        for sec, k, number in self.keys[entry]:
            if sec == section and k == "":
                seen += 1
                if seen == nth:
                    found = number
            elif sec == section and k == key and (seen == nth or not section) and key:
                return number
        return found


def read_file(path: str | Path, *, text: str | None = None) -> list[Engine]:
    """One rule file's engines, validated; RulebookError with every problem found."""
    label = str(path)
    if text is None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise RulebookError([f"{label}: cannot read: {e.strerror or e}"]) from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        line = getattr(e, "lineno", None)
        where = f"{label}:{line}" if line else label
        message = str(e).split(" (at line")[0]
        raise RulebookError([f"{where}: not TOML: {message}"]) from None
    lines = _Lines(text)
    problems: list[str] = []
    for key in doc.keys() - _TOP_KEYS:
        problems.append(f"{label}:1: unknown key {key!r} (known: rulebook, engine)")
    if doc.get("rulebook") != VERSION:
        problems.append(
            f"{label}:1: rulebook {doc.get('rulebook')!r}: this latscope reads rulebook {VERSION}"
            " (write `rulebook = 1` first)"
        )
    entries = doc.get("engine", [])
    if not isinstance(entries, list):
        problems.append(f"{label}:1: engine must be [[engine]] tables")
        entries = []
    engines: list[Engine] = []
    names: set[str] = set()
    for i, raw in enumerate(entries):
        checker = _Checker(label, lines, i, raw)
        engine = checker.engine()
        problems += checker.problems
        if engine is not None:
            if engine.name in names:
                problems.append(checker.at("", "name", f"name {engine.name!r} given twice"))
            names.add(engine.name)
            engines.append(engine)
    if problems:
        raise RulebookError(sorted(problems, key=_line_of))
    return engines


def _line_of(problem: str) -> int:
    """A problem's line number, for sorting (``FILE:LINE: ...``)."""
    m = re.match(r"^.*?:(\d+): ", problem)
    return int(m.group(1)) if m else 0


class _Checker:
    """Validates one ``[[engine]]`` table and builds its Engine, collecting problems."""

    def __init__(self, label: str, lines: _Lines, index: int, raw: Any) -> None:
        self.label, self.lines, self.index, self.raw = label, lines, index, raw
        self.problems: list[str] = []
        self.name = raw.get("name", f"#{index + 1}") if isinstance(raw, dict) else f"#{index + 1}"

    def at(self, section: str, key: str, what: str, nth: int = 0) -> str:
        line = self.lines.line(self.index, section, key, nth)
        return f"{self.label}:{line}: engine {self.name!r}: {what}"

    def problem(self, section: str, key: str, what: str, nth: int = 0) -> None:
        self.problems.append(self.at(section, key, what, nth))

    def _known(self, table: Mapping[str, Any], known: set[str], section: str, nth: int = 0) -> None:
        for key in table.keys() - known:
            hint = difflib.get_close_matches(key, sorted(known), 1)
            also = (
                f" (did you mean {hint[0]!r}?)" if hint else f" (known: {', '.join(sorted(known))})"
            )
            self.problem(section, key, f"unknown key {key!r}{also}", nth)

    def _strings(self, value: Any, section: str, key: str) -> tuple[str, ...]:
        if isinstance(value, str):
            return (value,)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        self.problem(section, key, f"{key} must be a string or a list of strings")
        return ()

    def _alternatives(
        self, table: Mapping[str, Any], section: str, key: str, types: Mapping[str, str], want: str
    ) -> tuple[Expr, ...]:
        """``table[key]``: expressions of type ``want``, the first present one counting."""
        texts = self._strings(table.get(key, []), section, key)
        exprs = [self._expr(t, types, want, (section, key, 0)) for t in texts]
        return tuple(e for e in exprs if e is not None)

    def _depth(self, table: Mapping[str, Any], section: str) -> int:
        """A table's ``depth``: 1 .. MAX_DEPTH levels (MAX_DEPTH when absent or wrong)."""
        depth = table.get("depth", MAX_DEPTH)
        if not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH:
            self.problem(section, "depth", f"depth {depth!r} must be 1 .. {MAX_DEPTH}")
            return MAX_DEPTH
        return depth

    def _bucket(self, value: Any, section: str, key: str, nth: int = 0) -> str | None:
        if value in PHASE_BUCKETS:
            return str(value)
        hint = difflib.get_close_matches(str(value), PHASE_BUCKETS, 1)
        also = f"; did you mean {hint[0]!r}?" if hint else ""
        self.problem(
            section, key, f"bucket {value!r} is not one of {', '.join(PHASE_BUCKETS)}{also}", nth
        )
        return None

    def _expr(
        self, text: Any, types: Mapping[str, str], want: str | None, where: tuple[str, str, int]
    ) -> Expr | None:
        section, key, nth = where
        if not isinstance(text, str):
            self.problem(section, key, f"{key} must be an expression (a string)", nth)
            return None
        try:
            e = parse_expr(text)
            got = expr_type(e, types)
        except ValueError as err:
            known = ", ".join(sorted(types)) or "none"
            self.problem(section, key, f"{key} {text!r}: {err} (names: {known})", nth)
            return None
        if want is not None and got != want:
            hint = ' (write "start + ..." for a time after the start)' if want == INSTANT else ""
            article = "an" if want == INSTANT else "a"
            self.problem(
                section, key, f"{key} {text!r}: a {got} where {article} {want} is needed{hint}", nth
            )
            return None
        return e

    def engine(self) -> Engine | None:
        raw = self.raw
        if not isinstance(raw, dict):
            self.problem("", "", "an [[engine]] entry must be a table")
            return None
        self._known(raw, _ENGINE_KEYS, "")
        name = raw.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            self.problem("", "name", f"name {name!r} must match {NAME.pattern}")
            return None
        kw: dict[str, Any] = {
            "name": name,
            "doc": str(raw.get("doc", "")).strip(),
            "sources": self._strings(raw.get("sources", []), "", "sources"),
            "origin": self.label,
            "raw": raw,
        }
        request = raw.get("request")
        if not isinstance(request, dict):
            self.problem("", "", "[engine.request] is missing: which span is the request span")
            request = {}
        self._known(request, _REQUEST_KEYS, "request")
        if "name" in request:
            kw["names"] = self._strings(request["name"], "request", "name")
        if "name_regex" in request:
            try:
                re.compile(request["name_regex"])
                kw["name_regex"] = str(request["name_regex"])
            except (re.error, TypeError) as e:
                self.problem("request", "name_regex", f"name_regex: not a regular expression: {e}")
        if "kind" in request:
            kw["kinds"] = self._strings(request["kind"], "request", "kind")
            for k in kw["kinds"]:
                if k not in KINDS:
                    self.problem("request", "kind", f"kind {k!r} is not one of {', '.join(KINDS)}")
        for key in ("any_attribute", "all_attributes", "any_event"):
            if key in request:
                kw[key] = self._strings(request[key], "request", key)
        kw["numeric"] = bool(request.get("numeric", False))
        if not (kw.get("names") or kw.get("name_regex") or kw.get("any_attribute")
                or kw.get("all_attributes")):  # fmt: skip
            self.problem("request", "", "[engine.request] names no span name nor attribute")
        types: dict[str, str] = {}
        figures = []
        table = raw.get("figures", {})
        for fname, spec in table.items() if isinstance(table, dict) else []:
            if not isinstance(spec, dict):
                self.problem("figures", fname, f"figure {fname!r}: {{ attribute, unit }} needed")
                continue
            self._known(spec, _FIGURE_KEYS, "figures")
            unit = spec.get("unit")
            types[fname] = DURATION  # known, so that its uses are not reported as well
            if unit not in UNITS:
                self.problem(
                    "figures",
                    fname,
                    f"figure {fname!r}: unit {unit!r} is not one of {', '.join(UNITS)}",
                )
                continue
            if not isinstance(spec.get("attribute"), str) or not spec["attribute"]:
                self.problem("figures", fname, f"figure {fname!r}: attribute (a key) needed")
                continue
            figures.append(Figure(fname, spec["attribute"], unit))
        kw["figures"] = tuple(figures)
        derive = []
        table = raw.get("derive", {})
        for dname, alts in table.items() if isinstance(table, dict) else []:
            texts = self._strings(alts, "derive", dname)
            parsed: list[Expr] = []
            kinds: set[str] = set()
            for t in texts:
                # Inside its own alternatives a derived name is the figure of that name.
                alt = self._expr(t, types, None, ("derive", dname, 0))
                if alt is not None:
                    parsed.append(alt)
                    kinds.add(expr_type(alt, types))
            if len(kinds) > 1:
                self.problem("derive", dname, f"{dname}: alternatives mix instants and durations")
            if parsed:
                types[dname] = kinds.pop() if kinds else DURATION
                derive.append((dname, tuple(parsed)))
        kw["derive"] = tuple(derive)
        phases = []
        raw_phases = raw.get("phase", [])
        for n, p in enumerate(raw_phases if isinstance(raw_phases, list) else []):
            if not isinstance(p, dict):
                continue
            self._known(p, _PHASE_KEYS, "phase", n)
            bucket = self._bucket(p.get("bucket"), "phase", "bucket", n)
            lo = self._expr(p.get("from"), types, INSTANT, ("phase", "from", n))
            hi = self._expr(p.get("to"), types, INSTANT, ("phase", "to", n))
            if bucket is not None and lo is not None and hi is not None:
                phases.append(PhaseRule(bucket, lo, hi, bool(p.get("with_stages", False))))
        kw["phases"] = tuple(phases)
        stages = raw.get("stages", {})
        if isinstance(stages, dict) and stages:
            self._known(stages, _STAGES_KEYS, "stages")
            kw["stage_depth"] = self._depth(stages, "stages")
            for key in ("names", "first"):
                table = stages.get(key, {})
                pairs = []
                for sname, bucket in table.items() if isinstance(table, dict) else []:
                    b = self._bucket(bucket, f"stages.{key}", sname)
                    if b is not None:
                        pairs.append((sname, b))
                kw["stages" if key == "names" else "first_stages"] = tuple(pairs)
            for sname, _ in kw.get("first_stages", ()):
                if sname not in dict(kw.get("stages", ())):
                    self.problem("stages.first", sname, f"stage {sname!r} is not in stages.names")
        first = raw.get("first_token", {})
        if isinstance(first, dict) and first:
            self._known(first, _FIRST_TOKEN_KEYS, "first_token")
            kw["first_token"] = self._alternatives(first, "first_token", "at", types, INSTANT)
            after = first.get("after_stage")
            if after is not None:
                kw["first_token_after"] = self._bucket(after, "first_token", "after_stage") or ""
        tpot = raw.get("tpot", {})
        if isinstance(tpot, dict) and tpot:
            self._known(tpot, _TPOT_KEYS, "tpot")
            kw["tpot_decode"] = self._alternatives(tpot, "tpot", "decode", types, DURATION)
            when = self._strings(tpot.get("when", []), "tpot", "when")
            for w in when:
                if w not in types:
                    self.problem("tpot", "when", f"when {w!r}: unknown name")
            kw["tpot_when"] = when
        roles = raw.get("roles", {})
        if isinstance(roles, dict) and roles:
            for role, prefix in roles.items():
                if role not in _ROLE_NAMES or not isinstance(prefix, str) or not prefix:
                    self.problem("roles", role, f"role {role!r}: prefill or decode = a name prefix")
            kw["roles"] = tuple((r, p) for r, p in roles.items() if r in _ROLE_NAMES and p)
        system = raw.get("system")
        if isinstance(system, dict):
            self._known(system, _SYSTEM_KEYS, "system")
            kw["system_depth"] = self._depth(system, "system")
            if raw.get("phase") or raw.get("stages"):
                self.problem("system", "", "a serving system places nothing: its engines do")
        elif not (raw.get("phase") or raw.get("stages")):
            self.problem("", "name", "no [[engine.phase]] and no [engine.stages]: nothing to place")
        return Engine(**kw)


def shipped_files() -> list[tuple[str, str]]:
    """(label, text) of the shipped rule files, in ``SHIPPED`` order."""
    root = resources.files(__name__)
    return [
        (f"latscope/attribution/rules/{n}.toml", (root / f"{n}.toml").read_text("utf-8"))
        for n in SHIPPED
    ]


def load(extra: Iterable[str | Path] = ()) -> Rulebook:
    """The shipped rulebook with ``extra`` files on top: an entry of a name already in force
    replaces it where it stands, a new name is tried before the shipped ones. RulebookError with
    every problem of every file."""
    shipped: list[Engine] = []
    for label, text in shipped_files():
        shipped += read_file(label, text=text)
    problems: list[str] = []
    added: list[Engine] = []
    replaced: dict[str, Engine] = {}
    for path in extra:
        try:
            for engine in read_file(path):
                if any(e.name == engine.name for e in shipped):
                    replaced[engine.name] = engine
                else:
                    added.append(engine)
        except RulebookError as e:
            problems += e.problems
    engines = [*added, *(replaced.get(e.name, e) for e in shipped)]
    problems += _conflicts(engines)
    if problems:
        raise RulebookError(problems)
    return Rulebook(tuple(engines))


def _conflicts(engines: Sequence[Engine]) -> list[str]:
    """A stage name must stand for one bucket whichever engine names it (the SQL attributor
    codes a stage span by its name before it knows its request's engine)."""
    seen: dict[str, tuple[str, str]] = {}
    out = []
    for engine in engines:
        for name, bucket in engine.stages:
            other = seen.setdefault(name, (bucket, engine.name))
            if other[0] != bucket:
                out.append(
                    f"{engine.origin}: engine {engine.name!r}: stage {name!r} is {bucket!r} here"
                    f" but {other[0]!r} in engine {other[1]!r} (one bucket per stage name)"
                )
    return out


_ACTIVE: list[Rulebook] = []


def active() -> Rulebook:
    """The rulebook in force (the shipped one until ``install``)."""
    if not _ACTIVE:
        _ACTIVE.append(load())
    return _ACTIVE[0]


def install(rulebook: Rulebook) -> None:
    """Put ``rulebook`` in force for both attributors (``latscope serve --rules``)."""
    _ACTIVE[:] = [rulebook]
    for hook in _ON_INSTALL:
        hook()


#: Caches of what was rendered from the rulebook, cleared when another one is installed.
_ON_INSTALL: list[Any] = []


def on_install(hook: Any) -> Any:
    _ON_INSTALL.append(hook)
    return hook


__all__ = [
    "BUCKETS",
    "Engine",
    "Rulebook",
    "RulebookError",
    "active",
    "figure_ns",
    "install",
    "load",
    "read_file",
]
