-- GENERATED from ../002_attribution.sql by deploy/clickhouse/cluster/generate.py; do not edit.
-- Replicated local table + Distributed table under the single-node name.

CREATE TABLE IF NOT EXISTS latscope.latscope_attribution_local ON CLUSTER '{cluster}'
(
    Timestamp          DateTime64(9, 'UTC') CODEC(Delta, ZSTD(1)),
    TraceId            String CODEC(ZSTD(1)),
    ServiceName        LowCardinality(String),
    Model              LowCardinality(String),
    Operation          LowCardinality(String),
    Route              LowCardinality(String),
    ResourceAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    StatusCode         LowCardinality(String),
    HasClient          Bool,
    Attempts           UInt16,
    E2eNs              UInt64 CODEC(T64, ZSTD(1)),
    NetworkNs          Nullable(UInt64) CODEC(T64, ZSTD(1)),
    QueueNs            UInt64 CODEC(T64, ZSTD(1)),
    PreprocessNs       UInt64 CODEC(T64, ZSTD(1)),
    PrefillNs          UInt64 CODEC(T64, ZSTD(1)),
    DecodeNs           UInt64 CODEC(T64, ZSTD(1)),
    PostprocessNs      UInt64 CODEC(T64, ZSTD(1)),
    OtherNs            UInt64 CODEC(T64, ZSTD(1)),
    TtftClientNs       Nullable(Int64) CODEC(ZSTD(1)),
    TtftServerNs       Nullable(Int64) CODEC(ZSTD(1)),
    TpotNs             Nullable(Float64) CODEC(ZSTD(1)),
    ItlP50Ns           Nullable(Float64) CODEC(ZSTD(1)),
    ItlP99Ns           Nullable(Float64) CODEC(ZSTD(1)),
    ItlMaxNs           Nullable(Float64) CODEC(ZSTD(1)),
    Stalls             UInt32,
    InputTokens        Nullable(UInt32),
    OutputTokens       Nullable(UInt32),
    ClockSkewNs        Int64 CODEC(ZSTD(1)),
    Gpu                Map(LowCardinality(String), Float64) CODEC(ZSTD(1)),
    SpanCount          UInt32,
    SpansIngestedAt    DateTime64(6) CODEC(Delta, ZSTD(1)),
    Version            UInt64,
    IsDeleted          UInt8,
    INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/latscope/latscope_attribution_local', '{replica}', Version, IsDeleted)
PARTITION BY toDate(Timestamp)
ORDER BY (ServiceName, Model, toStartOfHour(Timestamp), TraceId)
TTL toDateTime(Timestamp) + INTERVAL 90 DAY
SETTINGS index_granularity = 8192;

CREATE TABLE IF NOT EXISTS latscope.latscope_attribution ON CLUSTER '{cluster}'
AS latscope.latscope_attribution_local
ENGINE = Distributed('{cluster}', 'latscope', 'latscope_attribution_local', cityHash64(TraceId));

ALTER TABLE latscope.otel_traces_local ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS LatscopeIngestedAt DateTime64(6) DEFAULT now64(6) CODEC(Delta, ZSTD(1));

ALTER TABLE latscope.otel_traces ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS LatscopeIngestedAt DateTime64(6) DEFAULT now64(6);

ALTER TABLE latscope.otel_traces_local ON CLUSTER '{cluster}'
    ADD INDEX IF NOT EXISTS idx_latscope_ingested LatscopeIngestedAt TYPE minmax GRANULARITY 1;
