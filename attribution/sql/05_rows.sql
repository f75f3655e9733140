-- Stage 5: everything else a row holds (engine.attribute_request): the request's attributes
-- (the last attempt's, then the client chain's, nearest first), tokens (the last try's output
-- summed over its parallel samples, else the client side's), the streaming figures of its last
-- timed decode span (engine.timed_decode), else of the last try's gen_ai.latency.* figures, the
-- client's TTFT, and the GPU figures of its last prefill and decode phase spans.
picked AS (
    SELECT
        * EXCEPT (segments, parent_idx, client_parent, n_attempts, req),
        $BUCKET_SUMS,
        -- The span each merged attribute comes from: the first of the last attempt, the client,
        -- client1 and client2 where it is not empty (s_<name>), and its value (m_<name>).
        $PICKED_SPANS,
        -- Phases of this request, its last decode span with token offsets, and its last prefill
        -- and decode spans with GPU figures.
        arrayFilter(j -> owner[j] != 0 AND has(attempts, owner[j]), idx) AS my_phases,
        arraySlice(a_ints, last_try_at) AS try_ints,
        -- Without token times: the earliest first token of the last try (vLLM's n > 1 samples
        -- start together), and the last attempt's figures for TPOT.
        arrayFilter(x -> x IS NOT NULL, arraySlice(ttft_ns, last_try_at)) AS try_ttfts,
        ttft_ns[-1] AS last_ttft,
        decode_ns[-1] AS last_decode
    FROM swept
),
chosen AS (
    SELECT
        * EXCEPT (ttft_ns, decode_ns, last_try_at, a_ints),
        $MERGED_VALUES,
        -- Output counts of the last try's attempts (engine._tokens over each one's attributes).
        arrayMap(m -> $TOKENS(m, $OUTPUT_KEY, $COMPLETION_KEY), try_ints) AS try_outputs,
        arrayLast(j -> 1, arraySort(j -> span_rank[j],
            arrayFilter(j -> timed_decodes[j], my_phases))) AS decode_span,
        $GPU_SPANS
    FROM picked
),
parsed AS (
    SELECT
        * EXCEPT (ids, buckets, timed_decodes, gpu_phases, idx, owner, try_ints, my_phases,
                  attempts, s_model, s_response_model, s_provider, s_system, s_operation,
                  s_route, s_input, s_prompt, s_client_output, s_client_completion, m_model,
                  m_response_model, m_provider, m_system),
        if(arrayExists(x -> x IS NOT NULL, try_outputs),
            least(arraySum(arrayMap(x -> ifNull(x, 0), try_outputs)), $MAX_TOKENS),
            client_output) AS output0,
        $TOKENS(last_ints, $OUTPUT_KEY, $COMPLETION_KEY) AS last_output,
        if(decode_span = 0, [],
            arrayMap(o -> starts[decode_span] + o * 1000,
                JSONExtract(attributes[decode_span][$OFFSETS_KEY], 'Array(Int64)'))) AS tokens,
        integers[decode_span][$TOKEN_COUNT_KEY] AS token_count,
        mapContains(integers[decode_span], $TOKEN_COUNT_KEY) AS has_token_count,
        starts[owner[decode_span]] AS decode_attempt_start,
        $GPU_MAP AS gpu,
        $CLIENT_TTFT AS ttft_client
    FROM chosen
),
streaming AS (
    SELECT
        * EXCEPT (attributes, numbers, integers, starts, ends, first_token_events, try_outputs,
                  client_output, gpu_prefill, gpu_decode, client1, client2),
        arrayPopFront(arrayDifference(tokens)) AS gaps,
        arraySort(gaps) AS sorted_gaps,
        length(gaps) AS n_gaps
    FROM parsed
),
rows AS (
    SELECT
        *,
        -- Server TTFT, TPOT, ITL and stalls from the token times, else from the latency figures.
        multiIf(decode_span != 0, tokens[1] - decode_attempt_start,
            notEmpty(try_ttfts), arrayMin(try_ttfts), NULL) AS ttft_server,
        multiIf(decode_span != 0 AND n_gaps > 0, (tokens[-1] - tokens[1]) / n_gaps,
            decode_span = 0 AND last_ttft IS NOT NULL AND last_decode IS NOT NULL
                AND last_output > 1, last_decode / (last_output - 1),
            NULL) AS tpot,
        if(n_gaps > 0, $QUANTILE(sorted_gaps, n_gaps, 0.5), NULL) AS itl_p50,
        if(n_gaps > 0, $QUANTILE(sorted_gaps, n_gaps, 0.99), NULL) AS itl_p99,
        if(n_gaps > 0, toFloat64(arrayMax(gaps)), NULL) AS itl_max,
        toUInt32(arrayCount(g -> g > {stall_ns:Int64}, gaps)) AS stalls,
        if(output0 IS NULL AND decode_span != 0,
            if(has_token_count AND token_count BETWEEN 1 AND $MAX_TOKENS, token_count,
                length(tokens)),
            output0) AS output_tokens
    FROM streaming
)
