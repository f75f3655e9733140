-- GENERATED from ../015_kv_transfer.sql by deploy/clickhouse/cluster/generate.py; do not edit.
-- Replicated local table + Distributed table under the single-node name.

ALTER TABLE latscope.latscope_attribution_local ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS KvTransferNs Nullable(Int64) CODEC(ZSTD(1)) AFTER ClockSkewNs;

ALTER TABLE latscope.latscope_attribution ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS KvTransferNs Nullable(Int64) AFTER ClockSkewNs;
