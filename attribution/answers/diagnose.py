"""The diagnosis: what the window shows, mapped to the usual cause and its first fixes.

Each verdict is a rule over figures of the window (one pass of ``DIAGNOSE_SQL``, which also gives
the buckets' shares, the tail, a per-minute pass and the cold-start answer) with the numbers
behind it and a score;
verdicts come strongest first, each with the dimension value that concentrates it
(``dimensions.concentrations``). The rulebook below names every threshold and says why that value;
docs/attribution.md ("The diagnosis rulebook") has them as a table.

>>> diagnose(store, since_ns=t0, until_ns=t1)  # doctest: +SKIP
{"count": 1200, "dominant": "decode", "tail_dominant": "queue", "shares": {...},
 "verdicts": [{"id": "queue_tail", "bucket": "queue", "cause": "load exceeds capacity: ...",
               "fixes": [...], "score": 0.81, "evidence": {...}, "where": {...}}]}
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from latscope.attribution import rollups
from latscope.attribution.answers import coldstart, dimensions, window
from latscope.attribution.answers.common import (
    FILTERS,
    SETTINGS,
    finite,
    ms,
    query_dicts,
    window_params,
)
from latscope.attribution.answers.figures import SHARE_SUMS, bucket_shares
from latscope.attribution.answers.models import Diagnosis, Verdict, Window
from latscope.attribution.answers.tail import tail
from latscope.attribution.table import BUCKET_COLUMN_LIST
from latscope.sqltext import render
from latscope.storage import Store

__all__ = [
    "CAUSES",
    "DECODE_STALL_SHARE",
    "PEAK_LOAD_CORR_MIN",
    "PEAK_MIN_MINUTES",
    "PEAK_P95_FACTOR",
    "PEAK_SCORE_WEIGHT",
    "PREFILL_CORR_MIN",
    "PREFILL_TTFT_SHARE_MIN",
    "TINY_OUTSIDE_SHARE_MIN",
    "TINY_PROMPT_TOKENS",
    "TINY_SLOW_FACTOR",
    "diagnose",
]

# -- the rulebook ---------------------------------------------------------------------------------
# queue_tail has no threshold of its own: it fires when the tail's dominant bucket (the one with
# the most extra time over the median request, ``tail``) is the queue, scored by the queue's share
# of that extra time.

#: Prompts at most this long count as "tiny": their prefill is a few milliseconds on any serving
#: GPU, too short to explain a slow request, so a slow tiny prompt was slow somewhere else.
TINY_PROMPT_TOKENS = 64
#: tiny_prompts_slow: network + queue make at least half of a tiny prompt's mean e2e, so most of
#: its time passes before (or around) any model work...
TINY_OUTSIDE_SHARE_MIN = 0.5
#: ...and the tiny prompts' median e2e is at least half the window's median: they are slow too.
#: A tiny prompt should take a fraction of a typical request's time; when it takes half of it or
#: more, prompt length is not what sets the latency.
TINY_SLOW_FACTOR = 0.5

#: prefill_prompt_length: prefill time correlates (Pearson) with the prompt's tokens at least
#: this much, a clear linear trend: prefill grows with the prompt on every engine, so when the
#: correlation is weaker something else (batching, other prompts' prefill) sets prefill time...
PREFILL_CORR_MIN = 0.5
#: ...and prefill is at least a fifth of TTFT as the client felt it: below that, shorter prompts
#: would not move TTFT much (the server's TTFT would miss the network: 5 ms of prefill is most of
#: a 7 ms server TTFT, but not of the 130 ms the client waited behind a slow gateway).
PREFILL_TTFT_SHARE_MIN = 0.2

#: decode_stalls: at least one stream in twenty stalled (an inter-token gap above the stall
#: threshold, ``latscope serve --stall-threshold-ms``): below that, stalls are incidents of a few
#: streams rather than a property of the decode batching. ``diagnose(stall_share=...)`` overrides.
DECODE_STALL_SHARE = 0.05

#: peak_only: a correlation of per-minute figures needs at least this many minutes with
#: requests; over fewer points a correlation is noise...
PEAK_MIN_MINUTES = 5
#: ...per-minute load and per-minute e2e p95 correlate at least this much (strong: weaker
#: correlations between load and latency turn up in any noisy window)...
PEAK_LOAD_CORR_MIN = 0.6
#: ...and the busiest minute's p95 is at least 1.5 times the median minute's: the peak hurts
#: noticeably, not only measurably.
PEAK_P95_FACTOR = 1.5
#: The peak verdict scores its correlation times this: latency following load is circumstantial
#: (it names no bucket by itself), so it ranks just below a bucket-level verdict of equal strength.
PEAK_SCORE_WEIGHT = 0.9

# The cold-start verdict's thresholds are coldstart.VERDICT_MIN_REQUESTS and VERDICT_MIN_FACTOR;
# where a verdict concentrates, dimensions.CONCENTRATION_MIN and CONCENTRATION_PERCENTILE.

#: Figures the diagnosis rules look at, in one pass.
DIAGNOSE_SQL = f"""
SELECT
    count() AS n,
    quantileExactInclusive(0.5)(E2eNs) AS e2e_p50,
    quantileExactInclusive(0.99)(E2eNs) AS e2e_p99,
    countIf(InputTokens <= {{tiny:UInt32}}) AS n_tiny,
    quantileExactInclusiveIf(0.5)(E2eNs, InputTokens <= {{tiny:UInt32}}) AS tiny_e2e_p50,
    avgIf(ifNull(NetworkNs, 0) + QueueNs, InputTokens <= {{tiny:UInt32}}) AS tiny_net_queue,
    avgIf(E2eNs, InputTokens <= {{tiny:UInt32}}) AS tiny_e2e_mean,
    corr(toFloat64(InputTokens), toFloat64(coalesce(TtftServerNs, TtftClientNs))) AS ttft_corr,
    corr(toFloat64(InputTokens), toFloat64(PrefillNs)) AS prefill_corr,
    simpleLinearRegression(toFloat64(InputTokens), toFloat64(PrefillNs)).1 AS prefill_ns_per_token,
    quantileExactInclusive(0.95)(coalesce(TtftClientNs, TtftServerNs)) AS ttft_p95,
    countIf(Stalls > 0) AS n_stalled,
    sum(Stalls) AS stalls,
    quantileExactInclusive(0.5)(ItlP50Ns) AS itl_p50,
    quantileExactInclusive(0.99)(ItlMaxNs) AS itl_max_p99,
    sum(QueueNs) / sum(E2eNs) AS queue_share,
    sum(PrefillNs) / sum(E2eNs) AS prefill_share,
    sumIf(PrefillNs, coalesce(TtftClientNs, TtftServerNs) IS NOT NULL)
        / sum(coalesce(TtftClientNs, TtftServerNs)) AS prefill_ttft_share,
    sum(DecodeNs) / sum(E2eNs) AS decode_share,
    {SHARE_SUMS}
