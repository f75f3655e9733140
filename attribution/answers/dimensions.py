"""What is different about these requests: dimensions ranked by how differently their values are
distributed inside a selection and outside it, and the extra time each value carries, by bucket.

A selection is a set of requests of the window (``Selection``): those at or above a percentile of
e2e (or of a bucket, TTFT, TPOT), an SLO's bad requests, a region of the latency heatmap (a time
range by a latency range), or the whole window against the window of the same length just before
it. The baseline is the rest: the window's other requests (the previous window for ``before``).

The ranking follows Honeycomb's BubbleUp: for every dimension (service, model, route, operation,
status, attempts, input- and output-token bands, resource attributes such as
``service.instance.id``, ``k8s.pod.name``, ``host.name``, the cloud zone, and span attributes the
caller names), each value's share of the selection is set against its share of the baseline;
a dimension scores the largest over-representation of any one of its values
(``in_share - out_share``), so the dimension that names one culprit value comes first.
docs/attribution.md ("What is different") says why this score.

Then latscope splits what BubbleUp cannot: for each top value, the extra time its selected
requests take over the baseline's mean, bucket by bucket. Means add up (a request's buckets sum to
its e2e, network counting 0 where unknown), so the seven extras of a value sum exactly to its
extra e2e, and the values of one dimension, weighted by their counts, sum to the selection's
extra.

>>> why(store, since_ns=t0, until_ns=t1, selection=Selection("percentile", percentile=99))
... # doctest: +SKIP
Why(selection=WhySelection(count=12, ...), baseline=WhyBaseline(count=1188, ...),
    dimensions=[WhyDimension(dimension='resource.k8s.pod.name', score=0.83, values=[
        WhyValue(value='llm-7', in_share=0.92, out_share=0.09, extra_ms=2410.0, ...)])],
    top=WhyTop(dimension='resource.k8s.pod.name', value='llm-7', dominant='queue', ...), ...)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from latscope.attribution.answers import timeseries, window
from latscope.attribution.answers.common import FILTERS, SETTINGS, bounded, ms
from latscope.attribution.answers.errors import DimensionError
from latscope.attribution.answers.figures import side_means
from latscope.attribution.answers.groups import ATTRIBUTE_KEY
from latscope.attribution.answers.models import (
    BucketMeans,
    BudgetSplit,
    VerdictWhere,
    Why,
    WhyBaseline,
    WhyDimension,
    WhyExample,
    WhySelection,
    WhyTop,
    WhyValue,
    Window,
)
from latscope.attribution.answers.selection import (
    BASE_COLUMNS,
    DEFAULT_RESOURCE_KEYS,
    DIMENSIONS,
    MAX_EXTRA_DIMENSIONS,
    SELECTION_KINDS,
    Selection,
    SelectionQuery,
    selection_query,
)
from latscope.attribution.table import BUCKET_COLUMNS
from latscope.semconv import BUCKETS
from latscope.sqltext import render
from latscope.storage import SPANS_TABLE, Store

__all__ = [
    "DEFAULT_RESOURCE_KEYS",
    "DIMENSIONS",
    "SELECTION_KINDS",
    "DimensionError",
    "Selection",
    "concentration",
    "concentrations",
    "slo_buckets",
    "why",
]

#: Most values ``why`` lists per dimension, and most slowest selected requests it shows.
MAX_VALUES = 50
MAX_EXAMPLES = 100

#: A value's share of the selection from which ``since`` is read: the first step holding at
#: least this fraction of the busiest step's selected requests with that value. A quarter of the
#: peak marks where the rise began, past the stray selected requests a value has before it.
SINCE_FRACTION = 0.25


# -- the dimensions -------------------------------------------------------------------------------


def _dimensions(
    q: SelectionQuery,
    resources: Sequence[str],
    attributes: Sequence[str],
    dimensions: Sequence[str] | None,
) -> None:
    """Fill ``q.dims`` (name, SQL) and the span-attribute join."""
    for key in (*resources, *attributes):
        if not ATTRIBUTE_KEY.fullmatch(key):
            raise DimensionError(
                f"attribute key {key!r}: letters, digits and . _ - / only, at most 128"
            )
    if len(resources) + len(attributes) > MAX_EXTRA_DIMENSIONS:
        raise DimensionError(f"at most {MAX_EXTRA_DIMENSIONS} resource and span attributes")
    names = list(DIMENSIONS) if dimensions is None else list(dimensions)
    for name in names:
        if name not in DIMENSIONS:
            raise DimensionError(f"dimension {name!r}: use one of {', '.join(DIMENSIONS)}")
        q.dims.append((name, *DIMENSIONS[name]))
    keys = list(dict.fromkeys([*(DEFAULT_RESOURCE_KEYS if dimensions is None else ()), *resources]))
    for i, key in enumerate(keys):
        q.params[f"rk{i}"] = key
        q.dims.append((f"resource.{key}", f"ResourceAttributes[{{rk{i}:String}}]", "$V"))
    q.resources = bool(keys)
    attrs = list(dict.fromkeys(attributes))
    if not attrs:
        return
    # The value on any span of the request's trace (first non-empty): tenant or user ids usually
    # sit on the server or the client span. Spans are read a day either side of the window's
    # requests (their starts are on other clocks, and a request may last long).
    picks = []
    for i, key in enumerate(attrs):
        q.params[f"ak{i}"] = key
        picks.append(
            f"anyIf(SpanAttributes[{{ak{i}:String}}], SpanAttributes[{{ak{i}:String}}] != '') "
            f"AS a{i}"
        )
        q.dims.append((f"attribute.{key}", f"sa.a{i}", "$V"))
    has = " OR ".join(f"mapContains(SpanAttributes, {{ak{i}:String}})" for i in range(len(attrs)))
    q.join = f"""
