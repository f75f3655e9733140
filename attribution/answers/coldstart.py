"""Cold starts and scale-up lag: requests served by a replica that had just appeared.

A replica is named by its ``service.instance.id`` resource attribute, else ``k8s.pod.name``, else
``host.name`` (per service). It *appears* at its first request; it is **warming up** for its first
``warmup_requests`` requests and for the first ``warmup_s`` seconds after it appeared (either
rule flags a request: the cold effects of a new replica come with its first requests (JIT
compilation, CUDA graph capture, empty prefix caches) and with its first seconds (weights still
loading, caches filling, the autoscaler's other replicas still starting); 0 turns a rule off).
Requests of the window are flagged warm-up or warm, and the two are compared bucket by bucket:
means add up, so the warm-up requests' extra time over the warm ones splits exactly into the
seven buckets.

A replica is looked for ``lookback_s`` before the window, so one that appeared just before it
still has its warm-up flagged; one first seen in the first ``LOOKBACK_GRACE_S`` of that lookback
is taken to have been running before it (its first request there is not its first ever). So is
one of the fleet present when its service's data begins (latscope just started, or the service
was quiet): its first request came among the service's first ``INITIAL_FLEET_FACTOR`` x
(replicas) requests, as a load balancer sends them to every replica it has. Replicas appearing
within ``SCALE_UP_GAP_S`` of each other make one scale-up.

>>> got = coldstart(store, since_ns=t0, until_ns=t1)  # doctest: +SKIP
>>> got.appeared, got.warmup.count, got.extra_e2e_ms, got.dominant  # doctest: +SKIP
(1, 40, 850.0, 'prefill')
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from latscope.attribution import rules
from latscope.attribution.answers import window
from latscope.attribution.answers.common import FILTERS, ms
from latscope.attribution.answers.errors import ColdStartError
from latscope.attribution.answers.figures import side_means
from latscope.attribution.answers.models import (
    BucketMeans,
    ColdStart,
    Replica,
    ReplicaStartup,
    ScaleUp,
    WarmupRuleModel,
    WhySide,
    Window,
)
from latscope.attribution.table import BUCKET_COLUMNS
from latscope.semconv import BUCKETS
from latscope.sqltext import render
from latscope.storage import SPANS_TABLE, Store

__all__ = [
    "COLD_START_CAUSE",
    "INITIAL_FLEET_FACTOR",
    "LOOKBACK_GRACE_S",
    "REPLICA_KEYS",
    "SCALE_UP_GAP_S",
    "VERDICT_MIN_FACTOR",
    "VERDICT_MIN_REQUESTS",
    "ColdStartError",
    "WarmupRule",
    "coldstart",
    "startups",
    "verdict",
]

#: Resource attributes naming a replica, in order of preference: the OpenTelemetry instance id
#: is meant for exactly this; a pod or host name is what Kubernetes or a VM gives otherwise.
REPLICA_KEYS = ("service.instance.id", "k8s.pod.name", "host.name")
#: A replica first seen this soon after the lookback starts was running before it: a replica in
#: service rarely goes five minutes without a request, so one first seen that early in the
#: lookback was most likely already serving.
LOOKBACK_GRACE_S = 300
#: A replica whose first request is among its service's first (this x replicas) requests was
#: there when the data began: a load balancer reaches every replica it has within a few rounds
#: (round-robin in one, random choice in about ln(replicas)).
INITIAL_FLEET_FACTOR = 3
#: The service's first requests are read up to this many (fleets up to a fifth of it).
MAX_INITIAL_REQUESTS = 256
#: Replicas appearing this close to each other are one scale-up: an autoscaler adds replicas in
#: steps over a few minutes, while scale-ups for separate load peaks are further apart.
SCALE_UP_GAP_S = 300
#: Replicas listed at most (the newest first); the figures cover every replica.
MAX_REPLICAS = 200
#: At most this many first requests per replica are tracked (the largest ``warmup_requests``).
MAX_WARMUP_REQUESTS = 10_000
#: Startup spans read at most (a replica's startup trace holds a handful).
MAX_STARTUP_SPANS = 100_000
#: The longest ``warmup_s`` (a day) and ``lookback_s`` (a week) a rule may set.
MAX_WARMUP_S = 86_400
MAX_LOOKBACK_S = 7 * 86_400

_REPLICA = (
    "coalesce("
    + ", ".join(f"nullIf(ResourceAttributes['{k}'], '')" for k in REPLICA_KEYS)
    + ", '')"
)
_SETTINGS = "\nSETTINGS do_not_merge_across_partitions_select_final = 1, join_use_nulls = 0"
_COLUMNS = "ServiceName, Timestamp, ResourceAttributes"
_FIGURE_COLUMNS = ", E2eNs, " + ", ".join(BUCKET_COLUMNS.values())


@dataclass(frozen=True)
class WarmupRule:
    """How long a new replica is warming up; see the module docstring.

    >>> WarmupRule(warmup_requests=10, warmup_s=60).validate()
    """

    #: A new replica's first ten requests: where its first-use costs land (kernels compiled and
    #: CUDA graphs captured on first use, an empty prefix cache).
    warmup_requests: int = 10
    #: And its first minute: weights still paging in, the scale-up's other replicas still
    #: starting.
    warmup_s: float = 60.0
    #: Replicas are looked for an hour before the window, so one that appeared just before it
    #: still has its warm-up flagged.
    lookback_s: float = 3600.0

    def validate(self) -> None:
        if not 0 <= self.warmup_requests <= MAX_WARMUP_REQUESTS:
            raise ColdStartError(f"warmup_requests must be in 0..{MAX_WARMUP_REQUESTS}")
        if not 0 <= self.warmup_s <= MAX_WARMUP_S:
            raise ColdStartError(f"warmup_s must be in 0..{MAX_WARMUP_S} seconds")
        if self.warmup_requests == 0 and self.warmup_s == 0:
            raise ColdStartError("warmup_requests and warmup_s are both 0: nothing is warm-up")
        if not LOOKBACK_GRACE_S < self.lookback_s <= MAX_LOOKBACK_S:
            raise ColdStartError(
                f"lookback_s must be in {LOOKBACK_GRACE_S}..{MAX_LOOKBACK_S} seconds"
            )


#: Every replica of the window and its lookback: first request, count, its first requests' times.
REPLICAS_SQL = f"""
SELECT ServiceName AS service, replica, toUnixTimestamp64Nano(min(Timestamp)) AS first_ns,
       count() AS n,
       arrayMap(t -> toUnixTimestamp64Nano(t), groupArraySorted({{n_first:UInt32}})(Timestamp))
           AS firsts
