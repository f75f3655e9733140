"""``latscope export``: attributed requests as a Parquet file, for offline analysis.

One row per request with the attribution table's columns (``attribution/frames.py``): read the
file with polars (``pl.read_parquet``), pandas or DuckDB. Reading the store directly
(``--store``) has no row cap but the memory of this process; through a running API (``--url``,
the default) one export holds at most ``MAX_EXPORT`` requests: export a long window in parts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from latscope.cmd._source import (
    HttpSource,
    Source,
    SourceError,
    StoreSource,
    add_filter_arguments,
    add_source_arguments,
    decode,
    filters,
    run_command,
)

HELP = "attributed requests as a Parquet file, for offline analysis (polars, pandas, DuckDB)"

#: The REST route that answers with the same file.
EXPORT_PATH = "/v1/export/requests"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--parquet", metavar="FILE", required=True, help="write the requests here (Parquet, zstd)"
    )
    add_filter_arguments(parser)
    parser.add_argument(
        "--limit",
        type=int,
        default=None,
        help="most requests, oldest first (default: everything with --store, "
        "200000 through the API)",
    )
    add_source_arguments(parser, json_flag=False)


def _from_store(source: StoreSource, args: argparse.Namespace, path: Path) -> int:
    from latscope.api import queries
    from latscope.api.errors import QueryError
    from latscope.attribution import frames

    try:
        window = queries.time_range(args.since, args.until)
    except QueryError as exc:
        raise SourceError(f"{exc.detail} ({exc.error})", exit_code=2) from None
    frame = frames.requests(
        source.store,
        since_ns=window.since_ns,
        until_ns=window.until_ns,
        service=args.service,
        model=args.model,
        limit=args.limit or frames.DEFAULT_LIMIT,
    )
    frames.write_parquet(frame, path)
    return frame.height


def _from_api(source: HttpSource, args: argparse.Namespace, path: Path) -> tuple[int, bool]:
    response = source.fetch(EXPORT_PATH, **filters(args), limit=args.limit)
    if response.status_code != 200:
        decode(response, source.url)  # raises SourceError with the API's message
        raise SourceError(f"the API at {source.url} answered {response.status_code}")
    path.write_bytes(response.content)
    truncated = response.headers.get("X-Latscope-Truncated") == "true"
    return int(response.headers.get("X-Latscope-Rows", "0")), truncated


def main(args: argparse.Namespace) -> int:
    path = Path(args.parquet)
    if args.limit is not None and args.limit < 1:
        print("latscope: --limit must be at least 1", file=sys.stderr)
        return 2
    if not path.parent.is_dir():
        print(f"latscope: --parquet: no directory {path.parent}", file=sys.stderr)
        return 2

    def body(source: Source) -> int:
        truncated = False
        if isinstance(source, StoreSource):
            rows = _from_store(source, args, path)
            truncated = args.limit is not None and rows >= args.limit
        else:
            assert isinstance(source, HttpSource)
            rows, truncated = _from_api(source, args, path)
        print(f"{rows} requests written to {path} ({path.stat().st_size:,} bytes, Parquet)")
        if truncated:
            print(
                "latscope: the limit cut the window short: narrow it (--since/--until) or "
                "raise --limit",
                file=sys.stderr,
            )
        return 0

    return run_command(args, body)
