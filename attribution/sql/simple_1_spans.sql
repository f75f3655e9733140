-- The single-call path, stage 1: the batch's spans, one row each, with what the shape check and
-- the request's figures read. Keys become codes as in 01_spans; values are looked up by code with
-- indexOf (no lambda), and only the lookups every span needs are made here.
simple_spans AS (
    SELECT
        TraceId AS trace_id,
        SpanId AS span_id,
        ParentSpanId AS parent_id,
        ServiceName AS service,
        toUnixTimestamp64Nano(Timestamp) AS start_ns,
        start_ns + toInt64(Duration) AS end_ns,
        $KIND_CODE AS kind,
        $STATUS AS status,
        ResourceAttributes AS resource,
        arrayMap(k -> $KEY_CODE(k), SpanAttributes.keys) AS codes,
        SpanAttributes.values AS vals,
        -- A latscope phase's bucket (rank + 1; 0: not a phase). SGLang's stage slices are phases
        -- only under a span with gen_ai.latency.*, which sends a trace to the general path.
        $PHASE_BUCKET(vals[indexOf(codes, $K_PHASE)]) AS bucket,
        -- Any gen_ai.latency.* key, a number or not: the general path decides what it means.
        hasAny(codes, $LATENCY_CODES) AS latency_key,
        bucket = $DECODE_BUCKET AND $IS_INT_ARRAY(vals[indexOf(codes, $K_OFFSETS)]) AS timed,
        if(bucket IN $GPU_BUCKETS,
            arrayExists((c, v) -> bitTest($GPU_MASK, c) AND $IS_NUMBER(v), codes, vals), 0)
            AS has_gpu,
        if(kind = $CLIENT AND has(Events.Name, $FIRST_TOKEN_EVENT),
            toString(arrayMin(arrayMap(t -> toUnixTimestamp64Nano(t),
                arrayFilter((t, n) -> n = $FIRST_TOKEN_EVENT, Events.Timestamp, Events.Name)))),
            '') AS first_token_event
    FROM $SPANS_TABLE
    WHERE TraceId IN (SELECT trace_id FROM batch) AND $SPAN_BOUNDS
)