FROM (SELECT ServiceName, Timestamp, {_REPLICA} AS replica FROM ($ROWS))
WHERE replica != ''
GROUP BY service, replica{_SETTINGS}
"""

_SUMS = ", ".join(
    ["sum(E2eNs) AS e2e"]
    + [
        f"sum({'ifNull(NetworkNs, 0)' if col == 'NetworkNs' else col}) AS {b}"
        for b, col in BUCKET_COLUMNS.items()
    ]
)
_FIGURES = ("e2e", *BUCKETS)

#: The window's requests per replica, split at each warming replica's cutoff (``cuts``: service,
#: replica, first ns after its warm-up); replicas not listed are warm throughout.
SPLIT_SQL = f"""
SELECT r.service AS service, r.replica AS replica, r.ts < c.cut AS warming, count() AS n, {_SUMS}
FROM (
    SELECT ServiceName AS service, {_REPLICA} AS replica, toUnixTimestamp64Nano(Timestamp) AS ts,
           E2eNs, {", ".join(BUCKET_COLUMNS.values())}
    FROM ($ROWS)
) AS r
LEFT JOIN (
    SELECT t.1 AS service, t.2 AS replica, t.3 AS cut
    FROM (SELECT arrayJoin({{cuts:Array(Tuple(String, String, Int64))}}) AS t)
) AS c ON r.service = c.service AND r.replica = c.replica
GROUP BY service, replica, warming{_SETTINGS}
"""


#: Each engine's startup spans in the lookback and the window (the rulebook's
#: ``[engine.startup]`` names), with the replica of the process that wrote each.
STARTUP_SQL = f"""
SELECT ServiceName AS service, {_REPLICA} AS replica, TraceId AS trace_id, SpanName AS name,
       toUnixTimestamp64Nano(Timestamp) AS start_ns, toInt64(Duration) AS duration_ns
