"""``latscope rules``: the rulebook in force (shipped entries and ``--rules`` files), as TOML."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from latscope.attribution.rules import Rulebook

HELP = "print the rulebook in force (engines' request spans, figures, phases) as TOML"


def add_rules_argument(parser: argparse.ArgumentParser) -> None:
    """``--rules FILE[,FILE]`` (else ``LATSCOPE_RULES``), as `latscope serve` takes it."""
    parser.add_argument(
        "--rules",
        default=None,
        metavar="FILE[,FILE]",
        help="rule files to add or override entries, as `latscope serve --rules` takes them "
        "[env LATSCOPE_RULES]",
    )


def load_rules(value: str | None, command: str) -> Rulebook | None:
    """The shipped rulebook with the ``--rules`` files (``value``, else ``LATSCOPE_RULES``) on
    top; None, with every problem printed on stderr, when they are not usable."""
    import os

    from latscope.attribution.rules import RulebookError, load

    raw = value if value is not None else os.environ.get("LATSCOPE_RULES", "")
    try:
        return load([p.strip() for p in raw.split(",") if p.strip()])
    except RulebookError as exc:
        print(f"{command}: the rule files are not usable:\n{exc}", file=sys.stderr)
        return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_rules_argument(parser)
    parser.add_argument(
        "--check",
        action="store_true",
        help="only check the files: print each problem as FILE:LINE and exit 2 on any",
    )


def main(args: argparse.Namespace) -> int:
    book = load_rules(args.rules, "latscope rules")
    if book is None:
        return 2
    if args.check:
        print(f"{len(book.engines)} engines: " + ", ".join(e.name for e in book.engines))
        return 0
    sys.stdout.write(book.to_toml())
    return 0
