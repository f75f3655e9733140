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

from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from latscope.attribution.rules.entries import Engine, Figure, Part, PhaseRule, Rulebook, kind_name
from latscope.attribution.rules.expr import (
    MAX_DEPTH,
    MAX_SECONDS,
    PHASE_BUCKETS,
    RUST_DURATION,
    RUST_UNITS,
    UNITS,
    VERSION,
    Expr,
    evaluate,
    figure_ns,
    parse_expr,
)
from latscope.attribution.rules.reading import RulebookError, read_file
from latscope.semconv import BUCKETS

#: The shipped files, tried in this order (user files go first): an entry that matches a narrower
#: shape comes before the generic ``gen_ai.latency`` one.
SHIPPED = ("dynamo", "trtllm", "triton", "tgi", "sglang", "vllm")


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
    "MAX_DEPTH",
    "MAX_SECONDS",
    "PHASE_BUCKETS",
    "RUST_DURATION",
    "RUST_UNITS",
    "UNITS",
    "VERSION",
    "Engine",
    "Expr",
    "Figure",
    "Part",
    "PhaseRule",
    "Rulebook",
    "RulebookError",
    "active",
    "evaluate",
    "figure_ns",
    "install",
    "kind_name",
    "load",
    "parse_expr",
    "read_file",
]
