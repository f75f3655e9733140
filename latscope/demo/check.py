"""``latscope demo --check``: latscope's attribution of each request against the ground truth.

The truth of a bucket is a bracket ``[low, high]`` (see ``latscope.demo.truth``); latscope's
figure for it is right when it lies within ``max(1 ms, 2 %)`` of the bracket (2 % of the true
value). The check passes when every bucket of every compared request is right.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from latscope.semconv import BUCKETS

#: Absolute and relative tolerance of one bucket of one request.
TOLERANCE_NS = 1_000_000
TOLERANCE_SHARE = 0.02


def tolerance_ns(truth_ns: int) -> float:
    return max(TOLERANCE_NS, TOLERANCE_SHARE * abs(truth_ns))


@dataclass
class BucketCheck:
    """How far latscope was from the truth on one bucket, over all compared requests (ms);
    errors are distances outside the truth's bracket."""

    bucket: str
    truth_mean_ms: float
    #: Mean and largest width of the truth's bracket: how precisely the truth is known.
    bracket_mean_ms: float
    bracket_max_ms: float
    latscope_mean_ms: float
    mean_abs_error_ms: float
    p95_abs_error_ms: float
    max_abs_error_ms: float
    within: int
    compared: int

    @property
    def ok(self) -> bool:
        return self.within == self.compared

    def to_json(self) -> dict[str, Any]:
        return {
            "bucket": self.bucket,
            "truth_mean_ms": self.truth_mean_ms,
            "bracket_mean_ms": self.bracket_mean_ms,
            "bracket_max_ms": self.bracket_max_ms,
            "latscope_mean_ms": self.latscope_mean_ms,
            "mean_abs_error_ms": self.mean_abs_error_ms,
            "p95_abs_error_ms": self.p95_abs_error_ms,
            "max_abs_error_ms": self.max_abs_error_ms,
            "within_tolerance": self.within,
            "compared": self.compared,
            "ok": self.ok,
        }


@dataclass
class CheckResult:
    compared: int
    #: Requests the client finished but latscope has no attribution for.
    missing: list[str] = field(default_factory=list)
    buckets: list[BucketCheck] = field(default_factory=list)
    #: Clock skew latscope estimated (ms, mean over requests) and the skew actually applied.
    skew_estimate_ms: float | None = None
    skew_applied_ms: float = 0.0
    #: Mean delay the proxy added per request (ms), part of the true network bucket.
    proxy_added_ms: float | None = None
    #: The worst requests: (trace id, bucket, truth ms, latscope ms).
    worst: list[tuple[str, str, float, float]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.compared > 0 and not self.missing and all(b.ok for b in self.buckets)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "compared": self.compared,
            "missing": self.missing,
            "tolerance": {"abs_ms": TOLERANCE_NS / 1e6, "share": TOLERANCE_SHARE},
            "buckets": [b.to_json() for b in self.buckets],
            "skew_estimate_ms": self.skew_estimate_ms,
            "skew_applied_ms": self.skew_applied_ms,
            "proxy_added_ms": self.proxy_added_ms,
            "worst": [
                {"trace_id": t, "bucket": b, "truth_ms": tv, "latscope_ms": lv}
                for t, b, tv, lv in self.worst
            ],
        }


def _p95(values: Sequence[float]) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=20, method="inclusive")[-1]


def compare(
    pairs: Sequence[tuple[str, Mapping[str, tuple[int, int]], Mapping[str, Any]]],
    *,
    missing: Sequence[str] = (),
    skew_applied_s: float = 0.0,
    proxy_added_ns: Sequence[int] = (),
) -> CheckResult:
    """Compare ``(trace_id, true bucket brackets in ns, latscope's attribution JSON)`` triples.

    The error of a bucket is how far latscope's figure lies outside the truth's bracket (0
    inside it); the means in the table use the bracket's middle.
    """
    result = CheckResult(
        compared=len(pairs), missing=list(missing), skew_applied_ms=skew_applied_s * 1000
    )
    offenders: list[tuple[float, str, str, float, float]] = []
    for bucket in BUCKETS:
        truths, seen, errors, widths, within = [], [], [], [], 0
        for trace_id, truth, attributed in pairs:
            low, high = truth[bucket]
            true_ns = (low + high) / 2
            got_ms = (attributed.get("buckets_ms") or {}).get(bucket)
            got_ns = 0.0 if got_ms is None else got_ms * 1e6
            error = max(low - got_ns, got_ns - high, 0.0)
            truths.append(true_ns / 1e6)
            widths.append((high - low) / 1e6)
            seen.append(got_ns / 1e6)
            errors.append(error / 1e6)
            limit = tolerance_ns(round(true_ns))
            if got_ms is not None and error <= limit:
                within += 1
            else:
                offenders.append((error / limit, trace_id, bucket, true_ns / 1e6, got_ns / 1e6))
        if not pairs:
            continue
        result.buckets.append(
            BucketCheck(
                bucket=bucket,
                truth_mean_ms=statistics.fmean(truths),
                bracket_mean_ms=statistics.fmean(widths),
                bracket_max_ms=max(widths),
                latscope_mean_ms=statistics.fmean(seen),
                mean_abs_error_ms=statistics.fmean(errors),
                p95_abs_error_ms=_p95(errors),
                max_abs_error_ms=max(errors),
                within=within,
                compared=len(pairs),
            )
        )
    offenders.sort(reverse=True)
    result.worst = [(t, b, tv, lv) for _, t, b, tv, lv in offenders[:5]]
    skews = [float(a["clock_skew_ms"]) for _, _, a in pairs if a.get("clock_skew_ms") is not None]
    if skews:
        result.skew_estimate_ms = statistics.fmean(skews)
    if proxy_added_ns:
        result.proxy_added_ms = statistics.fmean(proxy_added_ns) / 1e6
    return result