FROM {SPANS_TABLE}
WHERE Timestamp >= fromUnixTimestamp64Nano({{lookback_ns:Int64}})
  AND Timestamp < fromUnixTimestamp64Nano({{until_ns:Int64}})
  AND SpanName IN {{startup_names:Array(String)}}
  AND ({{service:String}} = '' OR ServiceName = {{service:String}})
ORDER BY start_ns
LIMIT {MAX_STARTUP_SPANS}
"""


def startups(
    store: Store, *, lookback_ns: int, until_ns: int, service: str = ""
) -> dict[tuple[str, str], ReplicaStartup]:
    """Each replica's latest startup before ``until_ns`` (its root span started after
    ``lookback_ns``), by its engine's startup spans: when it started and was ready (the root's
    end), the whole load, the weights (the longest load span of the trace: one per worker) and
    the preparation after them (KV cache, warm-up), in ms. Keyed by (service, replica) of the
    root span's process."""
    entries = rules.active().startups()
    names = sorted({n for e in entries for n in e.values()})
    if not names:
        return {}
    params = {
        "lookback_ns": int(lookback_ns),
        "until_ns": int(until_ns),
        "service": service,
        "startup_names": names,
    }
    traces: dict[str, list[dict[str, Any]]] = {}
    for row in store.query_arrow(STARTUP_SQL, params).to_pylist():
        traces.setdefault(row["trace_id"], []).append(row)
    out: dict[tuple[str, str], ReplicaStartup] = {}
    for trace_id, rows in traces.items():
        for entry in entries:
            roots = [r for r in rows if r["name"] == entry["root"] and r["replica"]]
            if not roots:
                continue
            root = min(roots, key=lambda r: r["start_ns"])
            key = (root["service"], root["replica"])
            if key not in out or out[key].started_ns < root["start_ns"]:
                out[key] = ReplicaStartup(
                    trace_id=trace_id,
                    started_ns=int(root["start_ns"]),
                    ready_ns=int(root["start_ns"] + root["duration_ns"]),
                    loading_ms=ms(float(root["duration_ns"])),
                    load_model_ms=_longest(rows, entry.get("load")),
                    prepare_ms=_longest(rows, entry.get("prepare")),
                )
            break
    return out


def _longest(rows: list[dict[str, Any]], name: str | None) -> float | None:
    """The longest span of ``name`` among a trace's ``rows`` in ms (None: none or no name)."""
    found = [r["duration_ns"] for r in rows if name is not None and r["name"] == name]
    return ms(float(max(found))) if found else None


