-- The attributor's inserts as compact parts. A part under min_bytes_for_wide_part is written
-- compact: its columns in one data file instead of two or three files per column (this table's
-- 40-odd columns, their null maps, map and LowCardinality streams, made ~146 files for a wide
-- part). Every pass inserts a part, and a catch-up batch of 100,000 rows is ~33 MB uncompressed,
-- over ClickHouse's 10 MiB default: creating those files would be most of the insert's cost.
-- Merges into parts over 64 MiB (~200,000
-- rows) write them wide, so the parts queries read most stay wide.
ALTER TABLE latscope_attribution MODIFY SETTING min_bytes_for_wide_part = 67108864;
