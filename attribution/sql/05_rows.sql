-- Stage 5: everything else a row holds (engine.attribute_request): the request's attributes
-- (the last attempt's, then the client chain's, nearest first; empty counts as absent), tokens
-- (the last try's output summed over its parallel samples), the streaming figures of its last
-- timed decode span (engine.timed_decode), else of the last attempt's gen_ai.latency.* figures,
-- the client's TTFT, and the GPU figures of its last prefill and decode phase spans.
merged AS (
    SELECT
        *,
        [last, client, client1, client2] AS attr_spans,
        $MERGED_ATTRIBUTES,
        arrayMap(a -> a_output[a], last_try) AS try_output_raw,
        arrayMap(a -> a_completion[a], last_try) AS try_completion_raw,
        $CLIENT_OUTPUT_RAW,
        -- Phases of this request, and its last decode span with token offsets.
        arrayFilter(j -> owner[j] != 0 AND has(attempts, owner[j]), idx) AS my_phases,
        arrayLast(j -> 1, arraySort(j -> (starts[j], ids[j]),
            arrayFilter(j -> buckets[j] = $DECODE AND timed[j], my_phases))) AS decode_span
    FROM swept
),
parsed AS (
    SELECT
        *,
        if(m_model != '', m_model, m_response_model) AS model,
        if(m_provider != '', m_provider, m_system) AS provider,
        $TOKENS(m_input, m_prompt) AS input_tokens,
        arrayMap((o, c) -> $TOKENS(o, c), try_output_raw, try_completion_raw) AS try_outputs,
        $TOKENS(c_output, c_completion) AS client_output,
        $TOKENS(a_output[last], a_completion[last]) AS last_output,
        if(decode_span = 0, [],
            arrayMap(o -> starts[decode_span] + o * 1000,
                JSONExtract(offsets[decode_span], 'Array(Int64)'))) AS tokens,
        multiIf(v_decodes[last] IS NOT NULL, $S2NS(v_decodes[last]),
            v_e2es[last] IS NOT NULL, greatest(0, $S2NS(v_e2es[last]) - $S2NS(v_ttfts[last])),
            NULL) AS latency_decode
    FROM merged
),
streaming AS (
    SELECT
        *,
        if(arrayExists(x -> x IS NOT NULL, try_outputs),
            least(arraySum(arrayMap(x -> ifNull(x, 0), try_outputs)), $MAX_TOKENS),
            client_output) AS output0,
        arrayPopFront(arrayDifference(tokens)) AS gaps,
        arraySort(gaps) AS sorted_gaps,
        length(gaps) AS n_gaps,
        $GPU_SPANS
    FROM parsed
),
rows AS (
    SELECT
        *,
        -- Server TTFT, TPOT, ITL and stalls from the token times, else from the last attempt's
        -- vLLM / SGLang figures (decode = e2e - ttft where the split is missing).
        multiIf(decode_span != 0, tokens[1] - starts[owner[decode_span]],
            v_ttfts[last] IS NOT NULL, $S2NS(v_ttfts[last]), NULL) AS ttft_server,
        multiIf(decode_span != 0 AND n_gaps > 0, (tokens[length(tokens)] - tokens[1]) / n_gaps,
            decode_span = 0 AND v_ttfts[last] IS NOT NULL AND latency_decode IS NOT NULL
                AND last_output > 1, latency_decode / (last_output - 1),
            NULL) AS tpot,
        if(n_gaps > 0, $QUANTILE(sorted_gaps, n_gaps, 0.5), NULL) AS itl_p50,
        if(n_gaps > 0, $QUANTILE(sorted_gaps, n_gaps, 0.99), NULL) AS itl_p99,
        if(n_gaps > 0, toFloat64(arrayMax(gaps)), NULL) AS itl_max,
        toUInt32(arrayCount(g -> g > {stall_ns:Int64}, gaps)) AS stalls,
        if(output0 IS NULL AND decode_span != 0,
            if(token_counts[decode_span] BETWEEN 1 AND $MAX_TOKENS,
                token_counts[decode_span], length(tokens)),
            output0) AS output_tokens,
        -- Client TTFT: latscope's attribute or event, else a GenAI time_to_first_chunk on the
        -- client chain (seconds from the span that carries it).
        multiIf(client = 0, NULL,
            first_token_attrs[client] IS NOT NULL, first_token_attrs[client] - starts[client],
            first_token_events[client] IS NOT NULL, first_token_events[client] - starts[client],
            ttfcs[client] IS NOT NULL, $S2NS(ttfcs[client]),
            client1 != 0 AND ttfcs[client1] IS NOT NULL,
                starts[client1] + $S2NS(ttfcs[client1]) - starts[client],
            client2 != 0 AND ttfcs[client2] IS NOT NULL,
                starts[client2] + $S2NS(ttfcs[client2]) - starts[client],
            NULL) AS ttft_client,
        $GPU_MAP AS gpu
    FROM streaming
)
