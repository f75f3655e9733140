-- GENERATED from ../012_resource_ids.sql by deploy/clickhouse/cluster/generate.py; do not edit.
-- Replicated local table + Distributed table under the single-node name.

ALTER TABLE latscope.otel_traces_local ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS LatscopeResourceId UInt64 DEFAULT 0 CODEC(ZSTD(1));

ALTER TABLE latscope.otel_traces ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS LatscopeResourceId UInt64 DEFAULT 0;

CREATE TABLE IF NOT EXISTS latscope.latscope_resources_local ON CLUSTER '{cluster}'
(
    Timestamp          DateTime64(6) DEFAULT now64(6) CODEC(Delta, ZSTD(1)),
    ResourceId         UInt64 CODEC(LZ4),
    ResourceAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1))
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/all/latscope/latscope_resources_local', '{shard}-{replica}', Timestamp)
PARTITION BY toDate(Timestamp)
ORDER BY ResourceId
TTL toDateTime(Timestamp) + INTERVAL 30 DAY
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1;

CREATE TABLE IF NOT EXISTS latscope.latscope_resources ON CLUSTER '{cluster}'
AS latscope.latscope_resources_local
ENGINE = Distributed('{cluster}', 'latscope', 'latscope_resources_local', rand());
