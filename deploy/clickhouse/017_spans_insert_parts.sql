-- The collector's inserts as compact parts, written in compression blocks of at most 256 KiB.
--
-- A part under min_bytes_for_wide_part is written compact: its columns in one data file instead
-- of two or three files per column (this table's 30-odd columns, their map, nested and
-- LowCardinality streams). Every insert makes a part and a batch of spans is larger than
-- ClickHouse's 10 MiB default, so raising the threshold to 64 MiB writes inserts compact: less
-- of the collector's CPU and about half the memory while an insert runs. Merges into parts over
-- 64 MiB write them wide, so the parts queries read most stay wide.
--
-- max_compress_block_size: every stream an insert or a merge writes, and every part a merge
-- reads, holds buffers of up to this much (1 MiB by default, per stream and per part); with
-- spans that carry prompts that is what bounds a merge's memory. The bytes stored are the same.
ALTER TABLE otel_traces MODIFY SETTING
    min_bytes_for_wide_part = 67108864, max_compress_block_size = 262144;
