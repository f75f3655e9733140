-- The KV-cache transfer of a disaggregated request (a prefill worker and a decode worker: SGLang's
-- prefill_transfer_kv_cache and decode_transferred stages), named per request: the time in a
-- transfer stage that no phase covers (docs/attribution.md, "The sweep and the overlap
-- priority"). It is part of OtherNs, so the seven buckets still add up to E2eNs. NULL where no
-- transfer was recorded (every request not disaggregated, and the rows written before this file).
ALTER TABLE latscope_attribution
    ADD COLUMN IF NOT EXISTS KvTransferNs Nullable(Int64) CODEC(ZSTD(1)) AFTER ClockSkewNs;
