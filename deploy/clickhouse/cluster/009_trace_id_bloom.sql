-- GENERATED from ../009_trace_id_bloom.sql by deploy/clickhouse/cluster/generate.py; do not edit.
-- Replicated local table + Distributed table under the single-node name.

ALTER TABLE latscope.otel_traces_local ON CLUSTER '{cluster}'
    DROP INDEX IF EXISTS idx_trace_id;

ALTER TABLE latscope.otel_traces_local ON CLUSTER '{cluster}'
    ADD INDEX IF NOT EXISTS idx_trace_id TraceId TYPE bloom_filter(0.0001) GRANULARITY 1;

ALTER TABLE latscope.otel_traces_local ON CLUSTER '{cluster}'
    MATERIALIZE INDEX idx_trace_id;

ALTER TABLE latscope.latscope_attribution_local ON CLUSTER '{cluster}'
    DROP INDEX IF EXISTS idx_trace_id;

ALTER TABLE latscope.latscope_attribution_local ON CLUSTER '{cluster}'
    ADD INDEX IF NOT EXISTS idx_trace_id TraceId TYPE bloom_filter(0.0001) GRANULARITY 1;

ALTER TABLE latscope.latscope_attribution_local ON CLUSTER '{cluster}'
    MATERIALIZE INDEX idx_trace_id;
