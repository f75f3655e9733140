-- The single-call path, stage 2: one row per trace of the common shape, from one GROUP BY with
-- no per-span arrays but the CLIENT spans' and the phases' (the general path's cost is mostly
-- arrays of every span and the functions over them).
--
-- The shape (checked in HAVING; every other trace is left to the general path, which gives the
-- same rows for these): each span stored once, exactly one SERVER span S and no gen_ai.latency.*
-- key anywhere (so S is the only server-like span), at least one latscope phase and every one a
-- child of S (so S owns them all and is the only inference span: one request, one attempt, one
-- try), and S's parent a CLIENT span that is not a phase (the client), or not a stored span (no
-- client), no GenAI operation but on CLIENT spans and phases (OpenInference's LLM span is INTERNAL)
-- and no ASGI response message (both the general path's). The CLIENT spans above the client (the
-- client chain) are found by id. A phase that names a GenAI operation (instrumentation that copies
-- the request's gen_ai.* attributes onto every span) is below S, so no link of S's client chain,
-- unless the parents run in a cycle through it: a trace whose client or the client's parent has
-- such a phase for its parent is left to the general path.
--
-- $TRACE_CHECK: what else a trace of the batch must meet to be taken (simple_select's
-- ``trace_check``), over the aggregates here; empty for a batch whose every trace is taken.
--
-- Span ids are counted and looked up by a 64-bit hash (SipHash of each string in uniqExact, and
-- groupArray's generic strings, were a tenth of the statement): a collision can only make n
-- smaller than the rows (then n_rows = n fails) or find S's parent stored when it is not (then
-- the last check fails), so it sends a trace to the general path, never a wrong row out. n is
-- counted from the hashes' array, not by a uniqExact beside it: its hash set per trace was a
-- fifth of the statement's memory (358 -> 289-304 MB for 50,000 traces), for the same CPU.
simple_traces AS (
    SELECT
        trace_id,
        toUInt32(length(arrayDistinct(id_hashes))) AS n,
        count() AS n_rows,
        countIf(kind = $SERVER) AS n_servers,
        countIf(latency_key) AS n_latency,
        countIf(bucket != 0) AS n_phases,
        countIf(response OR (model_call AND kind != $CLIENT AND bucket = 0)) AS n_general,
        groupArrayIf(cityHash64(span_id), model_call AND kind != $CLIENT) AS call_phases,
        minIf(parent_id, bucket != 0) AS phase_parent_lo,
        maxIf(parent_id, bucket != 0) AS phase_parent_hi,
        groupArrayIf((span_id, parent_id, service, start_ns, end_ns, status, resource, codes, vals),
            kind = $SERVER)[1] AS server,
        groupArray(cityHash64(span_id)) AS id_hashes,
        groupArrayIf(span_id, kind = $CLIENT) AS client_ids,
        groupArrayIf((parent_id, start_ns, end_ns, bucket, codes, vals, first_token_event,
            model_call), kind = $CLIENT) AS clients,
        groupArrayIf((toUInt8(bucket - 1), start_ns, end_ns), bucket != 0) AS phases,
        -- The last (start, span id) decode phase with token offsets, and the last prefill and
        -- decode phases with GPU figures. A decode span carries its token count, its offsets'
        -- text only where it has no stored token figures ($DECODE_OFFSETS: the text, about 500
        -- characters at 64 tokens, was a fifth of this GROUP BY), and the figures the collector
        -- stored ($DECODE_FIGURES: when the stall threshold is the stored one).
        countIf(timed) AS n_timed,
        groupArrayIf((start_ns, span_id, vals[indexOf(codes, $K_TOKEN_COUNT)], $DECODE_OFFSETS
            $DECODE_FIGURES), timed) AS decodes,
        groupArrayIf((start_ns, span_id, codes, vals), has_gpu AND bucket = $PREFILL_BUCKET)
            AS gpu_prefills,
        groupArrayIf((start_ns, span_id, codes, vals), has_gpu AND bucket = $DECODE_BUCKET)
            AS gpu_decodes,
        -- The client: the CLIENT span that is S's parent (its position in clients; 0: none).
        toUInt32(indexOf(client_ids, server.2)) AS client,
        -- S's resource: its position among the resources by id (0: not found, and the trace
        -- is left to the general path, which reads the attributes from the spans), or 1 when
        -- S carries its attributes.
        $RESOURCE_AT AS resource_at
    FROM simple_spans
    GROUP BY trace_id
    HAVING n_rows = n AND n_servers = 1 AND n_latency = 0 AND n_phases > 0 AND resource_at != 0
        AND n_general = 0
        AND phase_parent_lo = server.1 AND phase_parent_hi = server.1
        AND if(client != 0, clients[client].4 = 0,
            server.2 = '' OR NOT has(id_hashes, cityHash64(server.2)))
        AND (empty(call_phases) OR client = 0
            OR NOT (has(call_phases, cityHash64(clients[client].1))
                OR has(call_phases, cityHash64(clients[indexOf(client_ids, clients[client].1)].1))))
        $TRACE_CHECK
)
