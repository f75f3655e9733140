-- Resources by id: latscope's collector stores each span's resource as an id beside its attributes
-- (LatscopeResourceId), and each resource's attributes once in latscope_resources, so the
-- attributor carries a number per request through its GROUP BY and looks the attributes up after
-- it, instead of copying every request's resource map into its per-trace state: the bigger the
-- resources (a Kubernetes pod's dozens of attributes), the more that saves
-- (bench/attribution/resources.py, docs/benchmarks.md).
--
-- LatscopeResourceId (ZSTD: a few ids repeat along the sort order, which ZSTD packs tighter
-- than LZ4): a 64-bit hash of the resource's attributes as the collector rendered them
-- (latscope.collector.mapping.resource_ids; never 0). 0: no id: other writers (the OpenTelemetry
-- Collector's ClickHouse exporter) and spans stored before this file. The attributor reads a
-- slice with any span of id 0 by its attributes.
--
-- latscope_resources: a resource's attributes by id, written by the collector before the first
-- spans of that resource it stores, and again at least every RESOURCE_REFRESH_S while it keeps
-- storing them, so Timestamp (the store's clock at the write) stays within that of any span's
-- LatscopeIngestedAt: the attributor reads the recent rows only. Nothing depends on a row being
-- there: a request whose resource the attributor does not find takes the general path, which
-- reads the attributes from the spans (the same row, at its cost). The table is tiny (a row per
-- resource and refresh); it is kept as long as the spans.
ALTER TABLE otel_traces
    ADD COLUMN IF NOT EXISTS LatscopeResourceId UInt64 DEFAULT 0 CODEC(ZSTD(1));
CREATE TABLE IF NOT EXISTS latscope_resources
(
    Timestamp          DateTime64(6) DEFAULT now64(6) CODEC(Delta, ZSTD(1)),
    ResourceId         UInt64 CODEC(LZ4),
    ResourceAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1))
)
ENGINE = ReplacingMergeTree(Timestamp)
PARTITION BY toDate(Timestamp)
ORDER BY ResourceId
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1;
