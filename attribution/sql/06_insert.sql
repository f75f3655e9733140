-- Stage 6: the attribution table's columns (deploy/clickhouse/002, 004, 005), one row per
-- request. Version is the number of distinct spans of the trace, so a re-run over the same spans
-- writes the same row (idempotent) and one with more spans (a late span) replaces it.
SELECT
    fromUnixTimestamp64Nano(lo, 'UTC') AS Timestamp,
    trace_id AS TraceId,
    request_span_id AS RequestSpanId,
    service AS ServiceName,
    model AS Model,
    provider AS Provider,
    m_operation AS Operation,
    m_route AS Route,
    resource AS ResourceAttributes,
    status AS StatusCode,
    client != 0 AS HasClient,
    tries AS Attempts,
    hi - lo AS E2eNs,
    $BUCKET_COLUMNS,
    ttft_client AS TtftClientNs,
    ttft_server AS TtftServerNs,
    tpot AS TpotNs,
    itl_p50 AS ItlP50Ns,
    itl_p99 AS ItlP99Ns,
    itl_max AS ItlMaxNs,
    stalls AS Stalls,
    input_tokens AS InputTokens,
    output_tokens AS OutputTokens,
    skew AS ClockSkewNs,
    gpu AS Gpu,
    n AS SpanCount,
    fromUnixTimestamp64Micro({through_us:Int64}) AS SpansIngestedAt,
    n AS Version,
    0 AS IsDeleted
FROM rows