LEFT JOIN (
    SELECT TraceId, {", ".join(picks)}
    FROM {SPANS_TABLE}
    WHERE Timestamp >= fromUnixTimestamp64Nano({{lo_ns:Int64}} - {DAY_NS})
      AND Timestamp < fromUnixTimestamp64Nano({{hi_ns:Int64}} + {DAY_NS})
      AND ({has})
    GROUP BY TraceId
) AS sa ON a.TraceId = sa.TraceId"""


DAY_NS = 86_400 * 10**9

_SUMS = ", ".join(
    ["sum(E2eNs) AS e2e"]
    + [
        f"sum({'ifNull(NetworkNs, 0)' if col == 'NetworkNs' else col}) AS {b}"
        for b, col in BUCKET_COLUMNS.items()
    ]
)
_FIGURES = ("e2e", *BUCKETS)


#: Stage one counts and sums per combination of every dimension's value (many fewer rows than
#: requests), grouped by a 64-bit hash of the combination: hashing the values once costs about
#: what reading them does, where grouping by a dozen string keys costs five times more. Two
#: combinations sharing a hash would be counted as one: for a million distinct combinations the
#: chance is 3e-8. Stage two spreads each combination over its dimensions (ARRAY JOIN, values
#: turned into labels on these few rows) and sums per (dimension, value), inside and outside the
#: selection.
#:
#: One read serves several selections of one window (``_why_sql``): selection ``j`` has its
#: population flag ``p{j}`` and its selection flag ``s{j}`` (``$FLAGS``), stage one groups by all
#: of them, and stage two sums ``_in_{j}`` over ``s{j}`` and ``_out_{j}`` over ``p{j} AND NOT
#: s{j}``. Where ``folded``, each (dimension, value) also counts the selection's requests per
#: time step (``since_steps_{j}``/``since_counts_{j}``), so when the top value's selected
#: requests began comes from this one read rather than a second one (``SINCE_SQL``). That count
#: costs about a microsecond per selected request: well worth it where the selection is a small
#: part of the window (a percentile's tail, an SLO's bad requests, a heatmap region), more than a
#: second read where it is the whole window (``before``).
def _why_sql(folded: Sequence[bool]) -> str:
    k = len(folded)
    sums = []
    for j in range(k):
        out = f"p{j} AND NOT s{j}"
        sums.append(f"sumIf(n, s{j}) AS n_in_{j}, sumIf(n, {out}) AS n_out_{j}")
        sums += [
            f"sumIf({f}, s{j}) AS {f}_in_{j}, sumIf({f}, {out}) AS {f}_out_{j}" for f in _FIGURES
        ]
        if folded[j]:
            sums.append(
                f"sumMapIf(steps{j}.1, steps{j}.2, s{j}) AS since{j}, "
                f"since{j}.1 AS since_steps_{j}, since{j}.2 AS since_counts_{j}"
            )
    flags = ", ".join(f"p{j}, s{j}" for j in range(k))
    steps = "".join(
        f",\n        sumMapIf([step], [toUInt64(1)], s{j}) AS steps{j}"
        for j in range(k)
        if folded[j]
    )
    figures = ", ".join(c for c in BUCKET_COLUMNS.values() if c != "NetworkNs")
    sums_sql = ",\n    ".join(sums)
    return (
        f"""
