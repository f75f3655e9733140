-- One row per inference call, not per trace: an agent run or a RAG pipeline makes several calls
-- in one trace, each attributed on its own (docs/attribution.md, "Which spans make a request").
-- A request is named by its trace id and RequestSpanId, its client span's id (its server span's
-- when no client span was seen), so the sorting key (and so ReplacingMergeTree's replacement and
-- the attributor's tombstones) is per call. Rows written before this file have RequestSpanId '':
-- the attributor's next pass over their trace writes the per-call rows and retracts the old key
-- with a tombstone, as for any request whose key moved.
--
-- A new column can join the end of the sorting key only in the ALTER that adds it, and only
-- without a default expression (a String's default is '' anyway).
ALTER TABLE latscope_attribution
    ADD COLUMN IF NOT EXISTS RequestSpanId String CODEC(ZSTD(1)) AFTER TraceId,
    MODIFY ORDER BY (ServiceName, Model, toStartOfHour(Timestamp), TraceId, RequestSpanId);

-- gen_ai.provider.name (or the deprecated gen_ai.system): which provider served the call.
ALTER TABLE latscope_attribution
    ADD COLUMN IF NOT EXISTS Provider LowCardinality(String) AFTER Model;
