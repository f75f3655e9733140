"""``latscope rules``: the rulebook in force (shipped entries and ``--rules`` files), as TOML."""

from __future__ import annotations

import argparse
import sys

HELP = "print the rulebook in force (engines' request spans, figures, phases) as TOML"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rules",
        default=None,
        metavar="FILE[,FILE]",
        help="rule files to add or override entries, as `latscope serve --rules` takes them "
        "[env LATSCOPE_RULES]",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="only check the files: print each problem as FILE:LINE and exit 2 on any",
    )


def main(args: argparse.Namespace) -> int:
    import os

    from latscope.attribution.rules import RulebookError, load

    raw = args.rules if args.rules is not None else os.environ.get("LATSCOPE_RULES", "")
    files = [p.strip() for p in raw.split(",") if p.strip()]
    try:
        book = load(files)
    except RulebookError as exc:
        print(f"latscope rules: the rule files are not usable:\n{exc}", file=sys.stderr)
        return 2
    if args.check:
        print(f"{len(book.engines)} engines: " + ", ".join(e.name for e in book.engines))
        return 0
    sys.stdout.write(book.to_toml())
    return 0
