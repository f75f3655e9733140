-- The trace id's bloom filters, of the spans and of the attribution rows, at the finest
-- precision ClickHouse builds (001 and 002 made them 0.001).
--
-- Each attributor pass reads the spans of its traces (`TraceId IN <the pass's ids>`), then looks
-- its traces up among the attribution rows (a trace attributed before may have rows to retract).
-- A live pass's traces are new: their spans sit in the parts of the last few inserts, and the
-- parts merged earlier in the same hours hold none of them. The sorting keys cannot skip those
-- parts' granules (a pass's random ids fall in most trace id ranges of an hour's granules), so
-- the bloom filter decides, and at 0.001 a granule lets 1,000 ids through with probability
-- 1 - 0.999^1000 = 63 %; at 0.0001, about 10 %, so a live pass reads about a tenth of those
-- granules (docs/benchmarks.md, "Live passes"). ClickHouse sizes the filter for at most this
-- precision (a finer one builds the same filter). The index takes 0.34 bytes a span.
--
-- Parts stored before this file get the new filters from MATERIALIZE INDEX, a mutation that runs
-- in the background; until it reaches a part, that part is read without a trace id filter (the
-- sorting key still skips what it can).
ALTER TABLE otel_traces DROP INDEX IF EXISTS idx_trace_id;

ALTER TABLE otel_traces
    ADD INDEX IF NOT EXISTS idx_trace_id TraceId TYPE bloom_filter(0.0001) GRANULARITY 1;

ALTER TABLE otel_traces MATERIALIZE INDEX idx_trace_id;

ALTER TABLE latscope_attribution DROP INDEX IF EXISTS idx_trace_id;

ALTER TABLE latscope_attribution
    ADD INDEX IF NOT EXISTS idx_trace_id TraceId TYPE bloom_filter(0.0001) GRANULARITY 1;

ALTER TABLE latscope_attribution MATERIALIZE INDEX idx_trace_id;