#: The cold-start check: latscope's warm-up requests against the simulator's cold ones. The
#: two rules meet at the edges of the cold period (latscope counts from a replica's first
#: request on the client's clock, the simulator from its engine's start), so counts may differ
#: by a few requests, and the extra time by what those few carry.
COLD_COUNT_TOLERANCE = (3, 0.2)  # requests, share of the cold ones
COLD_EXTRA_TOLERANCE = (25.0, 0.25)  # ms, share of the true extra


@dataclass
class ColdCheck:
    """latscope's cold-start answer against the truth."""

    replicas_started: int
    replicas_found: int
    scale_ups: int
    truth_cold: int
    latscope_warmup: int
    truth_extra_ms: float | None
    latscope_extra_ms: float | None
    truth_dominant: str | None
    latscope_dominant: str | None

    @property
    def ok(self) -> bool:
        count_ok = abs(self.latscope_warmup - self.truth_cold) <= max(
            COLD_COUNT_TOLERANCE[0], COLD_COUNT_TOLERANCE[1] * self.truth_cold
        )
        extra_ok = (
            self.truth_extra_ms is not None
            and self.latscope_extra_ms is not None
            and abs(self.latscope_extra_ms - self.truth_extra_ms)
            <= max(COLD_EXTRA_TOLERANCE[0], COLD_EXTRA_TOLERANCE[1] * abs(self.truth_extra_ms))
        )
        return (
            self.truth_cold > 0
            and self.replicas_found == self.replicas_started
            and count_ok
            and extra_ok
            and self.latscope_dominant == self.truth_dominant
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "replicas_started": self.replicas_started,
            "replicas_found": self.replicas_found,
            "scale_ups": self.scale_ups,
            "truth_cold": self.truth_cold,
            "latscope_warmup": self.latscope_warmup,
            "truth_extra_ms": self.truth_extra_ms,
            "latscope_extra_ms": self.latscope_extra_ms,
            "truth_dominant": self.truth_dominant,
            "latscope_dominant": self.latscope_dominant,
        }


def check_cold(
    coldstart: Mapping[str, Any],
    truth: Sequence[tuple[bool, Mapping[str, tuple[int, int]]]],
    replicas_started: int,
) -> ColdCheck:
    """Compare latscope's cold-start answer (``/v1/attribution/coldstart``) with the truth:
    ``(served cold, true bucket brackets)`` per request. The true extra is the cold requests'
    mean e2e minus the warm ones' (bracket middles), by bucket."""

    def means(rows: list[Mapping[str, tuple[int, int]]]) -> dict[str, float]:
        return {b: statistics.fmean((r[b][0] + r[b][1]) / 2 for r in rows) / 1e6 for b in BUCKETS}

    cold = [b for is_cold, b in truth if is_cold]
    warm = [b for is_cold, b in truth if not is_cold]
    extra: float | None = None
    dominant: str | None = None
    if cold and warm:
        hot, calm = means(cold), means(warm)
        by_bucket = {b: hot[b] - calm[b] for b in BUCKETS}
        extra = sum(by_bucket.values())
        dominant = max(by_bucket, key=lambda b: by_bucket[b])
    return ColdCheck(
        replicas_started=replicas_started,
        replicas_found=sum(1 for r in coldstart["replicas"] if r["appeared"]),
        scale_ups=len(coldstart["scale_ups"]),
        truth_cold=len(cold),
        latscope_warmup=int(coldstart["warmup"]["count"]),
        truth_extra_ms=extra,
        latscope_extra_ms=coldstart["extra_e2e_ms"],
        truth_dominant=dominant,
        latscope_dominant=coldstart["dominant"],
    )


# -- agent runs ----------------------------------------------------------------------------------


