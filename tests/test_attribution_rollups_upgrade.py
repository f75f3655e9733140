"""A store written before 004_rollups.sql: its rows have no stored ``AttributedAt``. They get
rollups after the upgrade (004 records them in the projection at the time it ran), and a merge
that rewrites their parts (storing the merge's time) may send their hours back to the raw path
until rebuilt: answers stay right throughout."""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl
import pytest

from latscope.attribution import aggregates as ag
from latscope.attribution import rollups
from latscope.attribution.frames import to_table
from latscope.attribution.rollups import HOUR_NS, Rollups
from latscope.storage import ATTRIBUTION_TABLE, Store
from tests.rows_support import check_against, close, make_rows
from tests.serve_support import release_embedded_store

pytestmark = pytest.mark.slow

H = HOUR_NS
T0 = 1_702_000_000 * 10**9 // H * H
WINDOW = {"since_ns": T0 + 10**9, "until_ns": T0 + 4 * H - 10**9}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    release_embedded_store()  # chDB opens one data directory per process
    store = Store.open(f"chdb://{tmp_path_factory.mktemp('upgrade') / 'store'}")
    try:
        store.apply_schema(upto=3)  # the schema as it was before the rollups (004)
        yield store
    finally:
        store.close()


def insert(store: Store, df: pl.DataFrame) -> None:
    """Rows as an attributor before 005 wrote them: without the per-call columns (nor the KV
    transfer, 014)."""
    store.insert_arrow(
        ATTRIBUTION_TABLE,
        to_table(df).drop_columns(["RequestSpanId", "Provider", "KvTransferNs"]),
    )


def usable(store: Store) -> list[int]:
    return [h for h, _ in rollups.plan(store, **WINDOW).hours]


def test_rows_from_before_the_upgrade_get_rollups_and_stay_right(store: Store) -> None:
    df = pl.concat([make_rows(800, service="old", t0=T0, seed=s, span_ns=4 * H) for s in (1, 2)])
    insert(store, df.head(800))
    insert(store, df.tail(800))
    assert store.apply_schema() >= 4
    builder = Rollups(store, settle_s=0, margin_s=0)
    builder.run_until_idle()
    assert len(usable(store)) == 2  # the whole hours inside the window
    raw = ag.summary(store, **WINDOW, group_by="model", use_rollups=False).model_dump()
    in_window = pl.col("Timestamp").is_between(WINDOW["since_ns"], WINDOW["until_ns"], "left")
    check_against(ag.summary(store, **WINDOW).model_dump(), df.filter(in_window))
    assert close(ag.summary(store, **WINDOW, group_by="model").model_dump(), raw) == []

    # A merge may write the missing column with the merge's time, later than the build: the
    # hours are then read raw (same answers) until the builder's next pass.
    store.command("OPTIMIZE TABLE latscope_attribution FINAL")
    assert close(ag.summary(store, **WINDOW, group_by="model").model_dump(), raw) == []
    builder.run_until_idle()
    assert len(usable(store)) == 2
    assert close(ag.summary(store, **WINDOW, group_by="model").model_dump(), raw) == []
