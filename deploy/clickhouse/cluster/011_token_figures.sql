-- GENERATED from ../011_token_figures.sql by deploy/clickhouse/cluster/generate.py; do not edit.
-- Replicated local table + Distributed table under the single-node name.

ALTER TABLE latscope.otel_traces_local ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS LatscopeTokenFigures Array(Float64) DEFAULT [] CODEC(ZSTD(1));

ALTER TABLE latscope.otel_traces ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS LatscopeTokenFigures Array(Float64) DEFAULT [];
