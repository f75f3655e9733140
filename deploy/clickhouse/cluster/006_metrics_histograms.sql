-- GENERATED from ../006_metrics_histograms.sql by deploy/clickhouse/cluster/generate.py; do not edit.
-- Replicated local table + Distributed table under the single-node name.

CREATE TABLE IF NOT EXISTS latscope.latscope_metrics_histogram_local ON CLUSTER '{cluster}'
(
    Timestamp              DateTime64(9) CODEC(Delta, ZSTD(1)),
    StartTimeUnix          DateTime64(9) CODEC(Delta, ZSTD(1)),
    ServiceName            LowCardinality(String),
    MetricName             LowCardinality(String),
    MetricDescription      String CODEC(ZSTD(1)),
    Unit                   LowCardinality(String),
    Attributes             Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    ResourceAttributes     Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    ScopeName              String CODEC(ZSTD(1)),
    ScopeVersion           String CODEC(ZSTD(1)),
    Count                  UInt64 CODEC(Delta, ZSTD(1)),
    Sum                    Nullable(Float64) CODEC(ZSTD(1)),
    Min                    Nullable(Float64) CODEC(ZSTD(1)),
    Max                    Nullable(Float64) CODEC(ZSTD(1)),
    BucketCounts           Array(UInt64) CODEC(ZSTD(1)),
    ExplicitBounds         Array(Float64) CODEC(ZSTD(1)),
    `Exemplars.Timestamp`  Array(DateTime64(9)) CODEC(ZSTD(1)),
    `Exemplars.Value`      Array(Float64) CODEC(ZSTD(1)),
    `Exemplars.TraceId`    Array(String) CODEC(ZSTD(1)),
    `Exemplars.SpanId`     Array(String) CODEC(ZSTD(1)),
    `Exemplars.FilteredAttributes` Array(Map(LowCardinality(String), String)) CODEC(ZSTD(1)),
    Flags                  UInt32 CODEC(ZSTD(1)),
    AggregationTemporality Int32 CODEC(ZSTD(1))
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/latscope/latscope_metrics_histogram_local', '{replica}')
PARTITION BY toDate(Timestamp)
ORDER BY (ServiceName, MetricName, Timestamp)
TTL toDateTime(Timestamp) + INTERVAL 30 DAY
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1, replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS latscope.latscope_metrics_histogram ON CLUSTER '{cluster}'
AS latscope.latscope_metrics_histogram_local
ENGINE = Distributed('{cluster}', 'latscope', 'latscope_metrics_histogram_local', rand());

CREATE TABLE IF NOT EXISTS latscope.latscope_metrics_exponential_histogram_local ON CLUSTER '{cluster}'
(
    Timestamp              DateTime64(9) CODEC(Delta, ZSTD(1)),
    StartTimeUnix          DateTime64(9) CODEC(Delta, ZSTD(1)),
    ServiceName            LowCardinality(String),
    MetricName             LowCardinality(String),
    MetricDescription      String CODEC(ZSTD(1)),
    Unit                   LowCardinality(String),
    Attributes             Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    ResourceAttributes     Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    ScopeName              String CODEC(ZSTD(1)),
    ScopeVersion           String CODEC(ZSTD(1)),
    Count                  UInt64 CODEC(Delta, ZSTD(1)),
    Sum                    Nullable(Float64) CODEC(ZSTD(1)),
    Min                    Nullable(Float64) CODEC(ZSTD(1)),
    Max                    Nullable(Float64) CODEC(ZSTD(1)),
    Scale                  Int32 CODEC(ZSTD(1)),
    ZeroCount              UInt64 CODEC(ZSTD(1)),
    ZeroThreshold          Float64 CODEC(ZSTD(1)),
    PositiveOffset         Int32 CODEC(ZSTD(1)),
    PositiveBucketCounts   Array(UInt64) CODEC(ZSTD(1)),
    NegativeOffset         Int32 CODEC(ZSTD(1)),
    NegativeBucketCounts   Array(UInt64) CODEC(ZSTD(1)),
    `Exemplars.Timestamp`  Array(DateTime64(9)) CODEC(ZSTD(1)),
    `Exemplars.Value`      Array(Float64) CODEC(ZSTD(1)),
    `Exemplars.TraceId`    Array(String) CODEC(ZSTD(1)),
    `Exemplars.SpanId`     Array(String) CODEC(ZSTD(1)),
    `Exemplars.FilteredAttributes` Array(Map(LowCardinality(String), String)) CODEC(ZSTD(1)),
    Flags                  UInt32 CODEC(ZSTD(1)),
    AggregationTemporality Int32 CODEC(ZSTD(1))
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/latscope/latscope_metrics_exponential_histogram_local', '{replica}')
PARTITION BY toDate(Timestamp)
ORDER BY (ServiceName, MetricName, Timestamp)
TTL toDateTime(Timestamp) + INTERVAL 30 DAY
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1, replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS latscope.latscope_metrics_exponential_histogram ON CLUSTER '{cluster}'
AS latscope.latscope_metrics_exponential_histogram_local
ENGINE = Distributed('{cluster}', 'latscope', 'latscope_metrics_exponential_histogram_local', rand());

ALTER TABLE latscope.latscope_metrics_local ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS StartTimeUnix DateTime64(9) CODEC(Delta, ZSTD(1));

ALTER TABLE latscope.latscope_metrics ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS StartTimeUnix DateTime64(9);

ALTER TABLE latscope.latscope_metrics_local ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS AggregationTemporality Int32 CODEC(ZSTD(1));

ALTER TABLE latscope.latscope_metrics ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS AggregationTemporality Int32;

ALTER TABLE latscope.latscope_metrics_local ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS IsMonotonic Bool CODEC(ZSTD(1));

ALTER TABLE latscope.latscope_metrics ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS IsMonotonic Bool;
