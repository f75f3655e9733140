-- The single-call path, stage 1: the batch's spans (stage 0) with what the shape check and the
-- request's figures read. Values are looked up by code with indexOf (no lambda), and only the
-- lookups every span needs are made here; what every span is tested for was computed as it was
-- stored (stage 0).
simple_spans AS (
    SELECT
        trace_id, span_id, parent_id, service, start_ns, end_ns, kind, status, $SIMPLE_RESOURCE,
        codes,
        vals, first_token_event, token_figures,
        -- A latscope phase's bucket (rank + 1; 0: not a phase). SGLang's stage slices are phases
        -- only under a span with gen_ai.latency.*, which sends a trace to the general path.
        $PHASE_BUCKET(phase_code) AS bucket,
        -- Any gen_ai.latency.* key, a number or not: the general path decides what it means.
        -- Or the request span of an engine the rulebook reads without one.
        $FACT(LATENCY_KEY) OR $ENGINE_HINT AS latency_key,
        $TIMED(bucket) AS timed,
        $HAS_GPU(bucket) AS has_gpu,
        -- A client-side GenAI operation (engine.is_model_call: no span here carries a latency
        -- figure), and an ASGI response-body message (its response's end cuts the server's
        -- window: the general path's work).
        kind != $SERVER AND (vals[indexOf(codes, $K_OPERATION)] IN $MODEL_CALLS
            OR vals[indexOf(codes, $K_OI_KIND)] = $OI_LLM) AS model_call,
        $ASGI_RESPONSE_BODY IN (vals[indexOf(codes, $K_ASGI_EVENT)],
            vals[indexOf(codes, $K_ASGI_EVENT_OLD)]) AS response
    FROM span_rows
)
