-- Stage 2: one row per trace, its spans as parallel arrays (index i = one span, in no particular
-- order: every choice below that depends on order names its own sort key; groupArray skips NULLs,
-- so a nullable column goes through $NULLABLE_ARRAY to stay aligned), and the relations of the
-- rules computed over them: ancestors, phase owners, inference spans and their clients. Each step
-- is its own SELECT so that ClickHouse computes an array once instead of expanding it into every
-- expression that reads it.
trace_arrays AS (
    SELECT
        trace_id,
        toUInt32(count()) AS n,
        groupArray(span_id) AS ids,
        groupArray(parent_id) AS parents,
        groupArray(kind) AS kinds,
        groupArray(service) AS services,
        groupArray(status) AS statuses,
        groupArray(start_ns) AS starts,
        groupArray(end_ns) AS ends,
        groupArray(resource) AS resources,
        groupArray(attrs) AS attributes,
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
-- first copy is kept. Only traces with a repeated id pay for the filter.
unique_spans AS (
    SELECT
        * REPLACE ($DEDUP_COLUMNS),
        toUInt32(length(ids)) AS n
    FROM (SELECT *, length(arrayDistinct(ids)) < n AS repeated FROM trace_arrays)
),
-- Parent index (0: not stored), then each span's ancestors, nearest first, at most
-- $MAX_ANCESTRY: a list of k ancestors is extended by the list of its k-th ancestor while it is
-- full, doubling k at each step.
$ANCESTRY,
-- Phase spans -> the nearest server-like ancestor within $MAX_PHASE_DEPTH levels; an SGLang stage
-- slice only under an ancestor carrying gen_ai.latency.* (an SGLang request root). The nearest
-- CLIENT ancestor, reached without crossing a server of another service.
owners AS (
    SELECT
        * EXCEPT ($LAST_UP),
        $LAST_UP AS ancestors,
        arrayMap((b, a) -> if(b = '', 0,
            arrayFirst(x -> serverlike[x], arraySlice(a, 1, $MAX_PHASE_DEPTH))),
            buckets, ancestors) AS owner0,
        arrayMap((o, l) -> if(o != 0 AND (l OR latency[o]), o, 0), owner0, latscope_phases)
            AS owner,
        arrayMap((a, svc) -> arrayFirst(x -> kinds[x] = $CLIENT
            OR (serverlike[x] AND services[x] != svc), a), ancestors, services) AS stop
    FROM $LAST_ANCESTRY
),
-- Inference spans: server-like spans owning a phase, and every span carrying gen_ai.latency.*
-- whatever its kind. Without any, the innermost SERVER spans with a client, outside tool calls.
inference AS (
    SELECT
        * EXCEPT (stop, owner0),
        arrayMap(x -> if(x != 0 AND kinds[x] = $CLIENT, x, 0), stop) AS client_of,
        arrayMap(i -> latency[i] OR has(owner, i), idx) AS inference0,
        arrayMap((i, a) -> kinds[i] = $SERVER AND client_of[i] != 0
            AND NOT arrayExists(x -> tools[x], a),
            idx, ancestors) AS called
    FROM owners
),
traces AS (
    SELECT
        * EXCEPT (inference0, called),
        if(arrayExists(x -> x, inference0), inference0,
            arrayMap(i -> called[i] AND NOT has(arrayFlatten(arrayFilter((a, c) -> c, ancestors,
                called)), i), idx)) AS is_inference,
        -- A request is keyed by its client span, else by its inference span.
        arrayMap(i -> if(client_of[i] != 0, client_of[i], i), idx) AS request_key,
        arrayDistinct(arrayFilter((k, f) -> f, request_key, is_inference)) AS request_keys
    FROM inference
)
