-- Stage 1: the spans of the batch's traces, one row each, with what every span needs for the
-- rules (kind, times, its phase bucket, whether it carries gen_ai.latency.*) and `attrs`, the few
-- attributes the rules read (READ_KEYS), non-empty ones only: empty counts as absent, as in the
-- reference engine. Everything else is parsed later, for the few spans a request reads it from.
-- Numbers parse exactly as attribution/model.py parses them ($NUM a decimal number, $INT an
-- integer read exactly, else a truncated number; anything else is NULL, i.e. absent). Span kinds
-- and status codes in older exporters' spellings read as the current ones.
spans AS (
    SELECT
        TraceId AS trace_id,
        SpanId AS span_id,
        ParentSpanId AS parent_id,
        $KIND AS kind,
        ServiceName AS service,
        $STATUS AS status,
        toUnixTimestamp64Nano(Timestamp) AS start_ns,
        start_ns + toInt64(Duration) AS end_ns,
        ResourceAttributes AS resource,
        -- Lookups in a map cast to plain String keys are ~2.4x cheaper than in
        -- Map(LowCardinality(String), String); filtering it once makes every later lookup scan a
        -- handful of entries.
        mapFilter((k, v) -> k IN $READ_KEYS AND v != '',
            CAST(SpanAttributes, 'Map(String, String)')) AS attrs,
        attrs[$PHASE_KEY] AS phase_attr,
        -- The bucket this span stands for, if it is a phase: latscope.phase, else an SGLang stage
        -- slice by name (which only counts under an SGLang request root: stage 2 checks).
        if(phase_attr IN $PHASES, phase_attr, $STAGE_BUCKET) AS bucket,
        phase_attr IN $PHASES AS latscope_phase,
        $HAS_LATENCY AS has_latency,
        kind = $SERVER OR has_latency AS server_like,
        attrs[$OPERATION_KEY] = $EXECUTE_TOOL AS is_tool,
        -- A decode span with token offsets (a JSON array of integers, not empty), and a prefill
        -- or decode span with GPU figures: flags, so later stages parse only those spans.
        bucket = $DECODE AND match(attrs[$OFFSETS_KEY], $INT_ARRAY)
            AND match(attrs[$OFFSETS_KEY], '[0-9]') AS timed,
        bucket IN $GPU_PHASES AND $HAS_GPU AS has_gpu,
        if(has(Events.Name, $FIRST_TOKEN_EVENT),
            arrayMin(arrayMap(t -> toUnixTimestamp64Nano(t),
                arrayFilter((t, n) -> n = $FIRST_TOKEN_EVENT, Events.Timestamp, Events.Name))),
            NULL) AS first_token_event
    FROM $SPANS_TABLE
    WHERE TraceId IN (SELECT trace_id FROM batch) AND $SPAN_BOUNDS
)
