-- Gauge and sum data points received on OTLP MetricsService/Export: the SDK's NVML samples
-- (gpu.uuid / gpu.index attributes) and any other metric. GPU columns are lifted out of the
-- attributes so per-GPU queries use the sort key. Batches carry insert_deduplication_tokens like
-- the spans (see 001_spans.sql), so a replayed batch is stored once.
CREATE TABLE IF NOT EXISTS latscope_metrics
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
ENGINE = MergeTree
PARTITION BY toDate(Timestamp)
ORDER BY (ServiceName, MetricName, GpuUuid, Timestamp)
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1, non_replicated_deduplication_window = 10000;
