"""The embedded engine's insert alone: CPU by insert size, on one thread and on its default.

    .venv/bin/python -m bench.ingest.inserts [--sizes 500,5000,20000,80000] [--rounds 5]

Decoded spans (the ingest benchmark's Exports through the C decoder, joined into one chunk per
column as the collector inserts them) go into the spans table of a fresh embedded store through
``Store.insert_arrow``, each with its own deduplication token, merges stopped. Sizes and thread
settings take turns, round by round; printed: the median CPU of the whole process per insert and
per 100k spans, and the fixed cost per insert from the smallest and largest sizes.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa

from bench.ingest.run import T0, _cpu, _median
from bench.ingest.traces import make_batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="500,5000,20000,80000", help="spans per insert")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()

    from latscope.collector.mapping import combine, decode_spans
    from latscope.storage import SPANS_TABLE, Store

    sizes = [int(s) for s in args.sizes.split(",")]
    rng = random.Random(args.seed)
    exports = -(-max(sizes) // 448)
    spans = pa.concat_tables(
        decode_spans(make_batch(rng, T0 + i * 10**9, 64).SerializeToString()).table
        for i in range(exports)
    )
    workdir = Path(tempfile.mkdtemp(prefix="latscope-bench-inserts-"))
    try:
        store = Store.open(f"chdb://{workdir / 'store'}")
        store.apply_schema()
        store.command(f"SYSTEM STOP MERGES {SPANS_TABLE}")
        inserts = store._inserts
        assert inserts is not None, "the embedded store inserts in place"
        chosen = {"one thread": dict(inserts.settings), "engine default": {}}
        store.insert_arrow(SPANS_TABLE, combine(spans.slice(0, 100)), dedup_token="warm")
        cpu: dict[tuple[str, int], list[float]] = {(c, n): [] for c in chosen for n in sizes}
        for r in range(args.rounds):
            order = [(c, n) for c in chosen for n in sizes]
            for c, n in order if r % 2 == 0 else order[::-1]:
                table = combine(spans.slice((r * 7919) % (spans.num_rows - n + 1), n))
                inserts.settings = chosen[c]
                started = _cpu()
                store.insert_arrow(SPANS_TABLE, table, dedup_token=f"{r}-{c}-{n}")
                cpu[(c, n)].append(_cpu() - started)
        store.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"inserts of decoded spans into {SPANS_TABLE}, merges stopped, medians of "
          f"{args.rounds} rounds (whole process CPU):")  # fmt: skip
    print(f"  {'spans per insert':>16s} " + " ".join(f"{c:>30s}" for c in chosen))
    for n in sizes:
        cells = []
        for c in chosen:
            m = _median(cpu[(c, n)])
            cells.append(f"{m * 1000:9.1f} ms, {m / n * 1e5:6.3f} s/100k")
        print(f"  {n:16,d} " + " ".join(f"{cell:>30s}" for cell in cells))
    small, large = sizes[0], sizes[-1]
    for c in chosen:
        a, b = _median(cpu[(c, small)]), _median(cpu[(c, large)])
        per_span = (b - a) / (large - small)
        print(f"{c}: about {(a - per_span * small) * 1000:.1f} ms per insert before its first "
              f"span, {per_span * 1e6:.2f} us per span after")  # fmt: skip


if __name__ == "__main__":
    main()
