-- GENERATED from ../001_spans.sql by deploy/clickhouse/cluster/generate.py; do not edit.
-- Replicated local table + Distributed table under the single-node name.

CREATE TABLE IF NOT EXISTS latscope.otel_traces_local ON CLUSTER '{cluster}'
(
    Timestamp          DateTime64(9) CODEC(Delta, ZSTD(1)),
    TraceId            String CODEC(ZSTD(1)),
    SpanId             String CODEC(ZSTD(1)),
    ParentSpanId       String CODEC(ZSTD(1)),
    TraceState         String CODEC(LZ4),
    SpanName           LowCardinality(String) CODEC(LZ4),
    SpanKind           LowCardinality(String) CODEC(LZ4),
    ServiceName        LowCardinality(String) CODEC(LZ4),
    ResourceAttributes Map(LowCardinality(String), String) CODEC(LZ4),
    ScopeName          String CODEC(LZ4),
    ScopeVersion       String CODEC(LZ4),
    SpanAttributes     Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    Duration           UInt64 CODEC(T64, ZSTD(1)),
    StatusCode         LowCardinality(String) CODEC(LZ4),
    StatusMessage      String CODEC(LZ4),
    Events Nested
    (
        Timestamp  DateTime64(9),
        Name       LowCardinality(String),
        Attributes Map(LowCardinality(String), String)
    ) CODEC(LZ4),
    Links Nested
    (
        TraceId    String,
        SpanId     String,
        TraceState String,
        Attributes Map(LowCardinality(String), String)
    ) CODEC(LZ4),
    INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/latscope/otel_traces_local', '{replica}')
PARTITION BY toDate(Timestamp)
ORDER BY (toStartOfHour(Timestamp), TraceId, Timestamp)
TTL toDateTime(Timestamp) + INTERVAL 30 DAY
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1, replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS latscope.otel_traces ON CLUSTER '{cluster}'
AS latscope.otel_traces_local
ENGINE = Distributed('{cluster}', 'latscope', 'otel_traces_local', cityHash64(TraceId));
