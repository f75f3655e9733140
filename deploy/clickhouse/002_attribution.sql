-- One row per attributed request: the seven buckets in ns (they sum to E2eNs), streaming figures,
-- tokens, skew and GPU figures. Written by the attributor, never by hand.
--
-- Re-attribution (late spans) inserts a new row with a higher Version; ReplacingMergeTree keeps the
-- newest per key and queries read with FINAL. The key's leading columns serve the aggregate
-- queries (service / model / time range); TraceId last makes it one row per request.
-- NetworkNs is NULL when no client span was seen (unknown, not zero).
CREATE TABLE IF NOT EXISTS latscope_attribution
(
    Timestamp          DateTime64(9) CODEC(Delta, ZSTD(1)),
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
    TtftClientNs       Nullable(UInt64) CODEC(T64, ZSTD(1)),
    TtftServerNs       Nullable(UInt64) CODEC(T64, ZSTD(1)),
    TpotNs             Nullable(Float64) CODEC(ZSTD(1)),
    ItlP50Ns           Nullable(Float64) CODEC(ZSTD(1)),
    ItlP99Ns           Nullable(Float64) CODEC(ZSTD(1)),
    ItlMaxNs           Nullable(Float64) CODEC(ZSTD(1)),
    Stalls             UInt32,
    InputTokens        Nullable(UInt32),
    OutputTokens       Nullable(UInt32),
    ClockSkewNs        Int64 CODEC(ZSTD(1)),
    Gpu                Map(LowCardinality(String), Float64) CODEC(ZSTD(1)),
    Version            UInt64
)
ENGINE = ReplacingMergeTree(Version)
PARTITION BY toDate(Timestamp)
ORDER BY (ServiceName, Model, toStartOfHour(Timestamp), TraceId)
SETTINGS index_granularity = 8192;
