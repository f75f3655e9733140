-- GENERATED from ../007_spans_fsync.sql by deploy/clickhouse/cluster/generate.py; do not edit.
-- Replicated local table + Distributed table under the single-node name.

ALTER TABLE latscope.otel_traces_local ON CLUSTER '{cluster}'
    MODIFY SETTING fsync_after_insert = 1, fsync_part_directory = 1;
