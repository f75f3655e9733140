-- The token figures of every span with token offsets, computed by ClickHouse once, as the span is
-- stored, instead of by every attribution statement that reads it: the single-call path then
-- carries seven numbers per decode span through its GROUP BY where it carried the offsets' text
-- (about 500 characters for 64 tokens) and parsed it after. Measured on the attribution
-- benchmark's batches of 100,000 requests: the single-call statement about a fifth less CPU, the
-- same rows (docs/benchmarks.md).
--
-- LatscopeTokenFigures, for a span whose latscope.token_offsets_us is a JSON array of integers
-- (fact 4 of LatscopeFacts, 010), from its start and those offsets (us), by engine.timed_decode's
-- arithmetic (latscope.attribution.sql.token_figures, a test holds the two equal):
-- * first_token_ns: the first token's time (the span's start + the first offset);
-- * tpot_ns, itl_p50_ns, itl_p99_ns, itl_max_ns: the time per output token and the inter-token
--   gaps' quantiles and maximum (NULL with fewer than two tokens);
-- * stalls: the gaps longer than 250 ms, the attributor's default stall threshold
--   (latscope.attribution.sql.STORED_STALL_NS). An attributor with another threshold computes
--   the figures from the offsets, as before this file;
-- * tokens: the number of offsets.
-- Other spans hold the tuple's defaults (0, NULL, ...); the rules read it only for a decode span
-- with offsets.
--
-- Parts stored before this file compute the column when they are read, from the same
-- expression; `MATERIALIZE COLUMN` stores it.
ALTER TABLE otel_traces
    ADD COLUMN IF NOT EXISTS LatscopeTokenFigures Tuple(first_token_ns Int64,
        tpot_ns Nullable(Float64), itl_p50_ns Nullable(Float64), itl_p99_ns Nullable(Float64),
        itl_max_ns Nullable(Float64), stalls UInt32, tokens UInt32)
    MATERIALIZED CAST(arrayMap(tok_offsets -> arrayMap((tok_gaps, tok_sorted) -> (
        if(empty(tok_offsets), 0, toUnixTimestamp64Nano(Timestamp) + tok_offsets[1] * 1000),
        if(length(tok_gaps) > 0,
            (tok_offsets[-1] - tok_offsets[1]) * 1000 / length(tok_gaps), NULL),
        if(length(tok_gaps) > 0,
            if(toInt64(floor((0.5 * (length(tok_gaps) - 1)))) + 1 >= length(tok_gaps),
                toFloat64((tok_sorted[length(tok_gaps)] * 1000)),
                (tok_sorted[toInt64(floor((0.5 * (length(tok_gaps) - 1)))) + 1] * 1000)
                + ((tok_sorted[toInt64(floor((0.5 * (length(tok_gaps) - 1)))) + 2] * 1000)
                    - (tok_sorted[toInt64(floor((0.5 * (length(tok_gaps) - 1)))) + 1] * 1000))
                * ((0.5 * (length(tok_gaps) - 1)) - toInt64(floor((0.5 * (length(tok_gaps) - 1)))))),
            NULL),
        if(length(tok_gaps) > 0,
            if(toInt64(floor((0.99 * (length(tok_gaps) - 1)))) + 1 >= length(tok_gaps),
                toFloat64((tok_sorted[length(tok_gaps)] * 1000)),
                (tok_sorted[toInt64(floor((0.99 * (length(tok_gaps) - 1)))) + 1] * 1000)
                + ((tok_sorted[toInt64(floor((0.99 * (length(tok_gaps) - 1)))) + 2] * 1000)
                    - (tok_sorted[toInt64(floor((0.99 * (length(tok_gaps) - 1)))) + 1] * 1000))
                * ((0.99 * (length(tok_gaps) - 1)) - toInt64(floor((0.99 * (length(tok_gaps) - 1)))))),
            NULL),
        if(length(tok_gaps) > 0, toFloat64(tok_sorted[length(tok_gaps)] * 1000), NULL),
        toUInt32(arrayCount(tok_gap -> tok_gap * 1000 > 250000000, tok_gaps)),
        toUInt32(length(tok_offsets))),
        [arrayPopFront(arrayDifference(tok_offsets))],
        [arraySort(arrayPopFront(arrayDifference(tok_offsets)))])[1],
        [CAST(if(bitTest(LatscopeFacts, 2), LatscopeRuleAttributes[11], '[]'), 'Array(Int64)')])[1],
        'Tuple(first_token_ns Int64, tpot_ns Nullable(Float64), itl_p50_ns Nullable(Float64), itl_p99_ns Nullable(Float64), itl_max_ns Nullable(Float64), stalls UInt32, tokens UInt32)');
