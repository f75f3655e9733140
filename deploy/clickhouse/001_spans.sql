-- Spans, in the column layout of the OpenTelemetry Collector's ClickHouse exporter (otel_traces),
-- so Grafana's ClickHouse trace view and an existing Collector -> ClickHouse pipeline both read it.
--
-- Key and codecs: nearly every read is "all spans of these trace ids" (attributor, trace view),
-- usually with a rough time, or "spans in a time range". Partitions are days (time ranges prune
-- whole days and TTLs drop whole parts); inside a day rows sort by hour, then trace id, so a
-- trace's spans sit together (a trace-id lookup reads one granule per hour it spans, helped by the
-- bloom filter when no time is given) and ids, timestamps and attributes repeated within a
-- trace compress well.
--
-- Codecs and indexes are chosen for ingest cost at about 43 bytes per span (docs/benchmarks.md,
-- "Collector"): every insert compresses each column once and every merge decompresses and
-- compresses it again, and ZSTD costs about twice LZ4 there. ZSTD(1) is kept where it buys
-- the bytes (random ids, timestamps, durations, span attributes); the rest, low-cardinality or
-- repeated within a trace, is as small or smaller with LZ4, and merges cheaper. The OTel
-- exporter's bloom filters on map keys and minmax on Duration are left out: with this sort order
-- every granule holds every common key and a spread of durations, so they skip no granule (and
-- slow mapContains down), while they cost every insert and every merge.
--
-- Exactly-once writes: the collector tags every batch with an insert_deduplication_token and
-- replays a spooled batch with the same token, so the deduplication window below drops a batch
-- that was already stored (for a ReplicatedMergeTree the window is replicated_deduplication_window).
-- Chosen over a ReplacingMergeTree keyed by (TraceId, SpanId) because dedup tokens drop the
-- repeat at insert time: every read sees each span once without FINAL or a GROUP BY, merges stay
-- cheap, and a span legitimately re-sent by an SDK (same ids, new content) is not silently merged
-- away. The window keeps the last 10000 tokens; it must cover the inserts between a batch that
-- reached ClickHouse unseen (the insert timed out) and that batch's replay. Batches go to the
-- spool while it is non-empty and replay in order, so those are at most the spool's batches
-- ahead of it; a crash between a replayed insert and its file's removal repeats only that batch.
CREATE TABLE IF NOT EXISTS otel_traces
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
ENGINE = MergeTree
PARTITION BY toDate(Timestamp)
ORDER BY (toStartOfHour(Timestamp), TraceId, Timestamp)
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1, non_replicated_deduplication_window = 10000;
