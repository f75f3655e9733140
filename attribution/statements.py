"""The continuous attributor's SQL (``Statements``) for one spans table, attribution table and
shard: how a pass finds its slice and cuts it into batches, the batch of trace ids each statement
attributes (settled traces, an early window's complete ones, traces retried by id), the two
``INSERT ... SELECT`` paths over a batch (``attribution/sql/``), how many rows they wrote, and the
tombstones of keys that moved. ``latscope.attribution.attributor`` runs them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from latscope.attribution import rules
from latscope.attribution.engine import LATENCY_KEYS
from latscope.attribution.sql import (
    NO_JIT,
    attribution_select,
    literal,
    rule_reads,
    simple_select,
)
from latscope.attribution.sql.engines import EngineSql
from latscope.attribution.sql.expressions import fact
from latscope.attribution.table import ATTRIBUTION_SCHEMA
from latscope.semconv import SpanKind
from latscope.storage import RESOURCES_TABLE

#: Table names on a cluster node, for an attributor that works on its shard alone.
LOCAL_SUFFIX = "_local"
#: The most batches a slice is cut into: the rows of each but the last record a time within
#: this many us after the slice's start (the attributor's ``_plan``), and a restart resumes this
#: far back.
MAX_CUTS = 1000

#: Settings of the attributor's inserts. A statement writes one row per request key (rows and
#: tombstones alike), so ReplacingMergeTree has nothing to collapse inside one insert, and its
#: collapsing pass over the sorted block, which would find nothing, is skipped.
INSERT_SETTINGS = "SETTINGS optimize_on_insert = 0"


def _no_jit(sql: str) -> str:
    """``sql`` with JIT compilation off, as the attribution statements have it
    (``latscope.attribution.sql.NO_JIT``): these run every pass, and what compiling them cost
    was not won back."""
    return f"{sql}\nSETTINGS {NO_JIT}"


def _list(values: Iterable[str]) -> str:
    return ", ".join(literal(v) for v in values)


def _spellings(kind: str) -> list[str]:
    """A span kind in every spelling the spans table may hold (older exporters' SPAN_KIND_*)."""
    return [kind, *(k for k, v in SpanKind.LEGACY.items() if v == kind)]


_SERVER_KINDS = _spellings(SpanKind.SERVER)
_CLIENT_KINDS = _spellings(SpanKind.CLIENT)


def _early_traces(window: str, spans: str, mine: str, ids: str) -> str:
    """The traces with ids in the batch's range (``ids``) that have spans in the early ``window``
    and none after it (one row per span)."""
    return f"""
SELECT TraceId FROM {spans}
WHERE {window} {mine} AND {ids}
  AND TraceId NOT IN (
      SELECT TraceId FROM {spans}
      WHERE LatscopeIngestedAt > fromUnixTimestamp64Micro({{early_hi_us:Int64}}))"""


def _versions(settled: str, table: str, bounds: str) -> str:
    """The live rows' (trace, Version) of the traces of ``settled``."""
    return f"""
SELECT TraceId, Version FROM {table}
WHERE TraceId IN ({settled}) AND {bounds} AND IsDeleted = 0"""


class _EarlyBatch(NamedTuple):
    """A batch with early attribution on, two ways (``_early_batch``): ``exact``, its trace ids;
    ``simple`` and ``check``, a superset of them and the ``trace_check`` (``simple_select``) that
    keeps exactly those, for the single-call path."""

    exact: str
    simple: str
    check: str


def _early_batch(
    settled: str,
    window: str,
    spans: str,
    table: str,
    mine: str,
    bounds: str,
    ids: str,
    *,
    versioned: bool,
) -> _EarlyBatch:
    """The batch with early attribution on: the settled traces (``settled``) that changed since
    they were attributed (``versioned``; else all of them), and the complete traces of the early
    window, of the batch's range of trace ids (``ids``).

    A trace of the early window is taken when none of its spans came after the window and its
    span tree is complete: a root, every parent stored, every CLIENT span with a child (the
    server it called reports no span yet otherwise). Nothing is lost when the guess is wrong: a
    span that comes later is after the watermark, and its trace is attributed again.

    A settled trace is taken unless it has a live row whose Version (the count of distinct spans
    it was attributed from) is its count of distinct spans now: a trace attributed early and
    unchanged since is not attributed twice, and one that got a span meanwhile is, including a
    span whose insert was still in flight when the early pass read (stored with an ingest time
    inside a window already passed). So the settle window stays the margin for such inserts.

    The single-call path takes a superset (the settled traces and the early window's, unchecked)
    and the same tests over the aggregates of its GROUP BY: the spans of those traces are read and
    grouped once, by the statement, not a second time to find its batch. There an early trace's
    tree is tested on the spans' id hashes (``id_hashes``, as the path counts its spans): a
    collision can only find a missing parent stored, and take a trace early whose span is still
    to come, which is then attributed again when it comes, as when any guess of completeness is
    wrong. Its count of distinct spans is the path's ``n``, which is the Version its row gets. A
    trace that check keeps that the exact batch would not is only such a collision; the traces it
    drops are left to the general path, which takes the exact batch."""
    early = _early_traces(window, spans, mine, ids)
    versions = _versions(settled, table, bounds)
    settled_part = (
        f"""
SELECT trace_id FROM (
    SELECT TraceId AS trace_id, toUInt64(uniqExact(SpanId)) AS n FROM {spans}
    WHERE TraceId IN ({settled}) AND {bounds}
    GROUP BY TraceId)
WHERE (trace_id, n) NOT IN ({versions})"""
        if versioned
        else settled
    )
    # Completeness by the sizes of sets (hashed), not a lambda per span: a lambda that reads
    # another array of the row (``has(ids, p)``) gets a copy of it for every element, n² memory
    # for a trace of n spans (15 GB at 20,000).
    exact = f"""
{settled_part}
UNION ALL
SELECT trace_id FROM (
    SELECT TraceId AS trace_id,
           groupArray(SpanId) AS ids,
           groupArray(ParentSpanId) AS parents,
           groupArrayIf(SpanId, SpanKind IN ({_list(_CLIENT_KINDS)})) AS clients
    FROM {spans}
    WHERE TraceId IN ({early})
      AND {bounds}
    GROUP BY TraceId)
WHERE has(parents, '')
  AND length(arrayDistinct(arrayConcat(ids, [''], parents)))
      = length(arrayDistinct(arrayConcat(ids, [''])))
  AND length(arrayDistinct(arrayConcat(parents, clients))) = length(arrayDistinct(parents))"""
    # The same tests in the single-call path's HAVING, over its aggregates.
    parents = "groupArrayIf(cityHash64(parent_id), parent_id != '')"
    clients = "arrayMap(i -> cityHash64(i), client_ids)"
    complete = (
        f"countIf(parent_id = '') > 0"
        f" AND length(arrayDistinct(arrayConcat(id_hashes, {parents}))) = n"
        f" AND length(arrayDistinct(arrayConcat({parents}, {clients})))"
        f" = length(arrayDistinct({parents}))"
    )
    unchanged = f"(trace_id, toUInt64(n)) NOT IN ({versions})" if versioned else "1"
    return _EarlyBatch(
        exact,
        f"{settled}\nUNION ALL{early}",
        f"AND if(trace_id IN ({early}), {complete}, {unchanged})",
    )


def _count_with_call(traces: str, spans: str, bounds: str) -> str:
    """How many of ``traces`` (a query of trace ids) have a span within ``bounds`` that could be
    a call's server (SERVER, a gen_ai.latency.* key, or the request span of an engine of the
    rulebook that needs neither: TGI's INTERNAL handler): a trace with none has no call. The
    attributes are read as stage 0 reads them (``rule_reads``), never the whole SpanAttributes:
    under Exports of prompt-sized spans that read asked the embedded engine for a gigabyte."""
    engines = EngineSql(rules.active())
    attr, rule_values = rule_reads()
    kind = (
        f"multiIf(span_kind IN ({_list(_SERVER_KINDS)}), 'server', "
        f"span_kind IN ({_list(_CLIENT_KINDS)}), 'client', 'internal')"
    )
    others = engines.without_latency_key(set(LATENCY_KEYS))
    engine = engines.engine_code(attr, "name", kind, others)
    return f"""
SELECT count() FROM (
    SELECT DISTINCT trace_id FROM (
        SELECT TraceId AS trace_id, SpanKind AS span_kind, SpanName AS name,
               LatscopeFacts AS facts, LatscopeRuleAttributes.keys AS codes,
               LatscopeRuleAttributes.values AS vals, {rule_values} AS rule_vals
        FROM {spans}
        WHERE TraceId IN ({traces}) AND {bounds})
    WHERE span_kind IN ({_list(_SERVER_KINDS)}) OR {fact("LATENCY_KEY")} OR {engine} != 0)"""


class Statements:
    """The attributor's SQL for one spans table, attribution table and shard."""

    def __init__(
        self,
        spans: str,
        table: str,
        shard: tuple[int, int],
        *,
        early: bool,
        versioned: bool = True,
        stored_figures: bool = True,
        retry: bool = False,
    ) -> None:
        self.early = early
        mine = (
            "AND cityHash64(TraceId) % {shard_count:UInt64} = {shard_index:UInt64}"
            if shard[1] > 1
            else ""
        )
        slice_ = (
            "LatscopeIngestedAt > fromUnixTimestamp64Micro({after_us:Int64}) "
            "AND LatscopeIngestedAt <= fromUnixTimestamp64Micro({%s:Int64})"
        )
        # Traces still receiving spans (any after the settled bound) wait: they come back with
        # those spans.
        settled = (
            f"TraceId NOT IN (SELECT TraceId FROM {spans} "
            "WHERE LatscopeIngestedAt > fromUnixTimestamp64Micro({settled_us:Int64}))"
        )
        ids = "TraceId >= {id_lo:String} AND ({id_hi:String} = '' OR TraceId < {id_hi:String})"
        #: Where the watermark restarts after a restart (less MAX_CUTS, _resume).
        self.resume = _no_jit(
            f"SELECT toUnixTimestamp64Micro(max(SpansIngestedAt)) FROM {table} WHERE 1 {mine}"
        )
        #: The first and last start of the rows with a marker, and how many (``_mend_moved``).
        self.marked = _no_jit(f"""
SELECT toUnixTimestamp64Nano(min(Timestamp)), toUnixTimestamp64Nano(max(Timestamp)), count()
FROM {table}
WHERE SpansIngestedAt = fromUnixTimestamp64Micro({{through_us:Int64}}) {mine}""")
        #: The SpansIngestedAt values within MAX_CUTS us after where a restart resumes.
        self.markers = _no_jit(f"""
SELECT DISTINCT toUnixTimestamp64Micro(SpansIngestedAt) FROM {table}
WHERE SpansIngestedAt > fromUnixTimestamp64Micro({{after_us:Int64}})
  AND SpansIngestedAt < fromUnixTimestamp64Micro({{after_us:Int64}} + {MAX_CUTS}) {mine}""")
        early_window = (
            "LatscopeIngestedAt > fromUnixTimestamp64Micro({early_lo_us:Int64}) "
            "AND LatscopeIngestedAt <= fromUnixTimestamp64Micro({early_hi_us:Int64})"
        )
        # A span's end (ns): a pass's reach runs to the last end of its slice's spans.
        span_end = "toUnixTimestamp64Nano(Timestamp) + toInt64(Duration)"
        # (``$WHERE``: which spans' traces it cuts)
        plan = f"""
SELECT n, first_ns, last_ns, arrayMap(i -> ids[i + 1], starts), starts, unnamed FROM (
    SELECT n, first_ns, last_ns, ids, unnamed,
        arrayFilter((i, d) -> d != 0, range(n), arrayDifference(arrayMap(
            (through, weight) -> intDiv(through - weight, share), arrayCumSum(weights), weights)))
            AS starts
    FROM (
        SELECT *,
            least(greatest(intDiv(total + capacity - 1, capacity), 1),
                {{max_batches:UInt64}}) AS k,
            greatest(intDiv(total + k - 1, k), 1) AS share
        FROM (
            SELECT length(pairs) AS n, first_ns, last_ns, unnamed, arrayMap(p -> p.1, pairs) AS ids,
                arrayMap(p -> greatest(p.2 * {{batch_traces:UInt64}}, {{batch_spans:UInt64}}),
                    pairs) AS weights,
                arraySum(weights) AS total,
                {{batch_spans:UInt64}} * {{batch_traces:UInt64}} AS capacity
            FROM (
                SELECT min(first) AS first_ns, max(last) AS last_ns, sum(unnamed) AS unnamed,
                       arraySort(p -> p.1, groupArray((TraceId, spans))) AS pairs
                FROM (
                    SELECT TraceId, toUnixTimestamp64Nano(min(Timestamp)) AS first,
                           max({span_end}) AS last, count() AS spans,
                           countIf(LatscopeResourceId = 0) AS unnamed
                    FROM {spans}
                    WHERE $WHERE
                    GROUP BY TraceId)))))"""
        #: The slice's settled traces: how many, their spans' first start and last end in it
        #: (a late root's children start anywhere inside it), and where they are cut into
        #: batches in the spans table's sort order (``_plan``): the trace ids that start each
        #: batch but the first, and their positions among the slice's traces. Each trace weighs
        #: max(its spans * batch_traces, batch_spans): a batch's capacity, batch_spans *
        #: batch_traces, holds batch_traces traces of up to batch_spans / batch_traces spans, or
        #: batch_spans spans of bigger ones. The slice goes in the fewest batches of that
        #: capacity (at most ``max_batches``), evenly by weight: a batch is the traces whose
        #: weight before them falls in its share. So a batch holds at most batch_traces traces
        #: and fewer than batch_spans spans before its last trace (with more than max_batches
        #: batches' worth, more). Last, how many of the slice's spans have no resource id
        #: (``insert_simple_ids``).
        self.plan = _no_jit(plan.replace("$WHERE", f"{slice_ % 'upto_us'} {mine} AND {settled}"))
        #: The same over the slice's settled traces and the early window's traces (complete or
        #: not) together: a quiet pass's batches each take the window's traces of their range.
        self.plan_early = _no_jit(
            plan.replace(
                "$WHERE", f"(({slice_ % 'upto_us'} AND {settled}) OR {early_window}) {mine}"
            )
        )
        #: The spans after the watermark: the oldest (after an empty slice, to skip idle time)
        #: and how many.
        self.after = _no_jit(f"""
SELECT toUnixTimestamp64Micro(min(LatscopeIngestedAt)), count()
FROM {spans}
WHERE LatscopeIngestedAt > fromUnixTimestamp64Micro({{after_us:Int64}}) {mine}""")
        #: When the newest span after the watermark came (us, on the store's clock), whether
        #: there is one, and how many were stored after ``since_us`` (the last early window's
        #: end): after a pass with work (when will it settle), and between passes (has ingest
        #: paused).
        self.quiet = _no_jit(f"""
SELECT toUnixTimestamp64Micro(max(LatscopeIngestedAt)), count() > 0,
    countIf(LatscopeIngestedAt > fromUnixTimestamp64Micro({{since_us:Int64}}))
FROM {spans}
WHERE LatscopeIngestedAt > fromUnixTimestamp64Micro({{after_us:Int64}}) {mine}""")
        # A batch: the settled traces of the slice in a range of trace ids.
        batch = (
            f"SELECT DISTINCT TraceId AS trace_id FROM {spans} "
            f"WHERE {slice_ % 'hi_us'} {mine} AND {ids} AND {settled}"
        )
        #: The batch's trace ids in order, to cut a batch that failed (``_isolate``).
        self.batch_ids = _no_jit(f"SELECT trace_id FROM ({batch}) ORDER BY trace_id")
        if retry:
            # Traces set aside after a pass failed on them, by id (``_retry``).
            batch = (
                f"SELECT DISTINCT TraceId AS trace_id FROM {spans} "
                f"WHERE has({{retry_ids:Array(String)}}, TraceId) {mine}"
            )
        bounds = (
            "Timestamp >= fromUnixTimestamp64Nano({from_ns:Int64}) "
            "AND Timestamp <= fromUnixTimestamp64Nano({to_ns:Int64})"
        )
        #: How many spans of this shard the early window holds, their first start and last end,
        #: and how many have no resource id.
        self.early_spans = _no_jit(f"""
SELECT count(), toUnixTimestamp64Nano(min(Timestamp)), max({span_end}),
       countIf(LatscopeResourceId = 0)
FROM {spans}
WHERE {early_window} {mine}""")
        simple_batch, trace_check = batch, ""
        if early:
            batch, simple_batch, trace_check = _early_batch(
                batch, early_window, spans, table, mine, bounds, ids, versioned=versioned
            )
        columns = ", ".join(ATTRIBUTION_SCHEMA.names)
        into = f"INSERT INTO {table} ({columns}) {INSERT_SETTINGS}\n"
        # The rows this pass wrote: the only rows with its SpansIngestedAt (every pass of this
        # shard records a later one), so they are found without evaluating the batch again.
        written_traces = (
            f"SELECT TraceId FROM {table} WHERE {bounds} {mine} "
            "AND SpansIngestedAt = fromUnixTimestamp64Micro({through_us:Int64})"
        )
        #: The single-call path over the batch (attribution/sql/simple_*.sql): one row per trace
        #: of the common shape, none for the others.
        self.insert_simple = into + simple_select(
            simple_batch, spans, bounds, stored_figures, trace_check=trace_check
        )
        #: The same, for a batch whose slice has every span's resource id: the server span's
        #: resource is carried as its id and its attributes looked up after the GROUP BY
        #: (deploy/clickhouse/012_resource_ids.sql). A trace whose resource is not found there
        #: is left to the general path.
        self.insert_simple_ids = into + simple_select(
            simple_batch,
            spans,
            bounds,
            stored_figures,
            resource_ids=True,
            # On a cluster node's local tables, its own copy (every node holds them all).
            resources_table=RESOURCES_TABLE
            + (LOCAL_SUFFIX if spans.endswith(LOCAL_SUFFIX) else ""),
            trace_check=trace_check,
        )
        # The batch's traces left without a row, less those given to the reference engine.
        skip = "NOT has({skip_ids:Array(String)}, %s)"
        left = (
            f"SELECT trace_id FROM ({batch}) WHERE trace_id NOT IN ({written_traces}) "
            f"AND {skip % 'trace_id'}"
            if early
            else f"{batch} AND TraceId NOT IN ({written_traces}) AND {skip % 'TraceId'}"
        )
        #: The batch's traces left that have a span that could be a call's server (SERVER, or a
        #: gen_ai.latency.* figure): a trace with none has no call.
        self.count_left = _no_jit(_count_with_call(left, spans, bounds))
        #: The batch's traces left with at least ``reference_spans`` spans, and how many each:
        #: too wide for the general path (``insert``), whose memory grows with the square of a
        #: trace's spans; the attributor gives them to the reference engine.
        self.wide_left = _no_jit(f"""
SELECT TraceId, count() FROM {spans}
WHERE TraceId IN ({left}) AND {bounds}
GROUP BY TraceId HAVING count() >= {{reference_spans:UInt64}}
ORDER BY TraceId""")
        #: A quiet pass's batch without the Version check: a superset of those traces, the
        #: slice's settled traces and the early window's, complete or not. When it has none,
        #: count_left, which evaluates the tree check again, is skipped (a quiet pass over
        #: 200,000 requests: 0.34-0.44 CPU s for count_left, 0.13-0.14 for this). With the
        #: Version check it would hold every unchanged trace skipped, so count_left goes alone.
        superset = (
            f"SELECT TraceId FROM {spans} "
            f"WHERE (({slice_ % 'hi_us'} AND {settled}) OR {early_window}) AND {ids} {mine} "
            f"AND TraceId NOT IN ({written_traces})"
        )
        self.count_left_superset = (
            _no_jit(_count_with_call(superset, spans, bounds)) if early and not versioned else None
        )
        #: Every rule (attribution/sql/0*.sql) over those traces.
        self.insert = into + attribution_select(left, spans, bounds)
        written_now = f"""
SELECT TraceId, RequestSpanId, ServiceName, Model, toStartOfHour(Timestamp) AS hour, Version
FROM {table}
WHERE {bounds} {mine}
  AND SpansIngestedAt = fromUnixTimestamp64Micro({{through_us:Int64}}) AND IsDeleted = 0"""
        # Keys of this pass's traces written before this pass whose newest row is live and that
        # this pass did not write again: they moved, and get a tombstone with the trace's new
        # Version (the newest wins under FINAL, the tombstone deletes).
        moved = f"""
WITH new AS ({written_now}),
old AS (
    SELECT TraceId, RequestSpanId, ServiceName, Model, Timestamp
    FROM {table}
    WHERE TraceId IN (SELECT TraceId FROM new) AND {bounds}
    GROUP BY TraceId, RequestSpanId, ServiceName, Model, Timestamp
    HAVING argMax(IsDeleted, (Version, SpansIngestedAt)) = 0
       AND max(SpansIngestedAt) != fromUnixTimestamp64Micro({{through_us:Int64}})
)
SELECT old.Timestamp, old.TraceId, old.RequestSpanId, old.ServiceName, old.Model, v.Version
FROM old
INNER JOIN (SELECT TraceId, max(Version) AS Version FROM new GROUP BY TraceId) AS v
    ON old.TraceId = v.TraceId
WHERE (old.TraceId, old.RequestSpanId, old.ServiceName, old.Model, toStartOfHour(old.Timestamp))
    NOT IN (SELECT TraceId, RequestSpanId, ServiceName, Model, hour FROM new)"""
        older = f"""
    (SELECT count() FROM {table}
     WHERE TraceId IN (SELECT TraceId FROM new) AND {bounds}
       AND SpansIngestedAt != fromUnixTimestamp64Micro({{through_us:Int64}}))"""
        #: Rows written by this pass, the traces they are of, and rows of its traces from
        #: earlier passes (none: nothing can have moved).
        self.count_written = _no_jit(f"""
WITH new AS ({written_now})
SELECT (SELECT count() FROM new), (SELECT uniqExact(TraceId) FROM new), {older}""")
        #: count_written after the single-call path alone, which writes one row per trace: the
        #: rows are the traces (its distinct count was a fifth of this statement's cost).
        self.count_simple = _no_jit(f"""
WITH new AS ({written_now})
SELECT (SELECT count() FROM new) AS rows, rows, {older}""")
        self.count_moved = _no_jit(f"SELECT count() FROM ({moved})")
        self.tombstones = (
            f"INSERT INTO {table} (Timestamp, TraceId, RequestSpanId, ServiceName, Model, "
            f"Version, IsDeleted, SpansIngestedAt) {INSERT_SETTINGS}\n"
            + _no_jit(f"SELECT *, 1, fromUnixTimestamp64Micro({{through_us:Int64}}) FROM ({moved})")
        )
