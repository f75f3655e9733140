-- The trace id's bloom filters, of the spans and of the attribution rows, at the finest
-- precision ClickHouse builds (001 and 002 made them 0.001).
--
-- Each attributor pass reads the spans of its traces (`TraceId IN <the pass's ids>`), then looks
-- its traces up among the attribution rows (a trace attributed before may have rows to retract).
-- A live pass's traces are new: their spans sit in the parts of the last few inserts, and the
-- parts merged earlier in the same hours hold none of them. The sorting keys cannot skip those
-- parts' granules (a pass's random ids fall in most trace id ranges of an hour's granules), so
-- the bloom filter decides, and at 0.001 a granule lets 1,000 ids through with probability
-- 1 - 0.999^1000 = 63 %: a pass of 1,000 requests read 707 of the 1,140 granules the key kept of
-- a 14 M-span part that held none of its traces. At 0.0001 it reads about a tenth (64 of 599 where 0.001 read
-- 359: one part of 7 M ids, 1,000 absent ids). Measured in a live pass of 1,000 requests over
-- 7 M spans of earlier traffic in the same hours: 281-445 ms of CPU instead of 590-821 (211-265
-- with no earlier traffic); the lookup among 7 M attribution rows: 84 ms instead of 223-268
-- (docs/benchmarks.md, "Live passes"). ClickHouse sizes the filter for at most this precision:
-- 0.00003 and 0.00001 built the same filter. The index grows by about a quarter (0.27 -> 0.34
-- bytes a span).
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