SELECT d, v, {sums_sql}
FROM (
    SELECT {flags}, cityHash64($DIM_NAMES) AS combo, any(tuple($DIM_NAMES)) AS vals,
        count() AS n, {_SUMS}{steps}
    FROM (
        SELECT $FLAGS, $DIMS, E2eNs, NetworkNs, {figures},
            intDiv(toUnixTimestamp(Timestamp), {{step_s:UInt32}}) AS step
        FROM ($ROWS) AS a$JOIN
    )
    GROUP BY {flags}, combo
)
ARRAY JOIN [$LABELS] AS v, range($DIM_COUNT) AS d
GROUP BY d, v"""
        + SETTINGS
        + ", join_use_nulls = 0"
    )


#: When the selected requests with one value came, where WHY_SQL did not count them: selected
#: requests per step.
SINCE_SQL = (
    """
SELECT intDiv(toUnixTimestamp(Timestamp), {step_s:UInt32}) AS step, count() AS n
FROM ($ROWS) AS a$JOIN
WHERE $SEL AND $LABEL = {value:String}
GROUP BY step
ORDER BY step"""
    + SETTINGS
    + ", join_use_nulls = 0"
)

#: The slowest selected requests, to open one.
EXAMPLES_SQL = (
    """
SELECT TraceId AS trace_id, toUnixTimestamp64Nano(Timestamp) AS start_ns,
       ServiceName AS service, Model AS model, E2eNs AS e2e
FROM ($ROWS)
WHERE $SEL
ORDER BY E2eNs DESC, TraceId
LIMIT {examples:UInt32}"""
    + SETTINGS
)


def _label(label_sql: str, value_sql: str) -> str:
    """A dimension's label SQL (on ``$V``) applied to ``value_sql``."""
    return render(label_sql, {"V": value_sql})


def _extra(
    n_in: int, in_sums: Mapping[str, float], n_out: int, out_sums: Mapping[str, float]
) -> tuple[float | None, dict[str, float | None]]:
    """Mean extra e2e (ms) of the inside over the outside, and per bucket (they add up)."""
    if not n_in or not n_out:
        return None, dict.fromkeys(BUCKETS)
    buckets: dict[str, float | None] = {
        b: (in_sums[b] / n_in - out_sums[b] / n_out) / 1e6 for b in BUCKETS
    }
    return sum(v for v in buckets.values() if v is not None), buckets


def why(
    store: Store,
    *,
    since_ns: int,
    until_ns: int,
    selection: Selection | None = None,
    service: str | None = None,
    model: str | None = None,
    resources: Sequence[str] = (),
    attributes: Sequence[str] = (),
    dimensions: Sequence[str] | None = None,
    limit_values: int = 5,
    examples: int = 5,
    use_rollups: bool = True,
) -> Why:
    """Rank the dimensions by how differently the selection's requests are distributed over
    their values than the baseline's, and split each top value's extra time into buckets.

    ``resources`` adds resource attributes to the defaults (DEFAULT_RESOURCE_KEYS), ``attributes``
    adds span attributes (the value on any span of the request's trace). ``dimensions`` limits
    the built-in ones (and then skips the default resource attributes). Per dimension, values
    are listed by over-representation (``difference``), at most ``limit_values`` (up to
    ``MAX_VALUES``), and ``examples`` of the slowest selected requests (up to ``MAX_EXAMPLES``).
    """
    (found,) = _why_many(
        store, since_ns, until_ns, [selection or Selection()], service=service, model=model,
        resources=resources, attributes=attributes, dimensions=dimensions,
        limit_values=bounded(limit_values, 1, MAX_VALUES),
        examples=bounded(examples, 0, MAX_EXAMPLES), use_rollups=use_rollups,
    )  # fmt: skip
    return found


