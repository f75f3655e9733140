-- One row per attributed request: the seven buckets in ns (they sum to E2eNs), streaming figures,
-- tokens, skew and GPU figures. Written by the attributor (latscope.attribution.attributor), never
-- by hand.
--
-- Re-attribution. Late spans make the attributor compute the request again and insert a new row
-- with a higher Version (the number of distinct spans it saw, so a re-run over the same spans
-- writes the same row with the same Version: idempotent). ReplacingMergeTree keeps the newest row
-- per sorting key, and queries read with FINAL. A late client span moves the request's start
-- (Timestamp) and may change Model, i.e. the row's key, so the new row would not replace the old
-- one: for those the attributor also inserts a tombstone, a copy of the old key with IsDeleted = 1
-- and the new Version, and FINAL drops both the old row and the tombstone. The hourly rollups
-- (004_rollups.sql) are built from FINAL reads, and not read for an hour written to since.
--
-- Timestamp is in UTC so that the key's hour (toStartOfHour) is the same in Python and SQL.
--
-- The key's leading columns serve the aggregate queries (service / model / time range); TraceId
-- last makes it one row per request. NetworkNs is NULL when no client span was seen (unknown, not
-- zero). SpansIngestedAt is the attributor's watermark (an ingest time) once the row's batch was
-- written: every span ingested up to it had been seen, so a restarted attributor resumes from the
-- maximum.
CREATE TABLE IF NOT EXISTS latscope_attribution
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
ENGINE = ReplacingMergeTree(Version, IsDeleted)
PARTITION BY toDate(Timestamp)
ORDER BY (ServiceName, Model, toStartOfHour(Timestamp), TraceId)
SETTINGS index_granularity = 8192;

-- When each span reached the store: the attributor finds new and late spans by this, not by the
-- span's own (client-clock, possibly old) Timestamp. A column with a default, so the OTel
-- Collector's ClickHouse exporter and the latscope collector insert without naming it.
-- Parts are written in ingest order, so a minmax index lets "spans ingested since T" skip old
-- granules instead of scanning the column.
ALTER TABLE otel_traces
    ADD COLUMN IF NOT EXISTS LatscopeIngestedAt DateTime64(6) DEFAULT now64(6) CODEC(Delta, ZSTD(1));

ALTER TABLE otel_traces
    ADD INDEX IF NOT EXISTS idx_latscope_ingested LatscopeIngestedAt TYPE minmax GRANULARITY 1;
