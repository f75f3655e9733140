-- GENERATED from ../016_engine_rules.sql by deploy/clickhouse/cluster/generate.py; do not edit.
-- Replicated local table + Distributed table under the single-node name.

ALTER TABLE latscope.otel_traces_local ON CLUSTER '{cluster}'
    MODIFY COLUMN LatscopeRuleAttributes Map(UInt8, String) MATERIALIZED mapFilter(
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
                'latscope.phase',
                'llm.token_count.prompt',
                'llm.token_count.completion',
                'gen_ai.request.stream',
                'gen_ai.is_streaming',
                'llm.invocation_parameters',
                'openinference.span.kind',
                'asgi.event.type',
                'type',
                'gen_ai.latency.kv_cache_transfer_time',
                'validation_time',
                'queue_time',
                'inference_time',
                'total_time',
                'method',
                'uri'
            ], [
                1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26,
                27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39,
                40, 41, 42
            ], 0), SpanAttributes.keys),
            SpanAttributes.values)) CODEC(ZSTD(1));

ALTER TABLE latscope.otel_traces ON CLUSTER '{cluster}'
    MODIFY COLUMN LatscopeRuleAttributes Map(UInt8, String) MATERIALIZED mapFilter(
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
                'latscope.phase',
                'llm.token_count.prompt',
                'llm.token_count.completion',
                'gen_ai.request.stream',
                'gen_ai.is_streaming',
                'llm.invocation_parameters',
                'openinference.span.kind',
                'asgi.event.type',
                'type',
                'gen_ai.latency.kv_cache_transfer_time',
                'validation_time',
                'queue_time',
                'inference_time',
                'total_time',
                'method',
                'uri'
            ], [
                1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26,
                27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39,
                40, 41, 42
            ], 0), SpanAttributes.keys),
            SpanAttributes.values));

ALTER TABLE latscope.otel_traces_local ON CLUSTER '{cluster}'
    MATERIALIZE COLUMN LatscopeRuleAttributes;
