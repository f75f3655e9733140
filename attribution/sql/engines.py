"""The rulebook's engine entries (``latscope.attribution.rules``) rendered into the SQL
attributor's statement: which engine's request span a span is, its figures, its phases, its
first token and TPOT, its disaggregated role, and its stage spans by name. The reference engine
evaluates the same entries in Python (``rules.Engine``); the property tests hold the two equal on
random traces of every engine in the rulebook.

Every value here comes from the rulebook (keys, names, units, expressions), never from a span: a
rulebook string is rendered as a ClickHouse literal.
"""

from __future__ import annotations

from collections.abc import Callable

from latscope.attribution.model import NUMBER
from latscope.attribution.rules import (
    MAX_SECONDS,
    RUST_DURATION,
    RUST_UNITS,
    UNITS,
    Engine,
    Expr,
    Rulebook,
)

#: What an engine's figures, phases and first token read from a span, as SQL over stage 1's
#: columns: ``attr(key)`` a raw attribute value (a String, '' when absent).
Attr = Callable[[str], str]


def _lit(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _array(values: list[str]) -> str:
    return "[" + ", ".join(_lit(v) for v in values) + "]"


def _duration_ns(raw: str) -> str:
    """rules.figure_ns of the String ``raw``, Rust's ``Duration`` Debug format: Nullable(Int64)."""
    groups = f"extractGroups({raw}, {_lit(RUST_DURATION.pattern)})"
    per_unit = (
        "multiIf("
        + ", ".join(f"g[3] = {_lit(u)}, toInt64({10**d})" for u, d in RUST_UNITS.items())
        + ", toInt64(0))"
    )
    digits = (
        "multiIf(" + ", ".join(f"g[3] = {_lit(u)}, {d}" for u, d in RUST_UNITS.items()) + ", 0)"
    )
    return (
        f"if(match({raw}, {_lit(RUST_DURATION.pattern)}), arrayMap(g -> toInt64(g[1])"
        f" * {per_unit} + toInt64OrZero(substring(rightPad(g[2], 9, '0'), 1, {digits})),"
        f" [{groups}])[1], NULL)"
    )


def _number_ns(raw: str, scale: str, bound: str) -> str:
    """rules.figure_ns of the String ``raw``, a decimal number in a unit of ``scale`` ns, at most
    ``bound`` in magnitude: Nullable(Int64)."""
    value = f"toFloat64OrNull({raw})"
    clamped = f"if(abs({value}) > {bound}, sign({value}) * {bound}, {value})"
    return (
        f"if(match({raw}, {_lit(NUMBER.pattern)}), toInt64(floor({clamped} * {scale} + 0.5)), NULL)"
    )


def figures_sql(raws: list[str], units: list[str]) -> str:
    """rules.figure_ns of each String of ``raws`` in its unit of ``units``: an
    Array(Nullable(Int64)), by one lambda (one copy of each parse in the statement, whatever the
    number of figures)."""
    scales = [UNITS[u] for u in units]
    bounds = [MAX_SECONDS * (10**9 // s) if s else 0.0 for s in scales]
    parse = f"if(scale = 0, {_duration_ns('raw')}, {_number_ns('raw', 'scale', 'bound')})"
    return (
        f"arrayMap((raw, scale, bound) -> {parse}, [{', '.join(raws)}], "
        f"CAST({scales}, 'Array(UInt64)'), CAST({bounds}, 'Array(Float64)'))"
    )


class EngineSql:
    """The SQL of one rulebook, given how stage 1 reads an attribute (``attr``) and an event's
    first time (``event``)."""

    def __init__(self, book: Rulebook) -> None:
        self.book = book
        self.figures: list[tuple[str, str]] = list(
            dict.fromkeys((f.attribute, f.unit) for e in book.engines for f in e.figures)
        )
        self.events: list[tuple[str, str]] = sorted(
            {n for e in book.engines for n in e.event_names()}
        )
        self.stage_names = book.stage_names()
        self.part_names = book.part_names()

    def attributes(self) -> list[str]:
        keys = [k for e in self.book.engines for k in e.attributes()]
        return list(dict.fromkeys(keys))

    # -- stage 0: the raw values -----------------------------------------------------------------

    def rule_events(self) -> str:
        """Each (event name, ordinal) the rules read: its first or last time (ns), else NULL."""
        if not self.events:
            return "CAST([], 'Array(Nullable(Int64))')"
        pick = {"first": "arrayMin", "last": "arrayMax"}
        items = [
            f"if(has(Events.Name, {_lit(n)}), toUnixTimestamp64Nano({pick[o]}(arrayFilter("
            f"(t, n) -> n = {_lit(n)}, Events.Timestamp, Events.Name))), NULL)"
            for n, o in self.events
        ]
        return f"CAST([{', '.join(items)}], 'Array(Nullable(Int64))')"

    def _event(self, name: str, ordinal: str = "first") -> int:
        """An event's place (1-based) in ``rule_events``."""
        return self.events.index((name, ordinal)) + 1

    # -- stage 1: which engine, its figures ------------------------------------------------------

    def match(
        self, engine: Engine, attr: Attr, name: str, kind: str, *, event_names: str = ""
    ) -> str:
        """rules.Engine.matches. An event is tested by its time in stage 0's ``rule_events``, or
        with ``event_names`` (the span's event names) by its name: a statement that reads no
        event's time then builds no such array for every span."""
        conds = []
        if engine.names:
            conds.append(f"{name} IN ({', '.join(_lit(n) for n in engine.names)})")
        if engine.name_regex:
            conds.append(f"match({name}, {_lit(engine.name_regex)})")
        if engine.kinds:
            conds.append(f"{kind} IN ({', '.join(_lit(k) for k in engine.kinds)})")

        def present(key: str) -> str:
            if engine.numeric:
                return f"match({attr(key)}, {_lit(NUMBER.pattern)})"
            return f"{attr(key)} != ''"

        if engine.all_attributes:
            conds += [present(k) for k in engine.all_attributes]
        if engine.any_attribute:
            conds.append("(" + " OR ".join(present(k) for k in engine.any_attribute) + ")")
        if engine.any_event:
            at = [
                f"has({event_names}, {_lit(n)})"
                if event_names
                else f"rule_events[{self._event(n)}] IS NOT NULL"
                for n in engine.any_event
            ]
            conds.append("(" + " OR ".join(at) + ")")
        return "(" + " AND ".join(conds or ["1"]) + ")"

    def engine_code(
        self,
        attr: Attr,
        name: str,
        kind: str,
        engines: list[int] | None = None,
        *,
        system: bool = False,
        event_names: str = "",
    ) -> str:
        """The span's engine: the index + 1 of the first entry it matches, else 0 (only the
        entries ``engines`` when given; the serving systems' with ``system``; ``event_names``:
        as ``match``)."""
        branches = []
        for i, engine in enumerate(self.book.engines, 1):
            if bool(engine.system_depth) != system:
                continue
            if engines is None or i in engines:
                branches += [self.match(engine, attr, name, kind, event_names=event_names), str(i)]
        if not branches:
            return "toUInt8(0)"
        return f"toUInt8(multiIf({', '.join(branches)}, 0))"

    def without_latency_key(self, latency: set[str]) -> list[int]:
        """The entries (index + 1) whose request span may carry no ``latency`` key at all."""
        out = []
        for i, e in enumerate(self.book.engines, 1):
            needs = bool(set(e.all_attributes) & latency) or (
                bool(e.any_attribute) and set(e.any_attribute) <= latency
            )
            if not needs:
                out.append(i)
        return out

    def system_depth(self, code: str) -> str:
        """How far below a serving system's request span its engine spans may sit."""
        return f"{[e.system_depth for e in self.book.engines]}[{code}]"

    def figure_columns(self, attr: Attr) -> str:
        """``rf``: each (attribute, unit) pair's value in ns on engine spans, in the order of
        ``figures`` (NULL where it is no figure; empty on other spans, so every one is NULL)."""
        if not self.figures:
            return "CAST([], 'Array(Nullable(Int64))') AS rf"
        raws = [attr(key) for key, _ in self.figures]
        units = [unit for _, unit in self.figures]
        return (
            f"if(engine = 0, CAST([], 'Array(Nullable(Int64))'), {figures_sql(raws, units)}) AS rf"
        )

    def kind_name(self, kind_code: str, server: int, client: int) -> str:
        """The kind as a request rule names it (rules.kind_name)."""
        return (
            f"multiIf({kind_code} = {server}, 'server', {kind_code} = {client}, 'client', "
            "'internal')"
        )

    def role(self, role: str) -> str:
        """The span is its engine's request span of disaggregated role ``role``."""
        branches = []
        for i, engine in enumerate(self.book.engines, 1):
            prefix = dict(engine.roles).get(role)
            if prefix:
                branches += [f"engine = {i}", f"startsWith(name, {_lit(prefix)})"]
        return f"multiIf({', '.join(branches)}, 0)" if branches else "0"

    # -- stage 1 (second SELECT): phases, first token, TPOT -------------------------------------

    def _expr(self, e: Expr, engine: Engine, own: str | None = None) -> str:
        if e.kind == "num":
            return f"toInt64({int(e.value)})"
        if e.kind == "start":
            return "start_ns"
        if e.kind == "end":
            return "end_ns"
        if e.kind == "event":
            return f"rule_events[{self._event(*e.value)}]"
        if e.kind == "ref":
            return self._ref(e.value, engine, own)
        args = [self._expr(a, engine, own) for a in e.args]
        if e.kind == "max0":
            return f"if({args[0]} < 0, toInt64(0), {args[0]})"
        return f"({args[0]} {'+' if e.kind == 'add' else '-'} {args[1]})"

    def _ref(self, name: str, engine: Engine, own: str | None) -> str:
        """A figure or derived value the rules name: a derived one is its column
        (``derived_columns``), or spelled out inside another derived value's expression (``own``:
        the one being spelled out, whose own name there is the figure it refines)."""
        derived = dict(engine.derive)
        if name in derived and name != own:
            if own is None:
                return self._derived_column(engine, name)
            return self._derived(engine, name)
        for f in engine.figures:
            if f.name == name:
                return f"rf[{self.figures.index((f.attribute, f.unit)) + 1}]"
        raise KeyError(name)  # the rulebook's validation makes this unreachable

    def _derived(self, engine: Engine, name: str) -> str:
        alts = [self._expr(a, engine, name) for a in dict(engine.derive)[name]]
        return alts[0] if len(alts) == 1 else f"coalesce({', '.join(alts)})"

    def _derived_column(self, engine: Engine, name: str) -> str:
        at = next(i for i, e in enumerate(self.book.engines, 1) if e is engine)
        return f"rd_{at}_{[n for n, _ in engine.derive].index(name) + 1}"

    def derived_columns(self) -> str:
        """Each engine's derived values (``[engine.derive]``) on its request spans, a column each
        (NULL on other spans), computed a layer before the phases, first token and TPOT that read
        them."""
        columns = [
            f"if(engine = {i}, {self._derived(engine, name)}, NULL) "
            f"AS {self._derived_column(engine, name)}"
            for i, engine in enumerate(self.book.engines, 1)
            for name, _ in engine.derive
        ]
        return ",\n        ".join(columns) or "0 AS rd_none"

    def _first(self, alts: tuple[Expr, ...], engine: Engine) -> str:
        parts = [self._expr(a, engine) for a in alts]
        return parts[0] if len(parts) == 1 else f"coalesce({', '.join(parts)})"

    def phases(self, ranks: dict[str, int]) -> str:
        """Each engine span's phases from its figures: Array((rank, start, end, kept beside its
        stage spans)), those with an absent end left out."""
        branches = []
        for i, engine in enumerate(self.book.engines, 1):
            if not engine.phases:
                continue
            items = [
                f"(toUInt8({ranks[p.bucket]}), {self._expr(p.start, engine)}, "
                f"{self._expr(p.end, engine)}, toUInt8({int(p.with_stages)}))"
                for p in engine.phases
            ]
            branches += [f"engine = {i}", f"[{', '.join(items)}]"]
        typed = "Array(Tuple(UInt8, Nullable(Int64), Nullable(Int64), UInt8))"
        if not branches:
            return "CAST([], 'Array(Tuple(UInt8, Int64, Int64, UInt8))')"
        return (
            "arrayMap(p -> (p.1, assumeNotNull(p.2), assumeNotNull(p.3), p.4), arrayFilter("
            f"p -> p.2 IS NOT NULL AND p.3 IS NOT NULL, CAST(multiIf({', '.join(branches)}, "
            f"[]), '{typed}')))"
        )

    def _per_engine(self, value: Callable[[Engine], str | None]) -> str:
        """``value(engine)`` for the span's engine, a Nullable(Int64); NULL where it is None."""
        branches = []
        for i, engine in enumerate(self.book.engines, 1):
            v = value(engine)
            if v is not None:
                branches += [f"engine = {i}", v]
        if not branches:
            return "CAST(NULL, 'Nullable(Int64)')"
        return f"CAST(multiIf({', '.join(branches)}, NULL), 'Nullable(Int64)')"

    def first_token(self) -> str:
        """Engine.first_token_ns: Nullable(Int64) from the span's start."""
        return self._per_engine(
            lambda e: f"{self._first(e.first_token, e)} - start_ns" if e.first_token else None
        )

    def first_token_after(self, a: str, buckets: dict[str, int]) -> str:
        """Without first-token figures: the end of attempt span ``a``'s earliest stage span of its
        engine's ``after_stage`` bucket, from its start; NULL without."""
        codes = [
            buckets[e.first_token_after] if e.first_token_after else 0 for e in self.book.engines
        ]
        if not any(codes):
            return "CAST(NULL, 'Nullable(Int64)')"
        first = (
            f"arraySort(j -> span_rank[j], arrayFilter(j -> owner[j] = {a} "
            f"AND buckets[j] = {codes}[engines[{a}]], idx))"
        )
        return (
            f"if({codes}[engines[{a}]] = 0 OR empty({first}), CAST(NULL, 'Nullable(Int64)'), "
            f"ends[{first}[1]] - starts[{a}])"
        )

    def tpot_decode(self) -> str:
        """Engine.tpot_decode_ns: Nullable(Int64)."""

        def value(engine: Engine) -> str | None:
            if not engine.tpot_decode:
                return None
            out = self._first(engine.tpot_decode, engine)
            when = [f"{self._ref(n, engine, None)} IS NOT NULL" for n in engine.tpot_when]
            return f"if({' AND '.join(when)}, {out}, NULL)" if when else out

        return self._per_engine(value)

    # -- stage spans -----------------------------------------------------------------------------

    def stage_code(self, name: str) -> str:
        """A span's stage name code (index + 1 among every engine's stage names; 0: none)."""
        if not self.stage_names:
            return "toUInt16(0)"
        return f"toUInt16(indexOf({_array(self.stage_names)}, {name}))"

    def stage_bucket(self, code: str, buckets: dict[str, int]) -> str:
        """A stage name code's bucket (rank + 1; 0: none)."""
        values = [0] + [buckets[self.book.stage_bucket(n) or ""] for n in self.stage_names]
        return f"{values}[{code} + 1]"

    def _table(self, value: Callable[[Engine, str], int]) -> str:
        rows = [[value(e, n) for n in self.stage_names] for e in self.book.engines]
        return str(rows if rows and self.stage_names else [[0]])

    def stage_depth(self, engine: str, code: str) -> str:
        """How far below its request span an engine's stage of this name may sit (0: not one of
        the engine's stages)."""
        table = self._table(lambda e, n: e.stage_depth if e.stage_bucket(n) is not None else 0)
        return f"{table}[{engine}][{code}]"

    def stage_first(self, engine: str, code: str, buckets: dict[str, int]) -> str:
        """The bucket (rank + 1) the earliest stage span of this name stands for (0: none)."""
        table = self._table(lambda e, n: buckets[dict(e.first_stages)[n]] if n in dict(
            e.first_stages) else 0)  # fmt: skip
        return f"{table}[{engine}][{code}]"

    # -- parts (stage 2: a span's, its parent's and its request span's points) -------------------

    def part_code(self, name: str) -> str:
        """A span's name code among the names parts read (index + 1; 0: none)."""
        if not self.part_names:
            return "toUInt16(0)"
        return f"toUInt16(indexOf({_array(self.part_names)}, {name}))"

    def part_depth(self, code: str) -> str:
        """How far below an engine's request span its parts may sit (0: no parts)."""
        depths = [e.part_depth for e in self.book.engines]
        return f"if({code} = 0, 0, {depths}[{code}])" if any(depths) else "0"

    def _point(self, e: Expr, spans: dict[str, str]) -> str:
        """A part's expression over stage 2's arrays; ``spans``: the index of the part's own span
        (""), its parent's and its request span's."""
        if e.kind == "num":
            return f"toInt64({int(e.value)})"
        if e.kind in ("start", "end"):
            column = f"{'starts' if e.kind == 'start' else 'ends'}[{spans[e.at]}]"
            return column if not e.at else f"if({spans[e.at]} = 0, NULL, {column})"
        if e.kind == "event":
            return f"revents[{spans[e.at]}][{self._event(*e.value)}]"
        args = [self._point(a, spans) for a in e.args]
        if e.kind == "max0":
            return f"if({args[0]} < 0, toInt64(0), {args[0]})"
        return f"({args[0]} {'+' if e.kind == 'add' else '-'} {args[1]})"

    def part_phases(self, j: str, parent: str, request: str, ranks: dict[str, int]) -> str:
        """Engine.part_of and part_phases for span ``j`` under request span ``request``:
        Array((rank, start, end)), those with an absent end left out."""
        spans = {"": j, "parent": parent, "request": request}
        codes = {n: i for i, n in enumerate(self.part_names, 1)}
        branches = []
        for i, engine in enumerate(self.book.engines, 1):
            for part in engine.parts:
                conds = [f"engines[{request}] = {i}"]
                conds.append(f"part_codes[{j}] IN ({', '.join(str(codes[n]) for n in part.names)})")
                if part.parents:
                    listed = ", ".join(str(codes[n]) for n in part.parents)
                    conds.append(f"{parent} != 0 AND part_codes[{parent}] IN ({listed})")
                for c in part.when:
                    left, right = self._point(c.left, spans), self._point(c.right, spans)
                    conds.append(f"coalesce({left} {c.op} {right}, 0)")
                items = [
                    f"(toUInt8({ranks[p.bucket]}), {self._point(p.start, spans)}, "
                    f"{self._point(p.end, spans)})"
                    for p in part.phases
                ]
                branches += [" AND ".join(conds), f"[{', '.join(items)}]"]
        if not branches:
            return "CAST([], 'Array(Tuple(UInt8, Int64, Int64))')"
        typed = "Array(Tuple(UInt8, Nullable(Int64), Nullable(Int64)))"
        return (
            "arrayMap(p -> (p.1, assumeNotNull(p.2), assumeNotNull(p.3)), arrayFilter("
            f"p -> p.2 IS NOT NULL AND p.3 IS NOT NULL, CAST(multiIf({', '.join(branches)}, "
            f"[]), '{typed}')))"
        )
