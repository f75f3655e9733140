-- GENERATED from ../004_rollups.sql by deploy/clickhouse/cluster/generate.py; do not edit.
-- Replicated local table + Distributed table under the single-node name.

ALTER TABLE latscope.latscope_attribution_local ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS AttributedAt DateTime64(6, 'UTC') DEFAULT now64(6) CODEC(Delta, ZSTD(1));

ALTER TABLE latscope.latscope_attribution ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS AttributedAt DateTime64(6, 'UTC') DEFAULT now64(6);

ALTER TABLE latscope.latscope_attribution_local ON CLUSTER '{cluster}'
    MODIFY SETTING deduplicate_merge_projection_mode = 'rebuild';

ALTER TABLE latscope.latscope_attribution_local ON CLUSTER '{cluster}'
    ADD PROJECTION IF NOT EXISTS hours_written
    (SELECT toStartOfHour(Timestamp), max(AttributedAt), count() GROUP BY toStartOfHour(Timestamp));

ALTER TABLE latscope.latscope_attribution_local ON CLUSTER '{cluster}'
    MATERIALIZE PROJECTION hours_written;

CREATE TABLE IF NOT EXISTS latscope.latscope_attribution_hourly_local ON CLUSTER '{cluster}'
(
    Timestamp        DateTime64(0, 'UTC'),
    Dims             UInt8,
    ServiceName      LowCardinality(String),
    Model            LowCardinality(String),
    Route            LowCardinality(String),
    Operation        LowCardinality(String),
    StatusCode       LowCardinality(String),
    BuiltAt          DateTime64(6, 'UTC'),
    BuildRows        UInt32,
    Requests         UInt64,
    WithClient       UInt64,
    E2eSum           UInt64,
    NetworkSum       UInt64,
    NetworkCount     UInt64,
    QueueSum         UInt64,
    PreprocessSum    UInt64,
    PrefillSum       UInt64,
    DecodeSum        UInt64,
    PostprocessSum   UInt64,
    OtherSum         UInt64,
    TtftSum          Int64,
    TtftCount        UInt64,
    TpotSum          Float64,
    TpotCount        UInt64,
    ItlMax           Nullable(Float64),
    StallsSum        UInt64,
    StalledRequests  UInt64,
    HistKeys         Array(UInt16) CODEC(Delta, ZSTD(1)),
    HistCounts       Array(UInt32) CODEC(ZSTD(1)),
    TailBins         Array(UInt16) CODEC(Delta, ZSTD(1)),
    TailRequests     Array(UInt32) CODEC(ZSTD(1)),
    TailE2e          Array(UInt64) CODEC(ZSTD(1)),
    TailNetwork      Array(UInt64) CODEC(ZSTD(1)),
    TailQueue        Array(UInt64) CODEC(ZSTD(1)),
    TailPreprocess   Array(UInt64) CODEC(ZSTD(1)),
    TailPrefill      Array(UInt64) CODEC(ZSTD(1)),
    TailDecode       Array(UInt64) CODEC(ZSTD(1)),
    TailPostprocess  Array(UInt64) CODEC(ZSTD(1)),
    TailOther        Array(UInt64) CODEC(ZSTD(1))
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/latscope/latscope_attribution_hourly_local', '{replica}', BuiltAt)
PARTITION BY toDate(Timestamp)
ORDER BY (Dims, ServiceName, Model, Timestamp, Route, Operation, StatusCode)
TTL toDateTime(Timestamp) + INTERVAL 90 DAY
SETTINGS index_granularity = 1024;

CREATE TABLE IF NOT EXISTS latscope.latscope_attribution_hourly ON CLUSTER '{cluster}'
AS latscope.latscope_attribution_hourly_local
ENGINE = Distributed('{cluster}', 'latscope', 'latscope_attribution_hourly_local', rand());
