-- Stage 1: the spans of the batch's traces, one row each, with what every span needs for the
-- rules: its kind, times and phase bucket, and three small maps of the attributes the rules read
-- (non-empty ones only: empty counts as absent, as in the reference engine): `attrs` the strings,
-- `nums` the decimal numbers and `ints` the integers among them, each parsed once here exactly as
-- attribution/model.py parses them ($NUM a decimal number, $INT an integer read exactly, else a
-- truncated number; a value that does not parse is left out). Span kinds and status codes in
-- older exporters' spellings read as the current ones.
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
        -- Map(LowCardinality(String), String).
        CAST(SpanAttributes, 'Map(String, String)') AS raw,
        mapFilter((k, v) -> k IN $STRING_KEYS AND v != '', raw) AS attrs,
        -- Parsing only the keys a span has (usually none or two) is ~8x cheaper than looking up
        -- every key.
        mapFilter((k, v) -> v IS NOT NULL, mapApply((k, v) -> (k, $NUM(v)),
            mapFilter((k, v) -> k IN $FLOAT_KEYS, raw))) AS nums,
        mapFilter((k, v) -> v IS NOT NULL, mapApply((k, v) -> (k, $INT(v)),
            mapFilter((k, v) -> k IN $INT_KEYS, raw))) AS ints,
        raw[$PHASE_KEY] AS phase_attr,
        -- The bucket this span stands for, if it is a phase: latscope.phase, else an SGLang stage
        -- slice by name (which only counts under an SGLang request root: stage 2 checks).
        if(phase_attr IN $PHASES, phase_attr, $STAGE_BUCKET) AS bucket,
        phase_attr IN $PHASES AS latscope_phase,
        arrayExists(k -> mapContains(nums, k), $LATENCY_KEYS) AS has_latency,
        kind = $SERVER OR has_latency AS server_like,
        raw[$OPERATION_KEY] = $EXECUTE_TOOL AS is_tool,
        -- A decode span with token offsets (a JSON array of integers, not empty), and a prefill
        -- or decode span with GPU figures: flags, so later stages look at those spans only.
        bucket = $DECODE AND match(raw[$OFFSETS_KEY], $INT_ARRAY)
            AND match(raw[$OFFSETS_KEY], '[0-9]') AS timed,
        bucket IN $GPU_PHASES AND arrayExists(k -> mapContains(nums, k), $GPU_KEYS) AS has_gpu,
        if(has(Events.Name, $FIRST_TOKEN_EVENT),
            arrayMin(arrayMap(t -> toUnixTimestamp64Nano(t),
                arrayFilter((t, n) -> n = $FIRST_TOKEN_EVENT, Events.Timestamp, Events.Name))),
            NULL) AS first_token_event
    FROM $SPANS_TABLE
    WHERE TraceId IN (SELECT trace_id FROM batch) AND $SPAN_BOUNDS
)
