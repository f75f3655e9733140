-- The span attributes the attribution rules read, by code, computed by ClickHouse as each span is
-- stored. The attributor reads this small map instead of every attribute of every span: upstream
-- instrumentation writes dozens of attributes per span (HTTP, host, user fields) and the rules
-- read a handful, so reading and grouping the spans of a batch cost what the handful costs,
-- for a fraction of a microsecond a span at insert.
--
-- The key is the attribute's code: its position in the list below (latscope.attribution.sql.KEYS
-- in order, which a test holds equal to this list); attributes the rules never read are left out.
-- Codes are stored in the parts, so they never change: a key the rules come to read takes the
-- next code in a new file that MODIFYs this column's expression, and `MATERIALIZE COLUMN` then
-- recomputes the parts written before it. Parts stored before this column existed compute it
-- when it is read, from SpanAttributes, with the same expression.
ALTER TABLE otel_traces
    ADD COLUMN IF NOT EXISTS LatscopeRuleAttributes Map(UInt8, String) MATERIALIZED mapFilter(
        (code, value) -> code != 0,
        mapFromArrays(
            arrayMap(key -> transform(key, [
                'gen_ai.request.model',
                'gen_ai.response.model',
                'gen_ai.provider.name',
                'gen_ai.system',
                'gen_ai.operation.name',
                'http.route',
                'gen_ai.usage.input_tokens',
                'gen_ai.usage.prompt_tokens',
                'gen_ai.usage.output_tokens',
                'gen_ai.usage.completion_tokens',
                'latscope.token_offsets_us',
                'latscope.token_count',
                'latscope.first_token_ns',
                'latscope.last_byte_ns',
                'gen_ai.response.time_to_first_chunk',
                'gen_ai.latency.time_in_queue',
                'gen_ai.latency.time_to_first_token',
                'gen_ai.latency.time_in_model_prefill',
                'gen_ai.latency.time_in_model_decode',
                'gen_ai.latency.e2e',
                'latscope.gpu.utilization.mean',
                'latscope.gpu.utilization.max',
                'latscope.gpu.memory.used.max',
                'latscope.gpu.power.mean',
                'latscope.gpu.sm_clock',
                'latscope.gpu.energy_mj',
                'latscope.phase'
            ], [
                1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27
            ], 0), SpanAttributes.keys),
            SpanAttributes.values)) CODEC(ZSTD(1));
