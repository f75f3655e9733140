"""Which requests of a window are "inside" for ``why`` (``Selection``): those at or above a
percentile of e2e (or of a bucket, TTFT, TPOT), an SLO's bad requests, a region of the latency
heatmap, or the whole window against the window just before it; and the SQL pieces of one such
question (``SelectionQuery``): the population, the selection, the dimensions ranked over them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from latscope.attribution import rollups
from latscope.attribution.answers import window
from latscope.attribution.answers.common import FILTERS, SETTINGS
from latscope.attribution.answers.errors import DimensionError
from latscope.attribution.rollups import KEY_STRIDE, METRICS, ROLLUP_TABLE
from latscope.attribution.table import BUCKET_COLUMN_LIST
from latscope.semconv import BUCKETS
from latscope.sqltext import render
from latscope.storage import Store

#: Built-in dimensions: name -> (SQL per request, SQL turning that into the value's label, on
#: ``$V``). Token counts are power-of-two bands ("1024-2047", below 16 one band, unknown apart),
#: kept as the band's exponent until the labels are made on a few rows.
_TOKEN_BAND = (
    "multiIf(isNull($COL), toUInt8(255), $COL < 16, toUInt8(0), toUInt8(floor(log2($COL))))"
)
_BAND_LABEL = (
    "multiIf($V = 255, 'unknown', $V = 0, '0-15', concat(toString(bitShiftLeft(toUInt64(1), "
    "$V)), '-', toString(bitShiftLeft(toUInt64(1), $V + 1) - 1)))"
)
DIMENSIONS: dict[str, tuple[str, str]] = {
    "service": ("ServiceName", "toString($V)"),
    "model": ("Model", "toString($V)"),
    "route": ("Route", "toString($V)"),
    "operation": ("Operation", "toString($V)"),
    "status": ("StatusCode", "toString($V)"),
    "attempts": ("least(Attempts, 3)", "if($V >= 3, '3+', toString($V))"),
    "input_tokens": (render(_TOKEN_BAND, {"COL": "InputTokens"}), _BAND_LABEL),
    "output_tokens": (render(_TOKEN_BAND, {"COL": "OutputTokens"}), _BAND_LABEL),
}
#: Resource attributes ranked by default (``resource.<key>``): where a request ran.
DEFAULT_RESOURCE_KEYS = (
    "service.instance.id",
    "k8s.pod.name",
    "k8s.node.name",
    "host.name",
    "cloud.availability_zone",
    "cloud.region",
    "service.version",
)
MAX_EXTRA_DIMENSIONS = 16

#: Figures a selection can be made on: name -> SQL (network null without a client span, TTFT
#: the client's where seen, else the server's).
SELECT_METRICS: dict[str, str] = {name: METRICS[name] for name in ("e2e", *BUCKETS, "ttft", "tpot")}
SELECTION_KINDS = ("percentile", "region", "slo", "before")


#: Columns every read of requests takes (the figures, and what selections are made on).
BASE_COLUMNS = (
    f"Timestamp, E2eNs, {BUCKET_COLUMN_LIST}, TtftClientNs, TtftServerNs, TpotNs, "
    "ServiceName, Model, Route, Operation, "
    "StatusCode, Attempts, InputTokens, OutputTokens"
)


@dataclass(frozen=True)
class Selection:
    """Which requests of the window are "inside".

    * ``percentile``: ``metric`` at or above its ``percentile`` (the lower edge of the 1 % bin
      holding that request, as ``tail`` draws it);
    * ``region``: started in ``[since_ns, until_ns)`` (default: the whole window) with ``metric``
      in ``[min_ms, max_ms)`` (a rectangle of the heatmap);
    * ``slo``: ``metric`` above ``threshold_ms`` (an objective's bad requests);
    * ``before``: the whole window, against the window of the same length just before it.

    >>> Selection("percentile", percentile=99).validate()
    >>> Selection("slo", metric="ttft", threshold_ms=500).validate()
    """

    kind: str = "percentile"
    metric: str = "e2e"
    percentile: float = 99.0
    since_ns: int | None = None
    until_ns: int | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    threshold_ms: float | None = None

    def validate(self) -> None:
        if self.kind not in SELECTION_KINDS:
            raise DimensionError(
                f"selection {self.kind!r}: use one of {', '.join(SELECTION_KINDS)}"
            )
        if self.metric not in SELECT_METRICS:
            raise DimensionError(f"metric {self.metric!r}: use one of {', '.join(SELECT_METRICS)}")
        if self.kind == "percentile" and not 0 < self.percentile < 100:
            raise DimensionError(f"percentile must be between 0 and 100, got {self.percentile}")
        if self.kind == "slo" and (self.threshold_ms is None or self.threshold_ms <= 0):
            raise DimensionError("an slo selection needs a positive threshold_ms")
        if self.kind == "region":
            lo, hi = self.min_ms, self.max_ms
            if (lo is not None and lo < 0) or (hi is not None and hi <= 0):
                raise DimensionError("a region's min_ms must be >= 0 and max_ms > 0")
            if lo is not None and hi is not None and hi <= lo:
                raise DimensionError("a region's max_ms must be above its min_ms")
            if (
                self.since_ns is not None
                and self.until_ns is not None
                and self.until_ns <= self.since_ns
            ):
                raise DimensionError("a region's until must be after its since")


@dataclass
class SelectionQuery:
    """The SQL pieces of one question: the population (its time range ``lo_ns``..``hi_ns`` in
    ``params`` and the other conditions in ``where``), the selection (``sel``), the dimensions
    (name, SQL per request, label SQL on ``$V``) and the span-attribute join."""

    params: dict[str, Any]
    where: str
    sel: str
    #: The population's condition beyond the window and FILTERS (``where`` holds it too).
    pop: str = "1"
    dims: list[tuple[str, str, str]] = field(default_factory=list)
    join: str = ""
    description: str = ""
    baseline: str = ""
    threshold_ms: float | None = None
    resources: bool = False
    split: window.RawRanges | None = None

    def rows(self, store: Store, extra: str = "") -> str:
        """The population's requests (the columns it needs), read as ``window.raw_ranges``
        says: hours known clean as stored, the others with FINAL."""
        if self.split is None:
            self.split = window.raw_ranges(store, [(self.params["lo_ns"], self.params["hi_ns"])])
        split = self.split
        columns = BASE_COLUMNS + (", ResourceAttributes" if self.resources else "") + extra
        return window.raw_rows(split, self.params, columns, self.where)


# -- the selection --------------------------------------------------------------------------------

#: The histogram of one figure over a window: rollup rows of its usable hours and raw reads of
#: the rest, for the percentile a selection starts at.
_THRESHOLD_SQL = (
    """
SELECT bin, sum(c) AS c FROM ($SOURCES) GROUP BY bin ORDER BY bin"""
    + SETTINGS
)
_THRESHOLD_ROLLUP = (
    f"SELECT key % {KEY_STRIDE} AS bin, c FROM {ROLLUP_TABLE} "
    "ARRAY JOIN HistKeys AS key, HistCounts AS c "
    f"WHERE $ROLLUP_WHERE AND intDiv(key, {KEY_STRIDE}) = {{metric_index:UInt16}}"
)
#: ``$VALUE``: the figure's expression (``SELECT_METRICS``), ``$BIN`` its bin.
_THRESHOLD_RAW = (
    "SELECT $BIN AS bin, count() AS c FROM $FROM "
    "WHERE $RANGES AND " + FILTERS + " AND $VALUE IS NOT NULL GROUP BY bin"
)


def threshold_ns(
    store: Store,
    since_ns: int,
    until_ns: int,
    service: str | None,
    model: str | None,
    metric: str,
    q: float,
    use_rollups: bool,
) -> float | None:
    """The lower edge of the 1 %-wide bin holding the ``q``-quantile request (None: no data)."""
    # Steps of an hour: every usable rollup hour inside the window is read from the rollup.
    read = window.prepare(
        store,
        since_ns,
        until_ns,
        step_s=rollups.HOUR_S,
        params={"service": service or "", "model": model or ""},
        wanted=[name for name, v in (("service", service), ("model", model)) if v],
        use_rollups=use_rollups,
    )
    expr = METRICS[metric]
    read.params["metric_index"] = list(METRICS).index(metric)
    metric_sql = {"BIN": rollups.bin_sql(f"assumeNotNull({expr})"), "VALUE": expr}
    sources = window.sources(read, _THRESHOLD_ROLLUP, _THRESHOLD_RAW, fragments=metric_sql)
    rows = store.query_rows(render(_THRESHOLD_SQL, {"SOURCES": sources}), read.params)
    bins, counts = [int(r[0]) for r in rows], [int(r[1]) for r in rows]
    if not counts or not sum(counts):
        return None
    return rollups.bin_floor(rollups.bin_of_rank(bins, counts, q, upper=False))


def selection_query(
    store: Store,
    since_ns: int,
    until_ns: int,
    service: str | None,
    model: str | None,
    selection: Selection,
    use_rollups: bool,
    prefix: str = "",
) -> SelectionQuery | None:
    """Population and selection as SQL; None when the selection is empty by construction. The
    selection's own parameters (a threshold, a region's edges) are named with ``prefix``, so several
    selections can share one read."""
    params: dict[str, Any] = {
        "lo_ns": int(since_ns),
        "hi_ns": int(until_ns),
        "service": service or "",
        "model": model or "",
    }
    value = SELECT_METRICS[selection.metric]
    population = FILTERS
    kind = selection.kind
    if kind == "percentile":
        q = selection.percentile / 100
        threshold = threshold_ns(
            store, since_ns, until_ns, service, model, selection.metric, q, use_rollups
        )
        if threshold is None:
            return None
        params[prefix + "threshold"] = float(threshold)
        return SelectionQuery(
            params,
            f"{population}\n    AND {value} IS NOT NULL",
            f"{value} >= {{{prefix}threshold:Float64}}",
            f"{value} IS NOT NULL",
            description=(
                f"{selection.metric} at or above p{selection.percentile:g} "
                f"({threshold / 1e6:.1f} ms)"
            ),
            baseline=f"the window's other requests (below {threshold / 1e6:.1f} ms)",
            threshold_ms=threshold / 1e6,
        )
    if kind == "slo":
        params[prefix + "threshold"] = float(selection.threshold_ms or 0) * 1e6
        return SelectionQuery(
            params,
            f"{population}\n    AND {value} IS NOT NULL",
            f"{value} > {{{prefix}threshold:Float64}}",
            f"{value} IS NOT NULL",
            description=f"{selection.metric} above {selection.threshold_ms:g} ms (missed the SLO)",
            baseline="the window's requests that met it",
            threshold_ms=selection.threshold_ms,
        )
    if kind == "before":
        length = until_ns - since_ns
        params["lo_ns"] = int(since_ns - length)
        params[prefix + "sel_from"] = int(since_ns)
        return SelectionQuery(
            params,
            population,
            f"Timestamp >= fromUnixTimestamp64Nano({{{prefix}sel_from:Int64}})",
            description="the window's requests",
            baseline="the requests of the window of the same length just before it",
        )
    # region: a rectangle of the heatmap
    terms = []
    lo = max(since_ns, selection.since_ns if selection.since_ns is not None else since_ns)
    hi = min(until_ns, selection.until_ns if selection.until_ns is not None else until_ns)
    if hi <= lo:
        raise DimensionError("the region lies outside the window: widen since/until")
    params[prefix + "sel_lo"], params[prefix + "sel_hi"] = int(lo), int(hi)
    terms.append(
        f"Timestamp >= fromUnixTimestamp64Nano({{{prefix}sel_lo:Int64}}) "
        f"AND Timestamp < fromUnixTimestamp64Nano({{{prefix}sel_hi:Int64}})"
    )
    text = [f"started in the region's {(hi - lo) / 1e9:g} s"]
    if selection.min_ms is not None:
        params[prefix + "min_ns"] = float(selection.min_ms) * 1e6
        terms.append(f"{value} >= {{{prefix}min_ns:Float64}}")
        text.append(f"{selection.metric} >= {selection.min_ms:g} ms")
    if selection.max_ms is not None:
        params[prefix + "max_ns"] = float(selection.max_ms) * 1e6
        terms.append(f"{value} < {{{prefix}max_ns:Float64}}")
        text.append(f"{selection.metric} < {selection.max_ms:g} ms")
    bounded = selection.min_ms is not None or selection.max_ms is not None
    return SelectionQuery(
        params,
        population + (f"\n    AND {value} IS NOT NULL" if bounded else ""),
        "(" + " AND ".join(terms) + ")",
        f"{value} IS NOT NULL" if bounded else "1",
        description=", ".join(text),
        baseline="the window's other requests",
    )
