-- Stage 5: everything else a row holds (engine.attribute_request): the request's attributes
-- (the last attempt's, then the client chain's, nearest first), tokens (the last try's output
-- summed over its parallel samples, else the client side's), the streaming figures of its last
-- timed decode span (engine.timed_decode), else of the last try's gen_ai.latency.* figures, the
-- client's TTFT, and the GPU figures of its last prefill and decode phase spans.
merged AS (
    SELECT
        *,
        attributes[client2] AS client2_attrs,
        -- m_<key>: the first non-empty value of the last attempt, the client, client1, client2.
        $MERGED_ATTRIBUTES,
        -- c_<key>: the client chain's output counts.
        $CLIENT_OUTPUT,
        -- Output counts of the last try's attempts (engine._tokens over each one's attributes).
        arrayMap(m -> $TOKENS($INT(m[$OUTPUT_KEY]), $INT(m[$COMPLETION_KEY])),
            arraySlice(attempt_attrs, last_try_at)) AS try_outputs,
        -- Without token times: the earliest first token of the last try (vLLM's n > 1 samples
        -- start together), and the last attempt's decode time for TPOT.
        arrayFilter(x -> x IS NOT NULL, arraySlice(ttft_ns, last_try_at)) AS try_ttfts,
        ttft_ns[n_attempts] AS last_ttft,
        decode_ns[n_attempts] AS last_decode,
        -- Phases of this request, and its last decode span with token offsets.
        arrayFilter(j -> owner[j] != 0 AND has(attempts, owner[j]), idx) AS my_phases,
        arrayLast(j -> 1, arraySort(j -> (starts[j], ids[j]),
            arrayFilter(j -> timed_decodes[j], my_phases))) AS decode_span,
        $GPU_SPANS
    FROM sums
),
parsed AS (
    SELECT
        *,
        if(m_model != '', m_model, m_response_model) AS model,
        if(m_provider != '', m_provider, m_system) AS provider,
        $TOKENS($INT(m_input), $INT(m_prompt)) AS input_tokens,
        $TOKENS($INT(c_output), $INT(c_completion)) AS client_output,
        $TOKENS($INT(last_attrs[$OUTPUT_KEY]), $INT(last_attrs[$COMPLETION_KEY])) AS last_output,
        if(decode_span = 0, [],
            arrayMap(o -> starts[decode_span] + o * 1000,
                JSONExtract(attributes[decode_span][$OFFSETS_KEY], 'Array(Int64)'))) AS tokens,
        $INT(attributes[decode_span][$TOKEN_COUNT_KEY]) AS token_count
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
        length(gaps) AS n_gaps
    FROM parsed
),
rows AS (
    SELECT
        *,
        -- Server TTFT, TPOT, ITL and stalls from the token times, else from the latency figures.
        multiIf(decode_span != 0, tokens[1] - starts[owner[decode_span]],
            notEmpty(try_ttfts), arrayMin(try_ttfts), NULL) AS ttft_server,
        multiIf(decode_span != 0 AND n_gaps > 0, (tokens[length(tokens)] - tokens[1]) / n_gaps,
            decode_span = 0 AND last_ttft IS NOT NULL AND last_decode IS NOT NULL
                AND last_output > 1, last_decode / (last_output - 1),
            NULL) AS tpot,
        if(n_gaps > 0, $QUANTILE(sorted_gaps, n_gaps, 0.5), NULL) AS itl_p50,
        if(n_gaps > 0, $QUANTILE(sorted_gaps, n_gaps, 0.99), NULL) AS itl_p99,
        if(n_gaps > 0, toFloat64(arrayMax(gaps)), NULL) AS itl_max,
        toUInt32(arrayCount(g -> g > {stall_ns:Int64}, gaps)) AS stalls,
        if(output0 IS NULL AND decode_span != 0,
            if(token_count BETWEEN 1 AND $MAX_TOKENS, token_count, length(tokens)),
            output0) AS output_tokens,
        -- Client TTFT: latscope's attribute or event, else a GenAI time_to_first_chunk on the
        -- client chain (seconds from the span that carries it).
        $CLIENT_TTFT AS ttft_client,
        $GPU_MAP AS gpu
    FROM streaming
)
