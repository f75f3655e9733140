"""The SLO burn rates latscope serves on /metrics (latscope.api.burn), against a recount of the
planted rows, and the ``--slo-objectives`` setting."""

from __future__ import annotations

import polars as pl
import pytest

from latscope.api.burn import BurnRates, parse_objectives
from latscope.api.errors import InvalidParameter
from latscope.config import ConfigError, Settings
from latscope.storage import Store
from latscope.windows import BURN_WINDOWS_S
from tests.planted import MS, S, insert, queue_burn

T = 1_790_000_000 * S
SERVICE = "burn-unit"


@pytest.fixture(scope="module")
def rows(store: Store) -> pl.DataFrame:
    df = queue_burn(T, service=SERVICE)
    insert(store, df)
    return df


def _samples(rates: BurnRates) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {
        family.name: [(s.labels, s.value) for s in family.samples] for family in rates.collect()
    }


def test_burn_rates_are_the_bad_share_over_the_budget_per_window(
    store: Store, rows: pl.DataFrame
) -> None:
    [objective] = parse_objectives(f"ttft:500:0.99:30@{SERVICE}")
    rates = BurnRates(store, [objective], clock=lambda: T)
    assert _samples(rates) == {}  # nothing served before the first evaluation
    rates.run_until_idle()
    got = _samples(rates)
    ttft = pl.coalesce("TtftClientNs", "TtftServerNs")
    for window, seconds in BURN_WINDOWS_S.items():
        inside = rows.filter(pl.col("Timestamp") >= T - seconds * S)
        bad = inside.filter(ttft > 500 * MS).height
        [rate] = [v for labels, v in got["latscope_slo_burn_rate"] if labels["window"] == window]
        assert rate == pytest.approx(bad / inside.height / 0.01), window
        counts = {
            labels["outcome"]: v
            for labels, v in got["latscope_slo_requests"]
            if labels["window"] == window
        }
        assert counts == {"bad": bad, "good": inside.height - bad}
    labels, _ = got["latscope_slo_burn_rate"][0]
    assert labels == {
        "objective": f"ttft:500:0.99:30@{SERVICE}",
        "metric": "ttft",
        "service": SERVICE,
        "model": "",
        "window": "5m",
    }
    # The planted extra queueing is where the budget went, in every window.
    for window in BURN_WINDOWS_S:
        extra = {
            labels["bucket"]: v
            for labels, v in got["latscope_slo_bad_extra_seconds"]
            if labels["window"] == window
        }
        assert max(extra, key=lambda b: extra[b]) == "queue", window
        assert extra["queue"] > 1.0  # 1-2 s more in the queue
    [(_, stamp)] = got["latscope_slo_evaluation_timestamp_seconds"]
    assert stamp == T / 1e9


def test_a_window_without_requests_has_no_burn_rate(store: Store, rows: pl.DataFrame) -> None:
    # A day after the planted rows: only the 3-day window still holds requests.
    rates = BurnRates(
        store, parse_objectives(f"ttft:500:0.99@{SERVICE}"), clock=lambda: T + 86_400 * S
    )
    rates.run_until_idle()
    windows = {labels["window"] for labels, _ in _samples(rates)["latscope_slo_burn_rate"]}
    assert windows == {"3d"}


def test_objectives_setting() -> None:
    texts = [o.text for o in parse_objectives("")]
    assert texts == ["ttft:500:0.99:30", "tpot:50:0.99:30", "e2e:10000:0.99:30"]
    assert parse_objectives("off") == []
    [o] = parse_objectives(" e2e:2000:0.95:7@gateway/meta-llama/Llama-3-8B ")
    assert (o.text, o.service, o.model) == (
        "e2e:2000:0.95:7@gateway/meta-llama/Llama-3-8B", "gateway", "meta-llama/Llama-3-8B",
    )  # fmt: skip
    for bad, message in [
        ("ttft:500", "METRIC:THRESHOLD_MS:TARGET"),
        ("ttft:500:0.99@", "@SERVICE"),
        ("ttft:500:0.99@a@b", "@SERVICE"),
        ("ttft:500:0.99,ttft:500:0.99:30", "listed twice"),
    ]:
        with pytest.raises(InvalidParameter, match=message):
            parse_objectives(bad)
    with pytest.raises(ConfigError, match="--slo-objectives: objective 'p99:1'"):
        Settings.from_env({"LATSCOPE_SLO_OBJECTIVES": "p99:1"})
    assert Settings.from_env({}, slo_objectives="ttft:300:0.999").slo_objectives