def _why_many(
    store: Store,
    since_ns: int,
    until_ns: int,
    selections: Sequence[Selection],
    *,
    service: str | None,
    model: str | None,
    resources: Sequence[str],
    attributes: Sequence[str],
    dimensions: Sequence[str] | None,
    limit_values: int,
    examples: int,
    use_rollups: bool,
) -> list[Why]:
    """``why`` for several selections of one window, their dimensions counted in one read."""
    for selection in selections:
        selection.validate()
    if until_ns <= since_ns:
        raise DimensionError(f"empty window: until ({until_ns}) must be after since ({since_ns})")
    qs = [
        selection_query(store, since_ns, until_ns, service, model, s, use_rollups, f"s{j}_")
        for j, s in enumerate(selections)
    ]
    answer_window = Window.of(since_ns, until_ns)
    outs = [_empty(answer_window, s, q) for s, q in zip(selections, qs, strict=True)]
    live = [j for j, q in enumerate(qs) if q is not None]
    if not live:
        return outs
    read = [q for q in qs if q is not None]
    shared = read[0]
    if len({(q.params["lo_ns"], q.params["hi_ns"]) for q in read}) > 1:
        raise ValueError("selections read together must share their window")
    _dimensions(shared, resources, attributes, dimensions)
    step = timeseries.choose_step((until_ns - since_ns) / 1e9)
    shared.params["step_s"] = step
    params = dict(shared.params)
    flags, pops = [], []
    for n, q in enumerate(read):
        q.dims, q.join, q.resources = shared.dims, shared.join, shared.resources
        q.params.update(shared.params | q.params)  # the window's and the dimensions' too
        params.update(q.params)
        flags.append(f"{q.pop} AS p{n}, ({q.pop}) AND ({q.sel}) AS s{n}")
        pops.append(q.pop)
    names = [f"d{i}" for i in range(len(shared.dims))]
    columns = [f"{d[1]} AS {n}" for d, n in zip(shared.dims, names, strict=True)]
    labels = [_label(d[2], f"vals.{i + 1}") for i, d in enumerate(shared.dims)]
    folded = [selections[j].kind != "before" for j in live]
    # Every selection's population: the requests any of them counts.
    where = FILTERS if "1" in pops else f"{FILTERS}\n    AND ({' OR '.join(pops)})"
    population = SelectionQuery(params, where, "1", join=shared.join, resources=shared.resources)
    sql = render(
        _why_sql(folded),
        {
            "FLAGS": ", ".join(flags),
            "DIMS": ", ".join(columns),
            "DIM_NAMES": ", ".join(names),
            "LABELS": ", ".join(labels),
            "DIM_COUNT": str(len(shared.dims)),
            "JOIN": shared.join,
            "ROWS": population.rows(store, ", TraceId" if shared.join else ""),
        },
    )
    rows = store.query_arrow(sql, params).to_pylist()
    for n, (j, q) in enumerate(zip(live, read, strict=True)):
        q.split = population.split
        mine = []
        for r in rows:
            if not (r[f"n_in_{n}"] or r[f"n_out_{n}"]):
                continue  # a value only other selections' populations have
            row = {"d": r["d"], "v": r["v"], "n_in": r[f"n_in_{n}"], "n_out": r[f"n_out_{n}"]}
            for f in _FIGURES:
                row[f"{f}_in"], row[f"{f}_out"] = r[f"{f}_in_{n}"], r[f"{f}_out_{n}"]
            if folded[n]:
                row["since_steps"] = r[f"since_steps_{n}"]
                row["since_counts"] = r[f"since_counts_{n}"]
            mine.append(row)
        outs[j] = _answer(
            store, answer_window, selections[j], q, mine, step, folded[n], limit_values, examples
        )
    return outs


def _sides(
    selection: Selection,
    q: SelectionQuery | None,
    inside: tuple[int, Mapping[str, float]],
    outside: tuple[int, Mapping[str, float]],
) -> tuple[WhySelection, WhyBaseline]:
    """The selection's side and its baseline's: what each is, its count and its means."""
    return (
        side_means(
            *inside,
            WhySelection,
            kind=selection.kind,
            metric=selection.metric,
            description=q.description if q else "no requests in the window",
            threshold_ms=q.threshold_ms if q else None,
        ),
        side_means(*outside, WhyBaseline, description=q.baseline if q else ""),
    )


def _empty(window: Window, selection: Selection, q: SelectionQuery | None) -> Why:
    """The answer before anything is counted (and for a selection empty by construction)."""
    none = (0, dict.fromkeys(_FIGURES, 0.0))
    chosen, baseline = _sides(selection, q, none, none)
    return Why(
        window=window,
        selection=chosen,
        baseline=baseline,
        extra_e2e_ms=None,
        extra_buckets_ms=BucketMeans(**dict.fromkeys(BUCKETS)),
        dominant=None,
        dimensions=[],
        top=None,
        examples=[],
    )


