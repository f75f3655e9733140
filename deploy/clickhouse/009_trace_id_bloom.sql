-- The trace id's bloom filter at the finest precision ClickHouse builds (001 made it 0.001).
--
-- Each attributor pass reads the spans of its traces (`TraceId IN <the pass's ids>`). A live
-- pass's traces are new: their spans sit in the parts of the last few inserts, and the parts
-- merged earlier in the same hours hold none of them. The primary key cannot skip those parts'
-- granules (a pass's random ids fall in most of the trace id ranges of an hour's granules), so
-- the bloom filter decides, and at 0.001 a granule lets 1,000 ids through with probability
-- 1 - 0.999^1000 = 63 %: a pass of 1,000 requests read 707 of 1,140 granules of a 7 M-span part
-- that held none of its traces. At 0.0001 it read 64 of 599 where 0.001 read 359 (one part of
-- 7 M ids, 1,000 absent ids), and a live pass over 7 M spans of earlier traffic in the same
-- hours cost 348 ms of CPU instead of 627 (239 with no earlier traffic; docs/benchmarks.md,
-- "Live passes"). ClickHouse sizes the filter for at most this precision: 0.00003 and 0.00001
-- built the same filter. The index grows by about a quarter (0.27 -> 0.34 bytes a span).
--
-- Parts stored before this file get the new filter from MATERIALIZE INDEX, a mutation that runs
-- in the background; until it reaches a part, that part is read without a trace id filter (the
-- primary key still skips what it can).
ALTER TABLE otel_traces DROP INDEX IF EXISTS idx_trace_id;

ALTER TABLE otel_traces
    ADD INDEX IF NOT EXISTS idx_trace_id TraceId TYPE bloom_filter(0.0001) GRANULARITY 1;

ALTER TABLE otel_traces MATERIALIZE INDEX idx_trace_id;
