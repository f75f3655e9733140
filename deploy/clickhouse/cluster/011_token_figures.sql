-- GENERATED from ../011_token_figures.sql by deploy/clickhouse/cluster/generate.py; do not edit.
-- Replicated local table + Distributed table under the single-node name.

ALTER TABLE latscope.otel_traces_local ON CLUSTER '{cluster}'
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

ALTER TABLE latscope.otel_traces ON CLUSTER '{cluster}'
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
