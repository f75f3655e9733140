-- Hourly rollups of the attribution table, so that a summary, tail or comparison over days of
-- requests reads a few thousand rollup rows instead of millions of attributed requests with FINAL.
-- Built and kept fresh by latscope.attribution.rollups (a background component next to the
-- attributor); queries merge the hours wholly inside their window from here and read the rest (the
-- window's partial edge hours, hours not built yet, hours changed since their build) from
-- latscope_attribution with FINAL. docs/attribution.md, "Rollups", has the whole argument.
--
-- When each attribution row was written (the store's clock, at insert). A rollup hour is built
-- from every row visible at its build and records a cutoff (BuiltAt): an hour with any row written
-- after its cutoff (a re-attribution, a tombstone, a late request) is read raw until rebuilt.
-- Rows written before this column existed have it as the time the projection below was
-- materialized, of the read, or of the merge that rewrites them: always later than their insert,
-- so at worst their hours are read raw until rebuilt.
ALTER TABLE latscope_attribution
    ADD COLUMN IF NOT EXISTS AttributedAt DateTime64(6, 'UTC') DEFAULT now64(6) CODEC(Delta, ZSTD(1));

-- Newest write per hour, kept by ClickHouse per part: answers "which hours changed since their
-- build" from a few rows per part. ReplacingMergeTree needs the projection rebuilt when a merge
-- drops replaced rows; the newest version and tombstones survive such merges, so an hour's newest
-- write time never goes back below a build it invalidated.
ALTER TABLE latscope_attribution MODIFY SETTING deduplicate_merge_projection_mode = 'rebuild';

ALTER TABLE latscope_attribution
    ADD PROJECTION IF NOT EXISTS hours_written
    (SELECT toStartOfHour(Timestamp), max(AttributedAt), count() GROUP BY toStartOfHour(Timestamp));

ALTER TABLE latscope_attribution MATERIALIZE PROJECTION hours_written;

-- One row per hour, grouping level (Dims) and group. Dims says which of ServiceName, Model, Route,
-- Operation, StatusCode the row is grouped by (bits 16, 8, 4, 2, 1; the others are ''): 0 (the
-- whole hour), 16, 8, 24 (service and/or model), 28, 26, 25 (service, model and one of route,
-- operation, status). A query reads the smallest level that has its filters and group_by.
--
-- A build of an hour writes all its rows in one INSERT, each with the build's cutoff (BuiltAt,
-- also the ReplacingMergeTree version, so a newer build replaces an older one's rows) and the
-- number of rows it wrote for that hour (BuildRows): an hour is usable only while its newest
-- build has all its rows, so a build cut short is never read, and an older build partly replaced
-- is not either.
--
-- Counts and sums are exact (means and shares are sums / counts). Percentiles come from the
-- histograms: HistKeys are metric * 4096 + bin (metrics in latscope.attribution.rollups.METRICS;
-- bin 0 holds values below 1 ns, bin b >= 1 holds [g^(b-1), g^b) ns with g = 1.005 / 0.995), so
-- reading a percentile off the merged bins is within 0.5 % of the exact one. The Tail* arrays are
-- the e2e histogram (same bins) with each bucket's sum per bin, for the tail question; they are
-- filled at levels 0, 8, 16 and 24 only (the tail filters by service and model, never groups).
CREATE TABLE IF NOT EXISTS latscope_attribution_hourly
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
ENGINE = ReplacingMergeTree(BuiltAt)
PARTITION BY toDate(Timestamp)
ORDER BY (Dims, ServiceName, Model, Timestamp, Route, Operation, StatusCode)
SETTINGS index_granularity = 1024;
