-- Stage 0, read by both paths (the general stages and the single-call path): the batch's spans,
-- one row each, with their times, kind and status (older exporters' spellings read as the current
-- ones), and their attributes as codes and values.
--
-- Attributes are read by code ($K_*): LatscopeRuleAttributes (deploy/clickhouse/007) holds the
-- attributes the rules read, keyed by their codes, computed as each span was stored. So the
-- statement reads a handful of values per span instead of all of them, and every lookup compares
-- small integers instead of strings (~10x cheaper than looking each key up).
span_rows AS (
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
        SpanName AS name,
        LatscopeRuleAttributes.keys AS codes,
        LatscopeRuleAttributes.values AS vals,
        -- latscope's first-token event on a client span (its time, as a payload value).
        if(kind = $CLIENT AND has(Events.Name, $FIRST_TOKEN_EVENT),
            toString(arrayMin(arrayMap(t -> toUnixTimestamp64Nano(t),
                arrayFilter((t, n) -> n = $FIRST_TOKEN_EVENT, Events.Timestamp, Events.Name)))),
            '') AS first_token_event
    FROM $SPANS_TABLE
    WHERE TraceId IN (SELECT trace_id FROM batch) AND $SPAN_BOUNDS
)