def _answer(
    store: Store,
    window: Window,
    selection: Selection,
    q: SelectionQuery,
    rows: list[dict[str, Any]],
    step: int,
    folded: bool,
    limit_values: int,
    examples: int,
) -> Why:
    """The answer from the selection's (dimension, value) rows."""
    per_dim: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        per_dim.setdefault(int(row["d"]), []).append(row)
    first = per_dim.get(0, [])
    n_in = sum(int(r["n_in"]) for r in first)
    n_out = sum(int(r["n_out"]) for r in first)
    in_sums = {f: float(sum(r[f"{f}_in"] for r in first)) for f in _FIGURES}
    out_sums = {f: float(sum(r[f"{f}_out"] for r in first)) for f in _FIGURES}
    chosen, baseline = _sides(selection, q, (n_in, in_sums), (n_out, out_sums))
    extra, extra_buckets = _extra(n_in, in_sums, n_out, out_sums)
    ranked: list[WhyDimension] = []
    top = None
    found: list[WhyExample] = []
    if n_in and n_out:
        for i, (name, _, _) in enumerate(q.dims):
            values = per_dim.get(i, [])
            if len(values) < 2:
                continue  # one value everywhere: nothing to tell apart
            ranked.append(_rank(name, values, n_in, n_out, out_sums, extra, limit_values))
        ranked.sort(key=lambda d: (-d.score, -(d.values[0].extra_share or 0), d.dimension))
        if ranked and ranked[0].values:
            top = _top(store, q, ranked[0], per_dim, step, folded)
        if examples > 0:
            found = _examples(store, q, examples)
    return Why(
        window=window,
        selection=chosen,
        baseline=baseline,
        extra_e2e_ms=extra,
        extra_buckets_ms=BucketMeans(**extra_buckets),
        dominant=_dominant(extra_buckets),
        dimensions=ranked,
        top=top,
        examples=found,
    )


def _top(
    store: Store,
    q: SelectionQuery,
    head: WhyDimension,
    per_dim: Mapping[int, list[dict[str, Any]]],
    step: int,
    folded: bool,
) -> WhyTop:
    """The top value of the first-ranked dimension ``head``, and since when it shows."""
    top = head.values[0]
    index = next(i for i, d in enumerate(q.dims) if d[0] == head.dimension)
    if folded:
        row = next(r for r in per_dim[index] if str(r["v"]) == top.value)
        steps, counts = row["since_steps"], row["since_counts"]
    else:
        dim = q.dims[index]
        steps, counts = _steps(store, q, _label(dim[2], dim[1]), top.value, step)
    return WhyTop(
        dimension=head.dimension,
        value=top.value,
        score=head.score,
        in_share=top.in_share,
        out_share=top.out_share,
        extra_ms=top.extra_ms,
        dominant=top.dominant,
        since_ns=_since(q, steps, counts, step),
    )


def _examples(store: Store, q: SelectionQuery, examples: int) -> list[WhyExample]:
    """The slowest ``examples`` selected requests."""
    sql = render(EXAMPLES_SQL, {"ROWS": q.rows(store, ", TraceId"), "SEL": q.sel})
    params = q.params | {"examples": int(examples)}  # with the ranges rows() bound
    return [
        WhyExample(
            trace_id=r["trace_id"],
            start_ns=int(r["start_ns"]),
            service=r["service"],
            model=r["model"],
            e2e_ms=ms(r["e2e"]),
        )
        for r in store.query_arrow(sql, params).to_pylist()
    ]


def _dominant(buckets: Mapping[str, float | None]) -> str | None:
    known = {b: v for b, v in buckets.items() if v is not None}
    if not known:
        return None
    best = max(known, key=lambda b: known[b])
    return best if known[best] > 0 else None


