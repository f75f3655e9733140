-- Stage 1: the spans of the batch's traces, one row each, with the few attributes the rules read
-- lifted out of the attribute map and parsed exactly as attribution/model.py parses them
-- ($NUM(...) a decimal number, $INT(...) an integer read exactly, else a truncated number; anything
-- else is NULL, i.e. absent). Span kinds and status codes in older exporters' spellings read as
-- the current ones. A span stored twice (a retrying exporter) counts once.
spans AS (
    SELECT
        TraceId AS trace_id,
        SpanId AS span_id,
        ParentSpanId AS parent_id,
        SpanName AS name,
        $KIND AS kind,
        ServiceName AS service,
        $STATUS AS status,
        toUnixTimestamp64Nano(Timestamp) AS start_ns,
        start_ns + toInt64(Duration) AS end_ns,
        ResourceAttributes AS resource,
        -- Looking keys up in the map cast to plain String keys is ~2.4x cheaper than in
        -- Map(LowCardinality(String), String).
        CAST(SpanAttributes, 'Map(String, String)') AS attrs,
        attrs[$PHASE_KEY] AS phase_attr,
        -- The bucket this span stands for, if it is a phase: latscope.phase, else an SGLang stage
        -- slice by name (which only counts under an SGLang request root: stage 2 checks).
        if(phase_attr IN $PHASES, phase_attr, $STAGE_BUCKET) AS bucket,
        phase_attr IN $PHASES AS latscope_phase,
        $NUM(attrs[$Q_KEY]) AS v_queue,
        $NUM(attrs[$TTFT_KEY]) AS v_ttft,
        $NUM(attrs[$PREFILL_KEY]) AS v_prefill,
        $NUM(attrs[$DECODE_KEY]) AS v_decode,
        $NUM(attrs[$E2E_KEY]) AS v_e2e,
        v_queue IS NOT NULL OR v_ttft IS NOT NULL OR v_prefill IS NOT NULL
            OR v_decode IS NOT NULL OR v_e2e IS NOT NULL AS has_latency,
        kind = $SERVER OR has_latency AS server_like,
        attrs[$OPERATION_KEY] AS operation,
        -- Client-side figures.
        $INT(attrs[$FIRST_TOKEN_KEY]) AS first_token_attr,
        arrayMin(arrayMap(t -> toUnixTimestamp64Nano(t),
            arrayFilter((t, n) -> n = $FIRST_TOKEN_EVENT, Events.Timestamp, Events.Name)))
            AS first_token_event_raw,
        has(Events.Name, $FIRST_TOKEN_EVENT) AS has_first_token_event,
        $INT(attrs[$LAST_BYTE_KEY]) IS NOT NULL AS whole_response,
        $NUM(attrs[$TTFC_KEY]) AS ttfc,
        -- Token offsets: a JSON array of integers, else ignored; only non-empty ones count.
        attrs[$OFFSETS_KEY] AS offsets_raw,
        match(offsets_raw, $INT_ARRAY) AND match(offsets_raw, '[0-9]') AS has_offsets,
        $INT(attrs[$TOKEN_COUNT_KEY]) AS token_count,
        -- GenAI attributes merged per request in stage 4 (empty counts as absent).
        $ATTR_COLUMNS,
        -- GPU figures of prefill / decode phase spans.
        $GPU_COLUMNS
    FROM $SPANS_TABLE
    WHERE TraceId IN (SELECT trace_id FROM batch) AND $SPAN_BOUNDS
    LIMIT 1 BY trace_id, span_id
)
