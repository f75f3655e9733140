-- GENERATED from ../003_metrics.sql by deploy/clickhouse/cluster/generate.py; do not edit.
-- Replicated local table + Distributed table under the single-node name.

CREATE TABLE IF NOT EXISTS latscope.latscope_metrics_local ON CLUSTER '{cluster}'
(
    Timestamp          DateTime64(9) CODEC(Delta, ZSTD(1)),
    ServiceName        LowCardinality(String),
    MetricName         LowCardinality(String),
    MetricKind         LowCardinality(String),
    Unit               LowCardinality(String),
    Value              Float64 CODEC(Gorilla, ZSTD(1)),
    Attributes         Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    ResourceAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    GpuUuid            LowCardinality(String) MATERIALIZED Attributes['gpu.uuid'],
    GpuIndex           String MATERIALIZED Attributes['gpu.index']
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/latscope/latscope_metrics_local', '{replica}')
PARTITION BY toDate(Timestamp)
ORDER BY (ServiceName, MetricName, GpuUuid, Timestamp)
TTL toDateTime(Timestamp) + INTERVAL 30 DAY
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1, replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS latscope.latscope_metrics ON CLUSTER '{cluster}'
AS latscope.latscope_metrics_local
ENGINE = Distributed('{cluster}', 'latscope', 'latscope_metrics_local', rand());
