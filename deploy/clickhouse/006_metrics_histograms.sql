-- OTLP histogram and exponential-histogram data points: every GenAI semantic-convention metric
-- (gen_ai.server.time_to_first_token, gen_ai.client.operation.duration, ...) is a histogram.
-- One table per kind with the columns of the OpenTelemetry Collector's ClickHouse exporter
-- (otel_metrics_histogram, otel_metrics_exponential_histogram: Count, Sum, BucketCounts,
-- ExplicitBounds, Scale, ZeroCount, Positive*/Negative* buckets, Exemplars.*, Flags, Min, Max,
-- AggregationTemporality as the OTLP enum number: 1 delta, 2 cumulative), under latscope's own
-- names for what latscope_metrics already has (Timestamp, Unit), so retention and queries treat
-- the three metric tables alike. Two departures, both for honesty: Sum, Min and Max are
-- Nullable (OTLP makes them optional; the exporter stores 0), and the scope and start time
-- keep their OTLP names. Batches carry insert_deduplication_tokens like the spans, so a
-- replayed batch is stored once.
CREATE TABLE IF NOT EXISTS latscope_metrics_histogram
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
ENGINE = MergeTree
PARTITION BY toDate(Timestamp)
ORDER BY (ServiceName, MetricName, Timestamp)
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1, non_replicated_deduplication_window = 10000;

-- Base-2 exponential buckets: bucket i of a side holds values in (2^((offset+i)*2^-scale),
-- 2^((offset+i+1)*2^-scale)]; ZeroCount counts values within ZeroThreshold of zero.
CREATE TABLE IF NOT EXISTS latscope_metrics_exponential_histogram
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
ENGINE = MergeTree
PARTITION BY toDate(Timestamp)
ORDER BY (ServiceName, MetricName, Timestamp)
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1, non_replicated_deduplication_window = 10000;

-- Sums were stored as bare values; a delta sum and a cumulative one cannot be read alike, so
-- they now carry what the exporter's otel_metrics_sum does (the existing rows read 0 / false /
-- the epoch: unknown).
ALTER TABLE latscope_metrics
    ADD COLUMN IF NOT EXISTS StartTimeUnix DateTime64(9) CODEC(Delta, ZSTD(1));

ALTER TABLE latscope_metrics
    ADD COLUMN IF NOT EXISTS AggregationTemporality Int32 CODEC(ZSTD(1));

ALTER TABLE latscope_metrics
    ADD COLUMN IF NOT EXISTS IsMonotonic Bool CODEC(ZSTD(1));
