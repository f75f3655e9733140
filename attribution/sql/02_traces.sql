-- Stage 2: one row per trace, its spans as parallel arrays (index i = one span, in no particular
-- order: every choice below that depends on order names its own sort key; groupArray skips NULLs,
-- so a nullable column goes through $NULLABLE_ARRAY to stay aligned), and the relations of the
-- rules computed over them: ancestors, phase owners, inference spans and their clients.
-- Each SELECT reads the columns of the one before: an expression never reads an alias of its own
-- SELECT that is expensive, because ClickHouse's analyzer copies an alias into every place that
-- reads it (and the statement's analysis, not its execution, would dominate a small batch).
trace_arrays AS (
    SELECT
        trace_id,
        groupArray(span_id) AS ids,
        groupArray(parent_id) AS parents,
        groupArray(kind) AS kinds,
        groupArray(service) AS services,
        groupArray(status) AS statuses,
        groupArray(start_ns) AS starts,
        groupArray(end_ns) AS ends,
        groupArray(resource) AS resources,
        groupArray(attrs) AS attributes,
        groupArray(nums) AS numbers,
        groupArray(ints) AS integers,
        groupArray(bucket) AS buckets,
        groupArray(latscope_phase) AS latscope_phases,
        groupArray(has_latency) AS latency,
        groupArray(server_like) AS serverlike,
        groupArray(is_tool) AS tools,
        groupArray(timed) AS timed_decodes,
        groupArray(has_gpu) AS gpu_phases,
        $NULLABLE_ARRAY(first_token_event) AS first_token_events
    FROM spans
    GROUP BY trace_id
),
-- A span stored twice (an exporter that retried an Export that had arrived) counts once: its
-- first copy is kept. Only traces that repeat an id pay for the filter.
unique_spans AS (
    SELECT * REPLACE ($DEDUP_COLUMNS)
    FROM (SELECT *, length(arrayDistinct(ids)) < length(ids) AS repeated FROM trace_arrays)
),
-- Each span's parent (its index; 0: not stored) and its ancestors, nearest first, at most
-- $MAX_ANCESTRY: a list of k ancestors is extended by the list of its k-th ancestor while it is
-- full, doubling k.
parents AS (
    SELECT
        * EXCEPT (parents, repeated),
        toUInt32(length(ids)) AS n,
        range(1, n + 1) AS idx,
        -- Each span's rank by (start, span id): the order the rules use wherever they pick the
        -- oldest or newest of several spans, as one integer to compare.
        arrayMap(i -> toUInt32(indexOf(arraySort(k -> (starts[k], ids[k]), range(1, n + 1)), i)),
            range(1, n + 1)) AS span_rank,
        arrayMap(p -> toUInt32(indexOf(ids, p)), parents) AS parent_idx
    FROM unique_spans
),
$ANCESTRY,
-- Phase spans -> the nearest server-like ancestor within $MAX_PHASE_DEPTH levels; an SGLang stage
-- slice only under an ancestor carrying gen_ai.latency.* (an SGLang request root). A span's
-- client: its nearest CLIENT ancestor, reached without crossing a server of another service.
relations AS (
    SELECT
        * EXCEPT (latscope_phases),
        arrayMap((b, a, l) -> if(b = '', 0, arrayFirst(x -> serverlike[x] AND (l OR latency[x]),
            [arrayFirst(x -> serverlike[x], arraySlice(a, 1, $MAX_PHASE_DEPTH))])),
            buckets, ancestors, latscope_phases) AS owner,
        arrayMap((a, svc) -> arrayFirst(x -> kinds[x] = $CLIENT
            OR (serverlike[x] AND services[x] != svc), a), ancestors, services) AS stop,
        arrayMap(p -> if(kinds[p] = $CLIENT, p, 0), parent_idx) AS client_parent
    FROM $LAST_ANCESTRY
),
-- Inference spans: server-like spans owning a phase, and every span carrying gen_ai.latency.*
-- whatever its kind; without any, the innermost SERVER spans with a client, outside tool calls.
candidates AS (
    SELECT
        * EXCEPT (stop, serverlike),
        arrayMap(x -> if(kinds[x] = $CLIENT, x, 0), stop) AS client_of,
        arrayMap((l, i) -> l OR has(owner, i), latency, idx) AS inference0
    FROM relations
),
called AS (
    SELECT
        * EXCEPT (tools),
        arrayMap((k, c, a) -> k = $SERVER AND c != 0 AND NOT arrayExists(x -> tools[x], a),
            kinds, client_of, ancestors) AS called
    FROM candidates
),
-- A request is keyed by its client span, else by its inference span.
traces AS (
    SELECT
        * EXCEPT (ancestors, inference0, called),
        if(arrayExists(x -> x, inference0), inference0,
            arrayMap((i, c) -> c AND NOT has(arrayFlatten(arrayFilter((a, f) -> f, ancestors,
                called)), i), idx, called)) AS is_inference,
        arrayMap((c, i) -> if(c != 0, c, i), client_of, idx) AS request_key
    FROM called
)