def _rank(
    name: str,
    values: list[dict[str, Any]],
    n_in: int,
    n_out: int,
    out_sums: Mapping[str, float],
    extra: float | None,
    limit: int,
) -> WhyDimension:
    """One dimension: its values by over-representation, each with its extra time by bucket."""
    shaped = []
    for r in values:
        vin, vout = int(r["n_in"]), int(r["n_out"])
        in_share, out_share = vin / n_in, vout / n_out
        shaped.append((in_share - out_share, vin, r, in_share, out_share))
    shaped.sort(key=lambda s: (-s[0], -s[1], str(s[2]["v"])))
    score = max(0.0, shaped[0][0])
    listed = []
    # A value absent from the selection carries none of it: only values inside are listed.
    for diff, vin, r, in_share, out_share in [x for x in shaped if x[1]][: max(1, limit)]:
        vout = int(r["n_out"])
        in_sums = {f: float(r[f"{f}_in"]) for f in _FIGURES}
        value_extra, buckets = _extra(vin, in_sums, n_out, out_sums)
        carried = (
            vin * value_extra / (n_in * extra)
            if value_extra is not None and extra and extra > 0
            else None
        )
        listed.append(
            WhyValue(
                value=str(r["v"]),
                in_count=vin,
                out_count=vout,
                in_share=in_share,
                out_share=out_share,
                difference=diff,
                in_e2e_mean_ms=ms(r["e2e_in"] / vin) if vin else None,
                out_e2e_mean_ms=ms(r["e2e_out"] / vout) if vout else None,
                extra_ms=value_extra,
                buckets_ms=BucketMeans(**buckets),
                dominant=_dominant(buckets),
                extra_share=carried,
            )
        )
    return WhyDimension(dimension=name, score=score, values_seen=len(values), values=listed)


def _steps(
    store: Store, q: SelectionQuery, label_sql: str, value: str, step: int
) -> tuple[list[int], list[int]]:
    """The selected requests with ``value`` per step (SINCE_SQL): steps ascending, counts."""
    trace = ", TraceId" if q.join else ""
    sql = render(
        SINCE_SQL,
        {"JOIN": q.join, "ROWS": q.rows(store, trace), "SEL": q.sel, "LABEL": label_sql},
    )
    params = q.params | {"value": value, "step_s": step}  # with the ranges rows() bound
    rows = store.query_rows(sql, params)
    return [int(s) for s, _ in rows], [int(n) for _, n in rows]


def _since(q: SelectionQuery, steps: Sequence[int], counts: Sequence[int], step: int) -> int | None:
    """When the selected requests of a value began (its selected requests per step, ascending):
    the start of the first step holding at least SINCE_FRACTION of the busiest step's."""
    rows = [(int(s), int(n)) for s, n in zip(steps, counts, strict=True) if n]
    if not rows:
        return None
    peak = max(n for _, n in rows)
    first = next(s for s, n in rows if n >= SINCE_FRACTION * peak)
    return max(int(q.params["lo_ns"]), first * step * 10**9)


# -- the SLO's budget, by bucket ------------------------------------------------------------------

#: Bad and good requests and each bucket's sum over both, per ``k``: how many of the windows a
#: request falls in. The windows all end at the same time, so they are nested: with their starts
#: ascending, a request is in the j-th window exactly when it is in at least j of them, and each
#: window's figures are the sums over k >= j (``slo_buckets``). ``$DEPTH`` counts the starts
#: a request is at or after: a few comparisons per request, where an ARRAY JOIN over the windows
#: made a row per request and window and cost more than reading the columns.
SLO_BUDGET_SQL = (
    """
SELECT k, countIf(bad) AS n_bad, countIf(NOT bad) AS n_good, """
    + ", ".join(f"sumIf({f}, bad) AS {f}_bad, sumIf({f}, NOT bad) AS {f}_good" for f in _FIGURES)
    + """
FROM (
    SELECT $DEPTH AS k, v > {threshold:Float64} AS bad, E2eNs AS e2e, """
    + ", ".join(
        f"{'ifNull(NetworkNs, 0)' if col == 'NetworkNs' else col} AS {b}"
        for b, col in BUCKET_COLUMNS.items()
    )
    + """
    FROM (SELECT *, $VALUE AS v FROM ($ROWS))
    WHERE v IS NOT NULL
)
GROUP BY k"""
    + SETTINGS
)


