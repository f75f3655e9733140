-- The collector's inserts as compact parts, written in compression blocks of at most 256 KiB.
--
-- A part under min_bytes_for_wide_part is written compact: its columns in one data file instead
-- of two or three files per column (this table's 30-odd columns, their map, nested and
-- LowCardinality streams). Every insert makes a part, and a batch of 20,000 spans is ~15 MB
-- uncompressed, over ClickHouse's 10 MiB default: writing it compact costs ~15 % less of the
-- collector's CPU (docs/benchmarks.md, "Collector") and holds half the memory while it runs
-- (an insert of 32 MB of spans that carry prompts: 282 MB wide, 131 MB compact).
-- Merges into parts over 64 MiB write them wide, so the parts queries read most stay wide.
--
-- max_compress_block_size: every stream an insert or a merge writes, and every part a merge
-- reads, holds buffers of up to this much (1 MiB by default, per stream and per part): with
-- spans that carry prompts (32 kB each) a merge of 8 parts held 402 MB at 1 MiB, 282 MB at
-- 256 KiB, and a compact insert of 32 MB 123 MB. The bytes stored are the same.
ALTER TABLE otel_traces MODIFY SETTING
    min_bytes_for_wide_part = 67108864, max_compress_block_size = 262144;