def coldstart(
    store: Store,
    *,
    since_ns: int,
    until_ns: int,
    service: str | None = None,
    model: str | None = None,
    rule: WarmupRule | None = None,
) -> ColdStart:
    """Replicas that appeared, which requests of the window they served while warming up, and
    warm-up against warm latency bucket by bucket (``extra_buckets_ms`` adds up to
    ``extra_e2e_ms``).

    Requests without a replica attribute are in neither side (``unidentified`` counts them).
    """
    rule = rule or WarmupRule()
    rule.validate()
    if until_ns <= since_ns:
        raise ColdStartError(f"empty window: until ({until_ns}) must be after since ({since_ns})")
    lookback_ns = int(since_ns - rule.lookback_s * 1e9)
    params: dict[str, Any] = {
        "since_ns": int(since_ns),
        "until_ns": int(until_ns),
        "lookback_ns": lookback_ns,
        "service": service or "",
        "model": model or "",
        # Each replica's first requests, enough to know its warm-up cut and, merged, the
        # service's first requests (``_initial_fleet``).
        "n_first": max(rule.warmup_requests, MAX_INITIAL_REQUESTS),
    }
    grace_ns = lookback_ns + LOOKBACK_GRACE_S * 10**9
    warmup_ns = int(rule.warmup_s * 1e9)
    replicas: dict[tuple[str, str], dict[str, Any]] = {}
    cuts = []
    # Reads skip FINAL where the hour is known clean (``window.raw_ranges``).
    looked = window.raw_ranges(store, [(lookback_ns, int(until_ns))])
    rows = window.raw_rows(looked, params, _COLUMNS, FILTERS, prefix="l")
    found = store.query_arrow(render(REPLICAS_SQL, {"ROWS": rows}), params).to_pylist()
    loaded = startups(store, lookback_ns=lookback_ns, until_ns=int(until_ns), service=service or "")
    initial = _initial_fleet(found)
    for row in found:
        key = (row["service"], row["replica"])
        first = int(row["first_ns"])
        appeared = first >= grace_ns and (row["service"], row["replica"]) not in initial
        cut = 0
        if appeared:
            firsts = row["firsts"]
            by_count = 0
            if rule.warmup_requests:
                # Past the N-th request (or every request, for a replica with fewer).
                by_count = (
                    firsts[rule.warmup_requests - 1] + 1
                    if len(firsts) >= rule.warmup_requests
                    else until_ns
                )
            cut = max(by_count, first + warmup_ns if warmup_ns else 0)
        replicas[key] = {
            "service": row["service"],
            "replica": row["replica"],
            "first_seen_ns": first,
            "appeared": appeared,
            "warm_from_ns": cut if appeared else None,
            "requests": 0,
            "warmup_requests": 0,
            "warmup_e2e_mean_ms": None,
            "warm_e2e_mean_ms": None,
            "startup": loaded.get(key),
        }
        if appeared and cut > since_ns:
            cuts.append((row["service"], row["replica"], cut))
    params["cuts"] = cuts
    sides = {True: dict.fromkeys(_FIGURES, 0.0), False: dict.fromkeys(_FIGURES, 0.0)}
    counts = {True: 0, False: 0}
    unidentified = 0
    split = window.raw_ranges(store, [(int(since_ns), int(until_ns))])
    rows = window.raw_rows(split, params, _COLUMNS + _FIGURE_COLUMNS, FILTERS)
    for row in store.query_arrow(render(SPLIT_SQL, {"ROWS": rows}), params).to_pylist():
        n = int(row["n"])
        if not row["replica"]:
            unidentified += n
            continue
        warming = bool(row["warming"])
        counts[warming] += n
        for f in _FIGURES:
            sides[warming][f] += float(row[f])
        entry = replicas.get((row["service"], row["replica"]))
        if entry is None:
            continue
        entry["requests"] += n
        mean = ms(float(row["e2e"]) / n) if n else None
        if warming:
            entry["warmup_requests"] += n
            entry["warmup_e2e_mean_ms"] = mean
        else:
            entry["warm_e2e_mean_ms"] = mean
    extra_buckets: dict[str, float | None] = dict.fromkeys(BUCKETS)
    extra = None
    if counts[True] and counts[False]:
        extra_buckets = {
            b: (sides[True][b] / counts[True] - sides[False][b] / counts[False]) / 1e6
            for b in BUCKETS
        }
        extra = sum(v for v in extra_buckets.values() if v is not None)
    known = {b: v for b, v in extra_buckets.items() if v is not None}
    dominant = max(known, key=lambda b: known[b]) if known else None
    if dominant is not None and known[dominant] <= 0:
        dominant = None
    seen = [Replica(**r) for r in replicas.values() if r["requests"] or r["appeared"]]
    new_replicas = sorted(
        (r for r in seen if r.appeared and r.first_seen_ns < until_ns),
        key=lambda r: r.first_seen_ns,
    )
    listed = sorted(seen, key=lambda r: (-r.first_seen_ns, r.service, r.replica))
    return ColdStart(
        window=Window.of(since_ns, until_ns),
        rule=WarmupRuleModel(**asdict(rule), replica_keys=list(REPLICA_KEYS)),
        replicas=listed[:MAX_REPLICAS],
        replica_count=len(seen),
        appeared=len([r for r in new_replicas if r.first_seen_ns >= since_ns]),
        warmup=side_means(counts[True], sides[True], WhySide),
        warm=side_means(counts[False], sides[False], WhySide),
        unidentified=unidentified,
        extra_e2e_ms=extra,
        extra_buckets_ms=BucketMeans(**extra_buckets),
        dominant=dominant,
        scale_ups=_scale_ups(new_replicas, since_ns),
    )


