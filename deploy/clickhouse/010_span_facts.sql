-- What the attribution rules test on every span, computed by ClickHouse once, as each span is
-- stored, instead of by every attribution statement that reads the span: which latscope phase it
-- is, four checks of its rule attributes (LatscopeRuleAttributes, 007), and the time of latscope's
-- first-token event on a CLIENT span. The attributor then reads two bytes and a (mostly empty)
-- string per span instead of running two regular expressions and reading the span's event
-- arrays, for about 1 % of what storing the span costs.
--
-- Like 007's codes, the values stored here never change meaning (they are in the parts):
-- * LatscopePhase: the latscope.phase value's code, its position in semconv.Phase.ALL plus one
--   (0: no latscope.phase, or another value). The rules map codes to buckets when they read them,
--   so a change of the buckets' priorities needs no new file.
-- * LatscopeFacts: bit flags (latscope.attribution.sql.FACTS, a test holds the two equal):
--     1  a gen_ai.latency.* key, whatever its value (the single-call path leaves such a trace to
--        the general path);
--     2  a gen_ai.latency.* value that is a number (a figure the rules read);
--     4  latscope.token_offsets_us a JSON array of integers, not empty (tokens.parse_int_list);
--     8  a latscope.gpu.* value that is a number.
-- * LatscopeFirstToken: on a CLIENT span, the earliest latscope.first_token event's time (ns,
--   as a string, as the rules carry it); else ''.
--
-- Parts stored before this file compute the columns when they are read, from the same
-- expressions; `MATERIALIZE COLUMN` stores them.
ALTER TABLE otel_traces
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