FROM ($ROWS){SETTINGS}
"""

#: Per-minute load against per-minute latency: is it slow only at peak?
DIAGNOSE_PEAK_SQL = f"""
SELECT
    count() AS minutes,
    corr(toFloat64(n), toFloat64(p95)) AS load_latency_corr,
    corr(toFloat64(n), toFloat64(queue_mean)) AS load_queue_corr,
    max(n) AS peak_rpm, quantileExactInclusive(0.5)(n) AS median_rpm,
    argMax(p95, n) AS peak_p95, quantileExactInclusive(0.5)(p95) AS median_p95
FROM (
    SELECT toStartOfMinute(Timestamp) AS minute, count() AS n,
           quantileExactInclusive(0.95)(E2eNs) AS p95, avg(QueueNs) AS queue_mean
    FROM ($ROWS)
    GROUP BY minute
){SETTINGS}
"""

#: The columns DIAGNOSE_SQL and DIAGNOSE_PEAK_SQL read.
DIAGNOSE_COLUMNS = (
    f"Timestamp, E2eNs, {BUCKET_COLUMN_LIST}, InputTokens, TtftClientNs, TtftServerNs, "
    "Stalls, ItlP50Ns, ItlMaxNs"
)

#: Verdicts: cause, bucket, the usual first fixes.
CAUSES: dict[str, dict[str, Any]] = {
    "queue_tail": {
        "bucket": "queue",
        "cause": "load exceeds capacity: the slowest requests wait for a worker or batch slot",
        "fixes": [
            "cap the queue depth and shed or reject early",
            "scale out earlier (autoscale on queue time, not CPU)",
            "separate interactive from batch traffic",
        ],
    },
    "tiny_prompts_slow": {
        "bucket": "network/queue",
        "cause": "slow even for tiny prompts: the time is spent outside the model "
        "(network, proxies or queueing)",
        "fixes": [
            "check proxies, TLS and connection reuse between client and server",
            "look at queue time: requests wait before any model work starts",
        ],
    },
    "prefill_prompt_length": {
        "bucket": "prefill",
        "cause": "TTFT grows with prompt length: prefill dominates time to first token",
        "fixes": [
            "shrink prompts (trim history, retrieval results)",
            "enable prefix caching for shared system prompts",
            "cap the prefill batch (chunked prefill) so long prompts do not block others",
        ],
    },
    "decode_stalls": {
        "bucket": "decode",
        "cause": "inter-token stalls: decode batching holds streams back",
        "fixes": [
            "cap the decode batch size",
            "isolate long generations on their own replicas",
            "enable chunked prefill so new prompts do not stall running streams",
        ],
    },
    "peak_only": {
        "bucket": "queue",
        "cause": "slow only at peak: latency follows load, queueing at busy minutes",
        "fixes": [
            "scale ahead of the daily peak",
            "rate-limit or defer batch traffic at peak",
        ],
    },
}


def diagnose(
    store: Store,
    *,
    since_ns: int,
    until_ns: int,
    service: str | None = None,
    model: str | None = None,
    percentile: float = 99,
    stall_share: float = DECODE_STALL_SHARE,
    warmup: coldstart.WarmupRule | None = None,
) -> Diagnosis:
    """Map what the window shows to the usual cause and first fix.

    The ``Diagnosis`` names the dominant buckets and lists the verdicts (``id``, ``cause``,
    ``bucket``, ``fixes``, ``evidence``, ``where``), strongest first; each verdict carries the
    numbers behind it, and ``where`` the dimension value that concentrates it and
    since when (``dimensions.concentrations``). ``warmup`` is the cold-start rule.
    """
    # Every read below is of this window: its hours are looked up once.
    with rollups.one_view():
        return _diagnose(store, since_ns, until_ns, service, model, percentile, stall_share, warmup)


def _diagnose(
    store: Store,
    since_ns: int,
    until_ns: int,
    service: str | None,
    model: str | None,
    percentile: float,
    stall_share: float,
    warmup: coldstart.WarmupRule | None,
) -> Diagnosis:
    params = window_params(since_ns, until_ns, service, model)
    params["tiny"] = TINY_PROMPT_TOKENS
    # Hours known clean are read as stored, the others with FINAL (``window``).
    split = window.raw_ranges(store, [(since_ns, until_ns)])
    rows = window.raw_rows(split, params, DIAGNOSE_COLUMNS, FILTERS)
    # The window's four reads do not depend on each other: they run side by side.
    figures, t, peaks, cold_answer = _side_by_side(
        lambda: query_dicts(store, render(DIAGNOSE_SQL, {"ROWS": rows}), params),
        lambda: tail(
            store,
            since_ns=since_ns,
            until_ns=until_ns,
            percentile=percentile,
            service=service,
            model=model,
        ),
        lambda: query_dicts(store, render(DIAGNOSE_PEAK_SQL, {"ROWS": rows}), params),
        lambda: coldstart.coldstart(
            store, since_ns=since_ns, until_ns=until_ns, service=service, model=model, rule=warmup
        ),
    )
    f = figures[0]
    n = int(f["n"] or 0)
    if n == 0:
        return Diagnosis(
            count=n,
            dominant=None,
            tail_dominant=None,
            verdicts=[],
            window=Window.of(since_ns, until_ns),
        )
    # Each bucket's share of the window's time, as ``summary`` gives it (the same exact sums),
    # from the rules' own read rather than a summary's two more.
    shares = {b: share or 0.0 for b, share in bucket_shares(f).items()}
    verdicts: list[tuple[float, str, dict[str, Any]]] = []

    if t.dominant == "queue" and t.tail_count:
        extra = t.buckets_ms["queue"]
        verdicts.append(
            (
                extra.extra_share or 0.0,
                "queue_tail",
                {
                    "tail_percentile": percentile,
                    "tail_threshold_ms": t.threshold_ms,
                    "queue_extra_ms": extra.extra,
                    "queue_extra_share": extra.extra_share,
                    "queue_tail_mean_ms": extra.tail_mean,
                    "queue_median_mean_ms": extra.median_mean,
                },
            )
        )
    n_tiny = int(f["n_tiny"] or 0)
    if n_tiny and f["tiny_e2e_mean"]:
        outside = (f["tiny_net_queue"] or 0) / f["tiny_e2e_mean"]
        if outside >= TINY_OUTSIDE_SHARE_MIN and (f["tiny_e2e_p50"] or 0) >= TINY_SLOW_FACTOR * (
            f["e2e_p50"] or 0
        ):
            verdicts.append(
                (
                    outside,
                    "tiny_prompts_slow",
                    {
                        "tiny_prompt_tokens": TINY_PROMPT_TOKENS,
                        "tiny_requests": n_tiny,
                        "tiny_e2e_p50_ms": ms(f["tiny_e2e_p50"]),
                        "all_e2e_p50_ms": ms(f["e2e_p50"]),
                        "tiny_network_plus_queue_share": outside,
                    },
                )
            )
    # TTFT grows with the prompt when prefill does and prefill is a real part of TTFT as the
    # client felt it (a noisy queue can hide the trend in TTFT itself, so both correlations are
    # reported).
    corr = finite(f["prefill_corr"])
    in_ttft = finite(f["prefill_ttft_share"]) or 0.0
    if corr is not None and corr >= PREFILL_CORR_MIN and in_ttft >= PREFILL_TTFT_SHARE_MIN:
        verdicts.append(
            (
                corr * in_ttft,
                "prefill_prompt_length",
                {
                    "prefill_vs_prompt_tokens_corr": corr,
                    "ttft_vs_prompt_tokens_corr": finite(f["ttft_corr"]),
                    "prefill_ms_per_1k_tokens": ms((finite(f["prefill_ns_per_token"]) or 0) * 1000),
                    "prefill_share_of_ttft": in_ttft,
                    "ttft_p95_ms": ms(f["ttft_p95"]),
                    "prefill_share": f["prefill_share"],
                },
            )
        )
    stalled = int(f["n_stalled"] or 0)
    if stalled and stalled / n >= stall_share:
        verdicts.append(
            (
                stalled / n,
                "decode_stalls",
                {
                    "stalled_requests": stalled,
                    "stalled_share": stalled / n,
                    "stalls": int(f["stalls"] or 0),
                    "itl_p50_ms": ms(f["itl_p50"]),
                    "itl_max_p99_ms": ms(f["itl_max_p99"]),
                    "decode_share": f["decode_share"],
                },
            )
        )
    peak = peaks[0]
    load_corr = finite(peak["load_latency_corr"])
    if (
        int(peak["minutes"] or 0) >= PEAK_MIN_MINUTES
        and load_corr is not None
        and load_corr >= PEAK_LOAD_CORR_MIN
        and (peak["peak_p95"] or 0) >= PEAK_P95_FACTOR * (peak["median_p95"] or 0)
    ):
        verdicts.append(
            (
                load_corr * PEAK_SCORE_WEIGHT,
                "peak_only",
                {
                    "minutes": int(peak["minutes"]),
                    "load_vs_p95_corr": load_corr,
                    "load_vs_queue_corr": finite(peak["load_queue_corr"]),
                    "peak_requests_per_minute": int(peak["peak_rpm"]),
                    "median_requests_per_minute": float(peak["median_rpm"]),
                    "peak_minute_p95_ms": ms(peak["peak_p95"]),
                    "median_minute_p95_ms": ms(peak["median_p95"]),
                },
            )
        )
    cold = coldstart.verdict(cold_answer)
    if cold is not None:
        verdicts.append((cold[0], "cold_start", cold[1]))
    shown = []
    for score, key, evidence in sorted(verdicts, key=lambda v: -v[0]):
        cause = dict(CAUSES.get(key) or coldstart.COLD_START_CAUSE)
        if key == "cold_start":
            cause["bucket"] = evidence["warmup_extra_bucket"] or cause["bucket"]
        shown.append((key, cause, score, evidence))
    # Where each verdict's bucket concentrates: every bucket's selection in one read.
    places = dimensions.concentrations(
        store, since_ns=since_ns, until_ns=until_ns, service=service, model=model,
        buckets=[cause["bucket"] for key, cause, _, _ in shown if key != "cold_start"],
    )  # fmt: skip
    located: set[str] = set()  # a cold start shows where only after a verdict of its bucket
    found = []
    for key, cause, score, evidence in shown:
        if key != "cold_start":
            located.add(cause["bucket"])
        where = places.get(cause["bucket"]) if cause["bucket"] in located else None
        found.append(Verdict(id=key, **cause, score=score, evidence=evidence, where=where))
    return Diagnosis(
        count=n,
        dominant=max(shares, key=lambda b: shares[b]),
        tail_dominant=t.dominant,
        shares=shares,
        verdicts=found,
        window=Window.of(since_ns, until_ns),
    )


def _side_by_side(*reads: Callable[[], Any]) -> list[Any]:
    """Each of ``reads`` run on a thread of its own, in this context (the window's view of its
    hours is shared), their answers in order; the first failure is raised. The store takes
    concurrent calls, and one read alone does not keep both of a small machine's cores busy
    (its analysis, its last merge and the Python around it run on one)."""
    with ThreadPoolExecutor(max_workers=len(reads), thread_name_prefix="diagnose") as pool:
        futures = [pool.submit(contextvars.copy_context().run, read) for read in reads]
        return [future.result() for future in futures]