def _initial_fleet(found: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """(service, replica) of the replicas there when each service's data begins: first seen
    among the service's first ``INITIAL_FLEET_FACTOR`` x (its replicas) requests."""
    firsts: dict[str, list[int]] = {}
    replicas: dict[str, int] = {}
    for row in found:
        # The union of every replica's first requests holds the service's first ones.
        firsts.setdefault(row["service"], []).extend(row["firsts"])
        replicas[row["service"]] = replicas.get(row["service"], 0) + 1
    initial = set()
    for row in found:
        service = row["service"]
        times = sorted(firsts[service])[:MAX_INITIAL_REQUESTS]
        among = min(INITIAL_FLEET_FACTOR * replicas[service], len(times))
        if int(row["first_ns"]) <= times[among - 1]:
            initial.add((service, row["replica"]))
    return initial


def _scale_ups(appeared: list[Replica], since_ns: int) -> list[ScaleUp]:
    """Replicas that appeared close together (SCALE_UP_GAP_S), oldest first."""
    events: list[list[Replica]] = []
    for r in appeared:
        if not events or r.first_seen_ns - events[-1][-1].first_seen_ns > SCALE_UP_GAP_S * 10**9:
            events.append([])
        events[-1].append(r)
    out = []
    for event in events:
        at_ns = event[0].first_seen_ns
        warm_by_ns = max(r.warm_from_ns or r.first_seen_ns for r in event)
        if warm_by_ns <= since_ns:
            continue  # wholly before the window
        out.append(
            ScaleUp(
                at_ns=at_ns,
                replicas=[f"{r.service}/{r.replica}" for r in event],
                count=len(event),
                warm_by_ns=warm_by_ns,
                warmup_s=(warm_by_ns - at_ns) / 1e9,
            )
        )
    return out


#: A cold-start verdict needs this many warm-up requests (fewer are an anecdote: one slow first
#: request after a deploy is normal and not worth a verdict)...
VERDICT_MIN_REQUESTS = 5
#: ...taking at least a quarter longer than warm requests, on the mean: smaller differences are
#: within what load alone moves a mean between two sets of requests.
VERDICT_MIN_FACTOR = 1.25

#: The diagnosis' cold-start verdict: cause, bucket (filled in from the numbers), first fixes.
COLD_START_CAUSE: dict[str, Any] = {
    "bucket": "queue",
    "cause": "cold starts: replicas that just appeared serve their first requests slowly "
    "(scale-up lag)",
    "fixes": [
        "pre-warm new replicas: send warm-up requests before marking them ready",
        "keep a minimum number of replicas warm instead of scaling from few",
        "load the weights ahead (local cache or baked into the image; readiness waits for them)",
        "scale out earlier, on queue time, so the warm-up happens before the load arrives",
    ],
}


def verdict(found: ColdStart) -> tuple[float, dict[str, Any]] | None:
    """(score, evidence) of the cold-start verdict for a ``coldstart`` answer, or None.

    The score is the share of a warm-up request's time that warming up adds:
    ``extra / warm-up mean``, in [0, 1).
    """
    warmup, warm = found.warmup, found.warm
    warmup_mean = warmup.e2e_mean_ms or 0.0
    if (
        found.appeared == 0
        or warmup.count < VERDICT_MIN_REQUESTS
        or not warm.count
        or not warm.e2e_mean_ms
        or warmup_mean < VERDICT_MIN_FACTOR * warm.e2e_mean_ms
    ):
        return None
    extra = found.extra_e2e_ms or 0.0
    replicas = [r for r in found.replicas if r.appeared and r.warmup_requests]
    first = min((r.first_seen_ns for r in replicas), default=None)
    evidence = {
        "replicas_appeared": found.appeared,
        "replicas": [f"{r.service}/{r.replica}" for r in replicas][:10],
        "since_ns": first,
        "warmup_requests": warmup.count,
        "warmup_e2e_mean_ms": warmup.e2e_mean_ms,
        "warm_e2e_mean_ms": warm.e2e_mean_ms,
        "warmup_extra_ms": extra,
        "warmup_extra_bucket": found.dominant,
        # Evidence is a free-form mapping of the verdict's numbers (``Verdict.evidence``).
        "warmup_extra_by_bucket_ms": found.extra_buckets_ms.model_dump(),
        "rule_warmup_requests": found.rule.warmup_requests,
        "rule_warmup_s": found.rule.warmup_s,
    }
    return extra / warmup_mean, evidence
