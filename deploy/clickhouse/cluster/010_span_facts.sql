-- GENERATED from ../010_span_facts.sql by deploy/clickhouse/cluster/generate.py; do not edit.
-- Replicated local table + Distributed table under the single-node name.

ALTER TABLE latscope.otel_traces_local ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS LatscopePhase UInt8 MATERIALIZED transform(
        LatscopeRuleAttributes[27],
        ['queue', 'preprocess', 'prefill', 'decode', 'postprocess'], [1, 2, 3, 4, 5], 0),
    ADD COLUMN IF NOT EXISTS LatscopeFacts UInt8 MATERIALIZED toUInt8(
        hasAny(mapKeys(LatscopeRuleAttributes), [16, 17, 18, 19, 20])
        + 2 * arrayExists((code, value) -> code BETWEEN 16 AND 20
                AND match(value, '^-?[0-9]+(\\.[0-9]+)?([eE][-+]?[0-9]+)?$'),
            mapKeys(LatscopeRuleAttributes), mapValues(LatscopeRuleAttributes))
        + 4 * (match(LatscopeRuleAttributes[11],
                '^\\[[ \t\n\r]*(-?(0|[1-9][0-9]{0,14})[ \t\n\r]*(,[ \t\n\r]*-?(0|[1-9][0-9]{0,14})[ \t\n\r]*)*)?\\]$')
            AND match(LatscopeRuleAttributes[11], '[0-9]'))
        + 8 * arrayExists((code, value) -> code BETWEEN 21 AND 26
                AND match(value, '^-?[0-9]+(\\.[0-9]+)?([eE][-+]?[0-9]+)?$'),
            mapKeys(LatscopeRuleAttributes), mapValues(LatscopeRuleAttributes))),
    ADD COLUMN IF NOT EXISTS LatscopeFirstToken String MATERIALIZED
        if(SpanKind IN ('Client', 'SPAN_KIND_CLIENT') AND has(Events.Name, 'latscope.first_token'),
            toString(arrayMin(arrayMap(t -> toUnixTimestamp64Nano(t),
                arrayFilter((t, n) -> n = 'latscope.first_token', Events.Timestamp, Events.Name)))),
            '');

ALTER TABLE latscope.otel_traces ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS LatscopePhase UInt8 MATERIALIZED transform(
        LatscopeRuleAttributes[27],
        ['queue', 'preprocess', 'prefill', 'decode', 'postprocess'], [1, 2, 3, 4, 5], 0),
    ADD COLUMN IF NOT EXISTS LatscopeFacts UInt8 MATERIALIZED toUInt8(
        hasAny(mapKeys(LatscopeRuleAttributes), [16, 17, 18, 19, 20])
        + 2 * arrayExists((code, value) -> code BETWEEN 16 AND 20
                AND match(value, '^-?[0-9]+(\\.[0-9]+)?([eE][-+]?[0-9]+)?$'),
            mapKeys(LatscopeRuleAttributes), mapValues(LatscopeRuleAttributes))
        + 4 * (match(LatscopeRuleAttributes[11],
                '^\\[[ \t\n\r]*(-?(0|[1-9][0-9]{0,14})[ \t\n\r]*(,[ \t\n\r]*-?(0|[1-9][0-9]{0,14})[ \t\n\r]*)*)?\\]$')
            AND match(LatscopeRuleAttributes[11], '[0-9]'))
        + 8 * arrayExists((code, value) -> code BETWEEN 21 AND 26
                AND match(value, '^-?[0-9]+(\\.[0-9]+)?([eE][-+]?[0-9]+)?$'),
            mapKeys(LatscopeRuleAttributes), mapValues(LatscopeRuleAttributes))),
    ADD COLUMN IF NOT EXISTS LatscopeFirstToken String MATERIALIZED
        if(SpanKind IN ('Client', 'SPAN_KIND_CLIENT') AND has(Events.Name, 'latscope.first_token'),
            toString(arrayMin(arrayMap(t -> toUnixTimestamp64Nano(t),
                arrayFilter((t, n) -> n = 'latscope.first_token', Events.Timestamp, Events.Name)))),
            '');