@dataclass
class RunPartCheck:
    """One figure of the runs' critical paths (e2e, an LLM bucket, tool, app) against the truth,
    over all compared runs (ms); errors are distances outside the truth's bracket."""

    part: str
    truth_mean_ms: float
    latscope_mean_ms: float
    mean_abs_error_ms: float
    max_abs_error_ms: float
    within: int
    compared: int

    @property
    def ok(self) -> bool:
        return self.within == self.compared

    def to_json(self) -> dict[str, Any]:
        return {
            "part": self.part,
            "truth_mean_ms": self.truth_mean_ms,
            "latscope_mean_ms": self.latscope_mean_ms,
            "mean_abs_error_ms": self.mean_abs_error_ms,
            "max_abs_error_ms": self.max_abs_error_ms,
            "within_tolerance": self.within,
            "compared": self.compared,
            "ok": self.ok,
        }


@dataclass
class RunCheck:
    """latscope's runs (``/v1/traces/{trace_id}/run``) against the agents' truth."""

    compared: int
    #: Runs the agents finished that latscope has no run for (or not all of its calls).
    missing: list[str] = field(default_factory=list)
    #: Runs whose calls taken whole on the critical path differ from the truth's.
    path_mismatch: list[str] = field(default_factory=list)
    parts: list[RunPartCheck] = field(default_factory=list)
    calls: int = 0
    parallel_calls: int = 0
    #: The truth's pieces of calls cut off by a later sibling's start (see latscope.demo.agent).
    partial_max_ms: float = 0.0
    worst: list[tuple[str, str, float, float]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.compared > 0
            and not self.missing
            and not self.path_mismatch
            and all(p.ok for p in self.parts)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "compared": self.compared,
            "calls": self.calls,
            "parallel_calls": self.parallel_calls,
            "missing": self.missing,
            "path_mismatch": self.path_mismatch,
            "tolerance": {"abs_ms": TOLERANCE_NS / 1e6, "share": TOLERANCE_SHARE},
            "parts": [p.to_json() for p in self.parts],
            "partial_max_ms": self.partial_max_ms,
            "worst": [
                {"trace_id": t, "part": p, "truth_ms": tv, "latscope_ms": lv}
                for t, p, tv, lv in self.worst
            ],
        }


def run_figures(run: Mapping[str, Any]) -> dict[str, float]:
    """The graded figures of a ``/v1/traces/{trace_id}/run`` answer (ms), named as
    ``RunTruth.parts`` names them."""
    budget = run["critical_path_ms"]
    return {
        "e2e": run["e2e_ms"],
        **{f"llm.{b}": budget["llm_buckets"][b] for b in BUCKETS},
        "tool": budget["tool"],
        "app": budget["app"],
    }


def whole_calls_on_path(run: Mapping[str, Any]) -> list[str]:
    """The calls of a run answer the root waited for whole (within the tolerance)."""
    return [
        c["request_id"]
        for c in run["calls"]
        if c["on_critical_path_ms"] * 1e6 >= c["e2e_ms"] * 1e6 - tolerance_ns(c["e2e_ms"] * 1e6)
    ]


def compare_runs(
    pairs: Sequence[tuple[str, Mapping[str, tuple[int, int]], Mapping[str, Any], Sequence[str]]],
    *,
    missing: Sequence[str] = (),
    parallel_calls: int = 0,
    partial_max_ns: int = 0,
) -> RunCheck:
    """Compare ``(trace_id, true parts as ns brackets, latscope's run answer, the truth's calls
    taken whole on the path)`` per run: every part within ``max(1 ms, 2 %)`` of its bracket, and
    the same calls taken whole."""
    result = RunCheck(
        compared=len(pairs),
        missing=list(missing),
        calls=sum(len(run["calls"]) for _, _, run, _ in pairs),
        parallel_calls=parallel_calls,
        partial_max_ms=partial_max_ns / 1e6,
    )
    offenders: list[tuple[float, str, str, float, float]] = []
    names = list(pairs[0][1]) if pairs else []
    for name in names:
        truths, seen, errors, within = [], [], [], 0
        for trace_id, truth, run, _ in pairs:
            low, high = truth[name]
            true_ns = (low + high) / 2
            got_ns = run_figures(run)[name] * 1e6
            error = max(low - got_ns, got_ns - high, 0.0)
            limit = tolerance_ns(round(true_ns))
            truths.append(true_ns / 1e6)
            seen.append(got_ns / 1e6)
            errors.append(error / 1e6)
            if error <= limit:
                within += 1
            else:
                offenders.append((error / limit, trace_id, name, true_ns / 1e6, got_ns / 1e6))
        result.parts.append(
            RunPartCheck(
                part=name,
                truth_mean_ms=statistics.fmean(truths),
                latscope_mean_ms=statistics.fmean(seen),
                mean_abs_error_ms=statistics.fmean(errors),
                max_abs_error_ms=max(errors),
                within=within,
                compared=len(pairs),
            )
        )
    for trace_id, _, run, truth_calls in pairs:
        if sorted(whole_calls_on_path(run)) != sorted(truth_calls):
            result.path_mismatch.append(trace_id)
    offenders.sort(reverse=True)
    result.worst = [(t, p, tv, lv) for _, t, p, tv, lv in offenders[:5]]
    return result
