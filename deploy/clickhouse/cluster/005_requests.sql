-- GENERATED from ../005_requests.sql by deploy/clickhouse/cluster/generate.py; do not edit.
-- Replicated local table + Distributed table under the single-node name.

ALTER TABLE latscope.latscope_attribution_local ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS RequestSpanId String CODEC(ZSTD(1)) AFTER TraceId,
    MODIFY ORDER BY (ServiceName, Model, toStartOfHour(Timestamp), TraceId, RequestSpanId);

ALTER TABLE latscope.latscope_attribution ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS RequestSpanId String AFTER TraceId;

ALTER TABLE latscope.latscope_attribution_local ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS Provider LowCardinality(String) AFTER Model;

ALTER TABLE latscope.latscope_attribution ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS Provider LowCardinality(String) AFTER Model;
