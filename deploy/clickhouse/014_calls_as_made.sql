-- The call as the app made it (docs/attribution.md, "Which spans make a request"): the rules read
-- seven more attributes, so LatscopeRuleAttributes (007) stores them under the next codes, and
-- LatscopeFirstToken (010) holds the first-chunk event of every GenAI client instrumentation,
-- on any span (OpenInference's LLM span is INTERNAL).
--
-- New codes: OpenInference's token counts (llm.token_count.prompt, .completion), what a client
-- says of streaming (gen_ai.request.stream, traceloop's gen_ai.is_streaming, OpenInference's
-- llm.invocation_parameters), OpenInference's span kind (its LLM span is a client-side GenAI
-- operation), and the ASGI instrumentation's asgi.event.type (its response-body messages end the
-- response; `type` before 0.43b0). Codes 1-27 keep their keys: the values stored in the parts never change meaning.
--
-- LatscopeFirstToken: the earliest event named latscope.first_token, First Token Stream Event
-- (OpenInference) or gen_ai.content.completion.chunk (traceloop, one per chunk), on any span
-- (ns, as a string, as the rules carry it); else ''.
--
-- Parts stored before this file keep the values they were stored with until the MATERIALIZE
-- statements below (mutations ClickHouse runs in the background) have rewritten them.
ALTER TABLE otel_traces
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
                'type'
            ], [
                1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26,
                27, 28, 29, 30, 31, 32, 33, 34, 35
            ], 0), SpanAttributes.keys),
            SpanAttributes.values)) CODEC(ZSTD(1)),
    MODIFY COLUMN LatscopeFirstToken String MATERIALIZED
        if(hasAny(Events.Name,
                ['latscope.first_token', 'First Token Stream Event', 'gen_ai.content.completion.chunk']),
            toString(arrayMin(arrayMap(t -> toUnixTimestamp64Nano(t),
                arrayFilter((t, n) -> n IN ('latscope.first_token', 'First Token Stream Event',
                        'gen_ai.content.completion.chunk'),
                    Events.Timestamp, Events.Name)))),
            '');
ALTER TABLE otel_traces MATERIALIZE COLUMN LatscopeRuleAttributes;
ALTER TABLE otel_traces MATERIALIZE COLUMN LatscopeFirstToken;
