-- Stage 2: one row per trace, its spans as parallel arrays (index i = one span, in no particular
-- order: every choice below that depends on order names its own sort key), and the relations of
-- the rules computed over them: ancestors, phase owners, inference spans, their clients and
-- windows. Only scalars, the sparse payloads and the resources of server-like spans are grouped:
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
        groupArray(resource) AS resources,
        groupArray(engine) AS engines,
        groupArray(system) AS systems,
        groupArray(stage_code) AS stage_codes,
        groupArray(part_code) AS part_codes,
        groupArray(rule_events) AS revents,
        groupArray(ephases) AS ephases,
        -- A tuple: groupArray skips a NULL value, not a tuple holding one.
        groupArray(efigures) AS efigures
    FROM spans
    GROUP BY trace_id
    -- Not for the order: one sorted stream of trace rows halves the CPU of the stages after it.
    ORDER BY trace_id
),
-- Each span's parent (its index; 0: not stored), its rank by (start, span id) (the order the
-- rules use wherever they pick the oldest or newest of several spans, as one integer to compare),
-- and its flags as arrays.
parents AS (
    SELECT
        trace_id, ids, services, starts, ends, payloads, resources, engines, systems, stage_codes,
        ephases, efigures, part_codes, revents,
        arrayEnumerate(ids) AS idx,
        arraySort((i, s, id) -> (s, id), idx, starts, ids) AS by_start,
        arrayMap(p -> toUInt32(indexOf(ids, p)), parents) AS parent_idx,
        arrayMap(f -> $FLAG(f, SERVER), flags) AS servers,
        arrayMap(f -> $FLAG(f, CLIENT), flags) AS clients,
        arrayMap(f -> $FLAG(f, LATSCOPE_PHASE), flags) AS latscope_phases,
        arrayMap(f -> $FLAG(f, LATENCY), flags) AS latency,
        arrayMap(f -> $FLAG(f, SERVER_LIKE), flags) AS serverlike,
        arrayMap(f -> $FLAG(f, MODEL_CALL), flags) AS model_calls,
        arrayMap(f -> $FLAG(f, SAYS), flags) AS says,
        arrayMap(f -> $FLAG(f, RESPONSE), flags) AS responses,
        arrayMap(f -> $FLAG(f, PREFILL_ROOT) OR $FLAG(f, DECODE_ROOT), flags) AS disaggregated,
        arrayMap(f -> $FLAG(f, DECODE_ROOT), flags) AS decode_roots,
        arrayMap(f -> $FLAG(f, TIMED), flags) AS timed_decodes,
        arrayMap(f -> $FLAG(f, GPU), flags) AS gpu_phases,
        arrayMap(f -> toUInt8(intDiv(f, $F_BUCKET)), flags) AS buckets
    FROM trace_arrays
),
-- Each span's ancestors, nearest first, at most $MAX_ANCESTRY: a list of k ancestors is extended
-- by the list of its k-th ancestor while it is full, doubling k.
$ANCESTRY,
-- Phase spans -> the nearest server-like ancestor within $MAX_PHASE_DEPTH levels; an SGLang stage
-- slice only under an ancestor carrying gen_ai.latency.* (an SGLang request root); ASGI
-- response-body messages -> theirs alike. A span's transport: its nearest CLIENT ancestor,
-- reached without crossing a server of another service; a span's link up its call: its parent
-- when that is a CLIENT span or a client-side GenAI operation (engine.client_chain).
relations AS (
    SELECT
        * EXCEPT (by_start),
        arrayMap(i -> toUInt32(indexOf(by_start, i)), idx) AS span_rank,
        arrayMap((b, a, l, c) -> if(b = 0, 0, arrayFirst(x -> serverlike[x]
            AND (l OR $STAGE_DEPTH(engines[x], c) >= indexOf(a, x)),
            [arrayFirst(x -> serverlike[x], arraySlice(a, 1, $MAX_PHASE_DEPTH))])),
            buckets, ancestors, latscope_phases, stage_codes) AS owner,
        arrayMap((r, a) -> if(r, arrayFirst(x -> serverlike[x], arraySlice(a, 1, $MAX_PHASE_DEPTH)),
            0), responses, ancestors) AS response_owner,
        arrayMap((a, svc) -> arrayFirst(x -> clients[x]
            OR (serverlike[x] AND services[x] != svc), a), ancestors, services) AS stop,
        arrayMap(p -> if((clients[p] AND NOT latency[p]) OR model_calls[p], p, 0), parent_idx)
            AS call_up,
        -- The nearest serving system's request span above, within its depth (engine.system_above).
        arrayMap(a -> arrayMap(x -> if(x != 0 AND indexOf(a, x) <= $SYSTEM_DEPTH(systems[x]), x, 0),
            [arrayFirst(x -> systems[x] != 0, arraySlice(a, 1, $MAX_PHASE_DEPTH))])[1], ancestors)
            AS sys_of,
        -- The request span of an engine with parts this span is inside, within the engine's part
        -- depth (finding.engine_parts; 0: none).
        arrayMap(a -> arrayMap(x -> if(x != 0 AND indexOf(a, x) <= $PART_DEPTH(engines[x]), x, 0),
            [arrayFirst(x -> $PART_DEPTH(engines[x]) != 0, arraySlice(a, 1, $MAX_PHASE_DEPTH))])[1],
            ancestors) AS part_of
    FROM $LAST_ANCESTRY
),
-- The transport of each span, and the client of the call it belongs to: the outermost GenAI
-- operation among the transport and the ($CLIENT_CHAIN - 1) links above it, else the transport.
-- Engines: server-like spans owning a phase, and every span carrying gen_ai.latency.*. A SERVER
-- span that is no engine is an inference call on its own word or its caller's (a GenAI operation
-- in its chain).
candidates AS (
    SELECT
        * EXCEPT (stop, parent_idx, says, buckets, latscope_phases),
        -- The earliest stage span of a name its engine lists in stages.first stands for that
        -- bucket (engine._first_stages).
        arrayMap(j -> if(owner[j] != 0 AND NOT latscope_phases[j]
            AND $STAGE_FIRST(engines[owner[j]], stage_codes[j]) != 0
            AND span_rank[j] = arrayMin(arrayMap(i -> span_rank[i], arrayFilter(i -> owner[i]
                = owner[j] AND stage_codes[i] = stage_codes[j] AND NOT latscope_phases[i], idx))),
            toUInt8($STAGE_FIRST(engines[owner[j]], stage_codes[j])), buckets[j]), idx)
            AS final_buckets,
        -- Under a serving system, the system's transport (the CLIENT spans inside it are its hops).
        arrayMap((x, y) -> if(y != 0, if(clients[stop[y]], stop[y], 0), if(clients[x], x, 0)),
            stop, sys_of) AS client_of,
        arrayMap(t -> multiIf(model_calls[call_up[call_up[t]]], call_up[call_up[t]],
            model_calls[call_up[t]], call_up[t], t), client_of) AS request_client,
        arrayMap((l, i) -> l OR has(owner, i), latency, idx) AS engine,
        -- A SERVER span inside an engine's request span with parts is that request's own.
        arrayMap((s, e, t, c, y, p) -> s AND NOT e AND p = 0 AND (y OR (c != 0 AND (model_calls[t]
            OR model_calls[call_up[t]] OR model_calls[call_up[call_up[t]]]))),
            servers, engine, client_of, request_client, says, part_of) AS said,
        -- Each part's phases (rank, start, end) by its engine's [[engine.part]] rules.
        arrayMap((j, o) -> if(o = 0 OR part_codes[j] = 0,
            CAST([], 'Array(Tuple(UInt8, Int64, Int64))'), $PART_PHASES(j, parent_idx[j], o)),
            idx, part_of) AS pphases
    FROM relations
),
-- Inference spans: every engine, and each SERVER span said to serve a model that holds no other
-- inference span (a gateway, the HTTP framework around an engine). Each one's window: the model
-- service's outermost SERVER span around it, up to a CLIENT span or another service (itself when
-- none). A request is keyed by its client, else by its inference span.
traces AS (
    SELECT
        * EXCEPT (ancestors, engine, said, servers, final_buckets),
        final_buckets AS buckets,
        arrayMap((e, s, i) -> e OR (s AND NOT has(arrayFlatten(arrayFilter((a, c) -> c,
            ancestors, arrayMap((x, y) -> x OR y, engine, said))), i)), engine, said, idx)
            AS is_inference,
        arrayMap((a, svc, i) -> arrayLast(x -> servers[x], arrayConcat([i], arrayMap(k -> if(
            k = 0, a, arraySlice(a, 1, toUInt64(k - 1))),
            [arrayFirstIndex(x -> clients[x] OR services[x] != svc, a)])[1])),
            ancestors, services, idx) AS outer_server,
        arrayMap((w, i, y) -> if(y != 0, if(outer_server[y] = 0, y, outer_server[y]),
            if(w = 0, i, w)), outer_server, idx, sys_of) AS window_of,
        arrayMap((c, i) -> if(c != 0, c, i), request_client, idx) AS request_key
    FROM candidates
)
