"""Reading and checking rule files: every problem found, each as ``FILE:LINE: engine "name":
what``, the line found by a scanner of the file's ``[[engine]]`` headers and keys."""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from latscope.attribution.rules.entries import Engine, Figure, Part, PhaseRule
from latscope.attribution.rules.expr import (
    DURATION,
    INSTANT,
    KINDS,
    MAX_DEPTH,
    NAME,
    PHASE_BUCKETS,
    UNITS,
    VERSION,
    Cond,
    Expr,
    expr_type,
    parse_cond,
    parse_expr,
    spans,
)

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
    "parts",
    "part",
    "startup",
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
_PART_KEYS = {"name", "parent", "when", "phases", "doc"}
_STARTUP_KEYS = ("root", "load", "prepare")
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
        if section != "part" and spans(e):
            self.problem(section, key, f"{key} {text!r}: parent. and request. only in a part", nth)
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
        self._parts(raw, kw)
        startup = raw.get("startup")
        if isinstance(startup, dict):
            self._known(startup, set(_STARTUP_KEYS), "startup")
            pairs = [(k, v) for k, v in startup.items() if k in _STARTUP_KEYS]
            for key, value in pairs:
                if not isinstance(value, str) or not value:
                    self.problem("startup", key, f"startup {key} must be a span name")
            if "root" not in startup:
                self.problem("startup", "", "[engine.startup] needs root (the whole load's span)")
            kw["startup"] = tuple((k, v) for k, v in pairs if isinstance(v, str) and v)
        system = raw.get("system")
        places = raw.get("phase") or raw.get("stages") or raw.get("part")
        if isinstance(system, dict):
            self._known(system, _SYSTEM_KEYS, "system")
            kw["system_depth"] = self._depth(system, "system")
            if places:
                self.problem("system", "", "a serving system places nothing: its engines do")
        elif not places:
            self.problem(
                "",
                "name",
                "no [[engine.phase]], [engine.stages] nor [[engine.part]]: nothing to place",
            )
        return Engine(**kw)

    def _parts(self, raw: Mapping[str, Any], kw: dict[str, Any]) -> None:
        """``[engine.parts]`` (their depth) and each ``[[engine.part]]``: names, parent names,
        conditions and phases over the part's, its parent's and the request span's points."""
        table = raw.get("parts", {})
        parts = raw.get("part", [])
        if not isinstance(parts, list):
            self.problem("", "part", "part must be [[engine.part]] tables")
            return
        if not parts:
            if table:
                self.problem("parts", "", "[engine.parts] without any [[engine.part]]")
            return
        if not isinstance(table, dict):
            table = {}
        self._known(table, {"depth"}, "parts")
        kw["part_depth"] = self._depth(table, "parts")
        out = []
        for n, p in enumerate(parts):
            if not isinstance(p, dict):
                continue
            self._known(p, _PART_KEYS, "part", n)
            names = self._strings(p.get("name", []), "part", "name")
            if not names:
                self.problem("part", "name", "a part needs a span name", n)
            parents = self._strings(p.get("parent", []), "part", "parent")
            when: list[Cond] = []
            for text in self._strings(p.get("when", []), "part", "when"):
                try:
                    cond = parse_cond(text)
                    for side in (cond.left, cond.right):
                        expr_type(side, {})
                    if expr_type(cond.left, {}) != expr_type(cond.right, {}):
                        raise ValueError("compares an instant with a duration")
                    when.append(cond)
                except ValueError as err:
                    self.problem("part", "when", f"when {text!r}: {err}", n)
            phases = []
            raw_phases = p.get("phases", [])
            for q in raw_phases if isinstance(raw_phases, list) else []:
                if not isinstance(q, dict):
                    self.problem("part", "phases", "phases must be { bucket, from, to } tables", n)
                    continue
                self._known(q, _PHASE_KEYS - {"with_stages"}, "part", n)
                bucket = self._bucket(q.get("bucket"), "part", "phases", n)
                lo = self._expr(q.get("from"), {}, INSTANT, ("part", "phases", n))
                hi = self._expr(q.get("to"), {}, INSTANT, ("part", "phases", n))
                if bucket is not None and lo is not None and hi is not None:
                    phases.append(PhaseRule(bucket, lo, hi))
            if not raw_phases:
                self.problem("part", "phases", "a part needs phases", n)
            out.append(Part(names, parents, tuple(when), tuple(phases)))
        kw["parts"] = tuple(out)
