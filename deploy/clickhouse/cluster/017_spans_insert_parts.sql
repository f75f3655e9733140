-- GENERATED from ../017_spans_insert_parts.sql by deploy/clickhouse/cluster/generate.py; do not edit.
-- Replicated local table + Distributed table under the single-node name.

ALTER TABLE latscope.otel_traces_local ON CLUSTER '{cluster}'
    MODIFY SETTING
    min_bytes_for_wide_part = 67108864, max_compress_block_size = 262144;