def slo_buckets(
    store: Store,
    *,
    value_sql: str,
    threshold_ms: float,
    windows: Mapping[str, int],
    until_ns: int,
    service: str | None = None,
    model: str | None = None,
) -> dict[str, BudgetSplit]:
    """Where an objective's budget went, per window (name -> start ns, all ending at
    ``until_ns``): the requests that missed it against those that met it, each bucket's mean
    extra time (ms; they add up to ``extra_e2e_ms``), and the ``dominant`` bucket."""
    starts = sorted(int(start) for start in windows.values())
    params: dict[str, Any] = {
        "lo_ns": starts[0],
        "hi_ns": int(until_ns),
        "service": service or "",
        "model": model or "",
        "threshold": float(threshold_ms) * 1e6,
        **{f"start{j}": start for j, start in enumerate(starts)},
    }
    depth = " + ".join(
        f"(Timestamp >= fromUnixTimestamp64Nano({{start{j}:Int64}}))" for j in range(len(starts))
    )
    split = window.raw_ranges(store, [(params["lo_ns"], params["hi_ns"])])
    source = window.raw_rows(split, params, BASE_COLUMNS, FILTERS)
    sql = render(SLO_BUDGET_SQL, {"VALUE": value_sql, "ROWS": source, "DEPTH": depth})
    rows = store.query_arrow(sql, params).to_pylist()
    out = {}
    for name, start in windows.items():
        # In the window: at or after its start, so in at least as many windows as start there.
        depth_of = starts.index(int(start)) + 1
        inside = [r for r in rows if int(r["k"]) >= depth_of]
        n_bad = sum(int(r["n_bad"]) for r in inside)
        n_good = sum(int(r["n_good"]) for r in inside)
        bad = {f: float(sum(int(r[f"{f}_bad"]) for r in inside)) for f in _FIGURES}
        good = {f: float(sum(int(r[f"{f}_good"]) for r in inside)) for f in _FIGURES}
        extra, buckets = _extra(n_bad, bad, n_good, good)
        out[name] = BudgetSplit(
            bad=n_bad,
            good=n_good,
            extra_e2e_ms=extra,
            extra_buckets_ms=BucketMeans(**buckets),
            dominant=_dominant(buckets),
        )
    return out


# -- for the diagnosis ----------------------------------------------------------------------------

#: A value concentrates a problem when its share of the selection exceeds its share of the rest
#: by at least this much (25 points: e.g. 1 pod of 8, 12 % of the traffic, holding 37 % or more
#: of the slowest requests).
CONCENTRATION_MIN = 0.25
#: The selection a verdict's bucket is examined on: its slowest 5 %, the requests the problem
#: shows in, yet enough of them (one in twenty) for the shares to mean something.
CONCENTRATION_PERCENTILE = 95.0


def concentration(
    store: Store,
    *,
    since_ns: int,
    until_ns: int,
    bucket: str,
    service: str | None = None,
    model: str | None = None,
) -> VerdictWhere | None:
    """Where a bucket's problem sits: the dimension value most over-represented among the
    requests with the most time in ``bucket`` (at or above its p95), if it stands out by
    CONCENTRATION_MIN; with ``since_ns``, when those requests began (None otherwise).

    >>> concentration(store, since_ns=t0, until_ns=t1, bucket="queue")  # doctest: +SKIP
    VerdictWhere(dimension='resource.k8s.pod.name', value='llm-7', ..., in_share=0.81, ...)
    """
    found = concentrations(
        store, since_ns=since_ns, until_ns=until_ns, buckets=[bucket], service=service, model=model
    )
    return found[bucket]


def concentrations(
    store: Store,
    *,
    since_ns: int,
    until_ns: int,
    buckets: Sequence[str],
    service: str | None = None,
    model: str | None = None,
) -> dict[str, VerdictWhere | None]:
    """``concentration`` of several buckets (bucket -> answer; None for a name that is not a
    bucket), their selections counted in one read of the window."""
    wanted = [b for b in dict.fromkeys(buckets) if b in BUCKETS]
    out: dict[str, VerdictWhere | None] = dict.fromkeys(buckets)
    if not wanted:
        return out
    selections = [
        Selection("percentile", metric=b, percentile=CONCENTRATION_PERCENTILE) for b in wanted
    ]
    found = _why_many(
        store, since_ns, until_ns, selections, service=service, model=model, resources=(),
        attributes=(), dimensions=None, limit_values=1, examples=0, use_rollups=True,
    )  # fmt: skip
    for bucket, answer in zip(wanted, found, strict=True):
        top = answer.top
        if top is None or top.score < CONCENTRATION_MIN:
            continue
        out[bucket] = VerdictWhere(
            dimension=top.dimension,
            value=top.value,
            selection=answer.selection.description,
            in_share=top.in_share,
            out_share=top.out_share,
            extra_ms=top.extra_ms,
            since_ns=top.since_ns,
        )
    return out
