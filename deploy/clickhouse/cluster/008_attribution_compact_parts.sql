-- GENERATED from ../008_attribution_compact_parts.sql by deploy/clickhouse/cluster/generate.py; do not edit.
-- Replicated local table + Distributed table under the single-node name.

ALTER TABLE latscope.latscope_attribution_local ON CLUSTER '{cluster}'
    MODIFY SETTING min_bytes_for_wide_part = 67108864;
