-- Stage 1: the batch's spans (stage 0) reduced to what the rules read: times, kind, phase
-- bucket, a set of flags ($F_*), and the raw values of the attributes a later stage may read.
--
-- The flags that test values (a latency or GPU figure that is a number, a valid token offsets
-- list) were computed as the span was stored (stage 0); values are parsed in stage 5, and only
-- for the few spans a request picks. `payload` keeps, per span, just the values a span of its
-- kind can contribute (merged attributes and latency figures of a server-like span, client-side
-- figures of a span of a client chain, token offsets of a decode span, GPU figures of a prefill
-- or decode span), non-empty ones only: empty counts as absent, as in the reference engine.
span_engines AS (
    SELECT
        *,
        -- The engine whose request span this is (the rulebook's entry, index + 1; 0: none), and
        -- its stage name's code (an engine's stage spans by name): columns before the many
        -- expressions that read them (attribution/sql/__init__.py, "Layers").
        $ENGINE AS engine,
        -- The serving system whose request span this is (Dynamo's frontend, ...; 0: none).
        $SYSTEM AS system,
        $STAGE_CODE(name) AS stage_code,
        -- Its name's code among the names the engines' parts read ([[engine.part]]; 0: none).
        $PART_CODE(name) AS part_code
    FROM span_rows
),
span_facts AS (
    SELECT
        trace_id, span_id, parent_id, service, start_ns, end_ns, kind, status, resource, codes,
        vals, first_token_event, rule_events, engine, system, stage_code, part_code,
        phase_code != 0 AS latscope_phase,
        -- The engine's figures in ns (rf, in the order of the rulebook's figures).
        $RULE_FIGURES,
        -- The bucket this span stands for, if it is a phase (its rank + 1; 0: none):
        -- latscope.phase, else an engine's stage span by name (which only counts under that
        -- engine's request span, within its depth: stage 2 checks).
        if(latscope_phase, $PHASE_BUCKET(phase_code), $STAGE_BUCKET(stage_code))
            AS bucket,
        engine != 0 AS has_latency,
        kind = $SERVER OR has_latency AS server_like,
        vals[indexOf(codes, $K_OPERATION)] AS operation,
        -- A client-side GenAI operation (engine.is_model_call), a SERVER span's own word that it
        -- serves a model (engine._says_inference), an ASGI response-body message.
        NOT server_like AND (operation IN $MODEL_CALLS
            OR vals[indexOf(codes, $K_OI_KIND)] = $OI_LLM) AS model_call,
        kind = $SERVER AND (vals[indexOf(codes, $K_MODEL)] != '' OR operation IN $MODEL_CALLS
            OR $INFERENCE_ROUTE(vals[indexOf(codes, $K_ROUTE)])) AS says,
        $ASGI_RESPONSE_BODY IN (vals[indexOf(codes, $K_ASGI_EVENT)],
            vals[indexOf(codes, $K_ASGI_EVENT_OLD)]) AS response,
        $PREFILL_ROOT AS prefill_root,
        $DECODE_ROOT AS decode_root,
        -- A decode span with token offsets (a JSON array of integers, not empty), and a prefill
        -- or decode span with GPU figures.
        $TIMED(bucket) AS timed,
        $HAS_GPU(bucket) AS has_gpu
    FROM span_engines
),
-- The values an engine's rules derive from its figures ([engine.derive]), a column each.
span_derived AS (
    SELECT *, $RULE_DERIVED FROM span_facts
),
spans AS (
    SELECT
        trace_id, span_id, parent_id, service, start_ns, end_ns,
        toUInt32(kind + $F_LATSCOPE_PHASE * latscope_phase + $F_LATENCY * has_latency
            + $F_SERVER_LIKE * server_like + $F_MODEL_CALL * model_call + $F_TIMED * timed
            + $F_GPU * has_gpu + $F_SAYS * says + $F_RESPONSE * response
            + $F_PREFILL_ROOT * prefill_root + $F_DECODE_ROOT * decode_root
            + $F_BUCKET * bucket) AS flags,
        if(server_like OR system != 0 OR kind = $CLIENT OR model_call OR timed OR has_gpu,
            mapFilter((c, v) -> v != '' AND bitTest(
                    bitOr(bitOr(if(server_like OR system != 0, $ATTEMPT_MASK, 0),
                                if(kind = $CLIENT OR model_call, $CLIENT_MASK, 0)),
                          bitOr(if(timed, $DECODE_MASK, 0), if(has_gpu, $GPU_MASK, 0))), c),
                mapFromArrays(arrayConcat(codes, [$K_STATUS, $K_FIRST_TOKEN_EVENT]),
                              arrayConcat(vals, [status, first_token_event]))),
            map()) AS payload,
        -- Resource attributes are read from the request's last attempt only.
        if(server_like, resource, map()) AS resource,
        -- An engine span's phases from its figures (rank, start, end, kept beside its stage
        -- spans), its first token from its start, and the decode time its TPOT divides.
        engine, system, stage_code, part_code,
        -- The rules' event times, where the span has any (a part's, its parent's, ...).
        if(arrayExists(t -> t IS NOT NULL, rule_events), rule_events, []) AS rule_events,
        $ENGINE_PHASES AS ephases,
        ($ENGINE_FIRST, $ENGINE_TPOT) AS efigures
    FROM span_derived
    -- A span stored twice (an exporter that retried an Export that had arrived) counts once.
    LIMIT 1 BY trace_id, span_id
)
