-- GENERATED from ../018_spans_merge_width.sql by deploy/clickhouse/cluster/generate.py; do not edit.
-- Replicated local table + Distributed table under the single-node name.

ALTER TABLE latscope.otel_traces_local ON CLUSTER '{cluster}'
    MODIFY SETTING merge_selector_base = 10;
