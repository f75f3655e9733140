-- The streaming figures of a span's token offsets (latscope.token_offsets_us), written by
-- latscope's collector with the span, so the attributor reads seven numbers per decode span where
-- it carried the offsets' text (about 500 characters at 64 tokens) through its GROUP BY and parsed
-- it after. The collector computes them as it decodes the span (collector/_otlp.c, from
-- tokens.token_figures: under half a microsecond a decode span), not ClickHouse at insert: a
-- MATERIALIZED expression is analysed on every insert, which costs ingest more than it saves the
-- attributor.
--
-- LatscopeTokenFigures: for a span whose latscope.token_offsets_us is a JSON array of integers
-- (fact 4 of LatscopeFacts, 010), tokens.token_figures at the default stall threshold, by
-- position: the first offset (us), TPOT, ITL p50, p99 and max (ns; 0 with one token), the gaps
-- longer than 250 ms (tokens.DEFAULT_STALL_NS), the number of tokens. Else empty.
--
-- Other writers (the OpenTelemetry Collector's ClickHouse exporter) and spans stored before this
-- file leave it empty, and the attributor computes the figures from the offsets
-- (latscope.attribution.sql, TOKEN_FIGURES): the rows are the same either way. So does an attributor
-- whose stall threshold is not the default.
ALTER TABLE otel_traces
    ADD COLUMN IF NOT EXISTS LatscopeTokenFigures Array(Float64) DEFAULT [] CODEC(ZSTD(1));
