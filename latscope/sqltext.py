"""SQL text from templates whose variable parts are named fragments, never values.

A query has two kinds of variable parts, and they are kept apart:

* **values** (a time, a service name, a threshold, an attribute key someone typed) are ClickHouse
  query parameters, ``{name:Type}`` in the text, bound by the server at run time; they never
  become text;
* **fragments** are SQL that latscope wrote: a column or expression taken from a whitelist
  (``answers.groups.GROUP_BY_COLUMNS``, ``answers.slo.SLO_METRICS``, ...), a sub-query rendered
  from another template, a condition built by ``rollups.raw_where`` with its values bound as
  parameters. A template names each fragment ``$NAME`` (upper case after a dollar, so it cannot
  be mistaken for a parameter), and ``render`` fills it from the fragments it is given and
  nothing else: a name it was not given is an error, and a fragment must be text (a number or
  any other value is refused, so a value cannot reach the text by accident).

``$NAME(a, b)`` applies the macro of that name (a function from fragments to a fragment) to its
arguments, each rendered first (``$NAME(`` is always a macro call); the SQL attributor
(``attribution/sql``) writes its small repeated expressions this way. Lines that are SQL comments
(``-- ...``) are dropped.

>>> render("SELECT $GROUP AS grp FROM t WHERE Model = {model:String}", {"GROUP": "Route"})
'SELECT Route AS grp FROM t WHERE Model = {model:String}'
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

__all__ = ["SqlTextError", "names", "render"]

_PLACEHOLDER = re.compile(r"\$([A-Z][A-Z0-9_]*)(\()?")


class SqlTextError(KeyError):
    """A template names a fragment or macro it was not given, or a fragment is not text."""

    def __str__(self) -> str:
        # KeyError's own str() quotes the message as if it were a key.
        return str(self.args[0]) if self.args else ""


def names(text: str) -> set[str]:
    """The fragment and macro names a template uses.

    >>> sorted(names("SELECT $A, $F($B) FROM ($SOURCES)"))
    ['A', 'B', 'F', 'SOURCES']
    """
    return {m.group(1) for m in _PLACEHOLDER.finditer(text)}


def _split_args(text: str) -> list[str]:
    args, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            args.append(text[start:i].strip())
            start = i + 1
    args.append(text[start:].strip())
    return args


def render(
    text: str,
    values: Mapping[str, str],
    macros: Mapping[str, Callable[..., str]] | None = None,
) -> str:
    """Replace every ``$NAME`` by ``values[NAME]`` and every ``$NAME(args)`` by the macro of that
    name applied to the (rendered) arguments. SQL comment lines are dropped first; the rendered
    fragments are not scanned again.

    >>> render("$TWICE($COL) AS queue_twice", {"COL": "QueueNs"}, {"TWICE": lambda x: f"2 * {x}"})
    '2 * QueueNs AS queue_twice'
    """
    macros = macros or {}
    text = "".join(
        line for line in text.splitlines(keepends=True) if not line.lstrip().startswith("--")
    )
    out, pos = [], 0
    while (m := _PLACEHOLDER.search(text, pos)) is not None:
        out.append(text[pos : m.start()])
        name = m.group(1)
        if m.group(2):
            depth, end = 1, m.end()
            while depth:
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                end += 1
            if name not in macros:
                raise SqlTextError(f"unknown SQL macro ${name}(...)")
            args = [render(a, values, macros) for a in _split_args(text[m.end() : end - 1])]
            out.append(macros[name](*args))
            pos = end
        else:
            if name not in values:
                raise SqlTextError(f"unknown SQL placeholder ${name}")
            fragment = values[name]
            if not isinstance(fragment, str):
                raise SqlTextError(
                    f"SQL fragment ${name} is a {type(fragment).__name__}, not text: bind a value "
                    "as a query parameter ({name:Type}) instead"
                )
            out.append(fragment)
            pos = m.end()
    out.append(text[pos:])
    return "".join(out)
