-- Stage 2: one row per trace, its spans as parallel arrays (index i = one span, in no particular
-- order: every choice below that depends on order names its own sort key), and the relations of
-- the rules computed over them: ancestors, phase owners, inference spans and their clients.
-- Only scalars, the sparse payloads and the resources of server-like spans are grouped:
-- groupArray of a whole attribute map per span cost more than everything else in this stage.
-- Each SELECT names the columns it passes on and reads the columns of the one before: an
-- expression never reads an expensive alias of its own SELECT, because ClickHouse's analyzer
-- copies an alias into every place that reads it (and for a small batch the statement's analysis,
-- not its execution, is the cost to keep down).
trace_arrays AS (
    SELECT
        trace_id,
        groupArray(span_id) AS ids,
        groupArray(parent_id) AS parents,
        groupArray(service) AS services,
        groupArray(start_ns) AS starts,
        groupArray(end_ns) AS ends,
        groupArray(flags) AS flags,
        groupArray(payload) AS payloads,
        groupArray(resource) AS resources
    FROM spans
    GROUP BY trace_id
    -- Not for the order: one sorted stream of trace rows halves the CPU of the stages after it
    -- (measured: 77 -> 152 us per request without it, 20,000 traces).
    ORDER BY trace_id
),
-- Each span's parent (its index; 0: not stored), its rank by (start, span id) (the order the
-- rules use wherever they pick the oldest or newest of several spans, as one integer to compare),
-- and its flags as arrays.
parents AS (
    SELECT
        trace_id, ids, services, starts, ends, payloads, resources,
        arrayEnumerate(ids) AS idx,
        arraySort((i, s, id) -> (s, id), idx, starts, ids) AS by_start,
        arrayMap(p -> toUInt32(indexOf(ids, p)), parents) AS parent_idx,
        arrayMap(f -> $FLAG(f, SERVER), flags) AS servers,
        arrayMap(f -> $FLAG(f, CLIENT), flags) AS clients,
        arrayMap(f -> $FLAG(f, LATSCOPE_PHASE), flags) AS latscope_phases,
        arrayMap(f -> $FLAG(f, LATENCY), flags) AS latency,
        arrayMap(f -> $FLAG(f, SERVER_LIKE), flags) AS serverlike,
        arrayMap(f -> $FLAG(f, TOOL), flags) AS tools,
        arrayMap(f -> $FLAG(f, TIMED), flags) AS timed_decodes,
        arrayMap(f -> $FLAG(f, GPU), flags) AS gpu_phases,
        arrayMap(f -> toUInt8(intDiv(f, $F_BUCKET)), flags) AS buckets
    FROM trace_arrays
),
-- Each span's ancestors, nearest first, at most $MAX_ANCESTRY: a list of k ancestors is extended
-- by the list of its k-th ancestor while it is full, doubling k.
$ANCESTRY,
-- Phase spans -> the nearest server-like ancestor within $MAX_PHASE_DEPTH levels; an SGLang stage
-- slice only under an ancestor carrying gen_ai.latency.* (an SGLang request root). A span's
-- client: its nearest CLIENT ancestor, reached without crossing a server of another service.
relations AS (
    SELECT
        * EXCEPT (latscope_phases, by_start),
        arrayMap(i -> toUInt32(indexOf(by_start, i)), idx) AS span_rank,
        arrayMap((b, a, l) -> if(b = 0, 0, arrayFirst(x -> serverlike[x] AND (l OR latency[x]),
            [arrayFirst(x -> serverlike[x], arraySlice(a, 1, $MAX_PHASE_DEPTH))])),
            buckets, ancestors, latscope_phases) AS owner,
        arrayMap((a, svc) -> arrayFirst(x -> clients[x]
            OR (serverlike[x] AND services[x] != svc), a), ancestors, services) AS stop,
        arrayMap(p -> if(clients[p], p, 0), parent_idx) AS client_parent
    FROM $LAST_ANCESTRY
),
-- Inference spans: server-like spans owning a phase, and every span carrying gen_ai.latency.*
-- whatever its kind; without any, the innermost SERVER spans with a client, outside tool calls.
candidates AS (
    SELECT
        * EXCEPT (stop, serverlike, parent_idx),
        arrayMap(x -> if(clients[x], x, 0), stop) AS client_of,
        arrayMap((l, i) -> l OR has(owner, i), latency, idx) AS inference0
    FROM relations
),
called AS (
    SELECT
        * EXCEPT (tools, servers),
        arrayMap((s, c, a) -> s AND c != 0 AND NOT arrayExists(x -> tools[x], a),
            servers, client_of, ancestors) AS called
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
