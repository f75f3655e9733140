-- Stage 5: everything else a row holds (engine.attribute_request): the request's attributes
-- (the last attempt's, then its window's, then the client chain's, nearest first), tokens (the
-- last try's output summed over its samples, else the client side's), the streaming figures of
-- its last timed decode span (engine.timed_decode), else of the last try's gen_ai.latency.*
-- figures, the client's TTFT (none for a call the client says it made without streaming), and
-- the GPU figures of its last prefill and decode phase spans. Attribute values
-- are parsed here, from the payloads of those few spans only, one layer before the expressions
-- that read them.
picked AS (
    SELECT
        * EXCEPT (segments, n_attempts, disaggregated, decode_roots, split_try, model_calls),
        $BUCKET_SUMS,
        if(kv_recorded, $KV_SUM, NULL) AS kv_transfer,
        a_payloads[-1] AS pl_last,
        a_payloads[input_at] AS pl_input,
        -- Phases of this request, and its last try's samples.
        arrayFilter(j -> owner[j] != 0 AND has(attempts, owner[j]), idx) AS my_phases,
        arrayMap(k -> a_payloads[k], token_samples) AS try_payloads,
        -- Without token times: the earliest first token of the last try's samples, from their
        -- start (vLLM's n > 1 samples start together), and the last attempt's figures for TPOT.
        arrayFilter(x -> x IS NOT NULL, arrayMap(k -> a_starts[k]
            - try_lo + ttft_ns[k], samples)) AS try_ttfts,
        decode_ns[-1] AS last_decode
    FROM swept
),
chosen AS (
    SELECT
        * EXCEPT (ttft_ns, decode_ns, last_try_at, a_payloads, timed_decodes,
                  gpu_phases, idx, attempts, samples, token_samples, try_lo, a_starts, a_ends, windows, kv_recorded),
        -- Merged attributes (m_<name>): the first of the last attempt, the client, client1 and
        -- client2 that has the attribute; c_<name>: the client chain's alone.
        $MERGED_VALUES,
        $STREAMED(pl_client, pl_client1, pl_client2) AS streamed,
        -- Its last decode phase span with token offsets, and its last prefill and decode phase
        -- spans with GPU figures (0: none).
        arrayLast(j -> 1, arraySort(j -> span_rank[j],
            arrayFilter(j -> timed_decodes[j] AND buckets[j] = $DECODE_BUCKET, my_phases)))
            AS decode_span,
        $GPU_SPANS
    FROM picked
),
-- Every integer and decimal number the row reads, parsed by one lambda each (one copy of the
-- parse in the statement). An absent value reads as '' (a payload holds non-empty values
-- only), which parses to NULL.
numbers AS (
    SELECT
        * EXCEPT (try_payloads),
        arrayMap(raw -> $PARSE_INT(raw), [pl_last[$K_OUTPUT], pl_last[$K_COMPLETION],
            pl_client[$K_FIRST_TOKEN_NS], pl_client1[$K_FIRST_TOKEN_NS],
            pl_client2[$K_FIRST_TOKEN_NS], m_input, m_prompt, m_oi_prompt,
            pl_input[$K_INPUT], pl_input[$K_PROMPT], pl_input[$K_OI_PROMPT],
            c_output, c_completion, c_oi_completion, payloads[decode_span][$K_TOKEN_COUNT]])
            AS ints,
        -- The client chain's first-chunk figures, then the GPU figures ($GPU_MAP reads them).
        arrayMap(raw -> $NUM(raw), [pl_client[$K_FIRST_CHUNK], pl_client1[$K_FIRST_CHUNK],
            pl_client2[$K_FIRST_CHUNK], $GPU_VALUES]) AS nums,
        -- Output counts (output, completion) of the last try's attempts.
        arrayMap(m -> arrayMap(raw -> $PARSE_INT(raw), [m[$K_OUTPUT], m[$K_COMPLETION],
            m[$K_OI_COMPLETION]]), try_payloads) AS try_counts
    FROM chosen
),
parsed AS (
    SELECT
        * EXCEPT (buckets, span_rank, my_phases, owner, try_counts, m_model, m_response_model,
                  m_provider, m_system, payloads, starts, ends, gpu_prefill, gpu_decode, client0,
                  client1, client2, pl_client, pl_client1, pl_client2, pl_last, pl_input,
                  input_at, pl_window, m_input, m_prompt, m_oi_prompt, c_output, c_completion,
                  c_oi_completion, ints, nums),
        pl_window[$K_STATUS] AS status,
        if(m_model != '', m_model, m_response_model) AS model,
        if(m_provider != '', m_provider, m_system) AS provider,
        -- Input tokens: the prompt counts of the attempt whose count is the request's, else the
        -- merged ones.
        ifNull($TOKENS(ints[9], ints[10], ints[11]), $TOKENS(ints[6], ints[7], ints[8]))
            AS input_tokens,
        $TOKENS(ints[12], ints[13], ints[14]) AS client_output,
        arrayMap(c -> $TOKENS(c[1], c[2], c[3]), try_counts) AS try_outputs,
        $TOKENS(ints[1], ints[2]) AS last_output,
        -- Token offsets (us) from the decode span's start: the token times are start + offset
        -- * 1000, read only where a figure needs one ($GAPS).
        $INT_LIST(decode_span != 0, payloads[decode_span][$K_OFFSETS]) AS offsets,
        starts[decode_span] AS decode_start,
        ints[15] AS token_count,
        starts[owner[decode_span]] AS decode_attempt_start,
        $GPU_MAP AS gpu,
        -- engine._client_ttft: along the client chain, nearest first, latscope's first-token
        -- attribute, a first-chunk event, or a time_to_first_chunk (from the span carrying it).
        multiIf(client = 0 OR streamed = 0, NULL,
            ints[3] IS NOT NULL, ints[3] - c_lo,
            mapContains(pl_client, $K_FIRST_TOKEN_EVENT),
                toInt64(pl_client[$K_FIRST_TOKEN_EVENT]) - c_lo,
            nums[1] IS NOT NULL, starts[client0] + $S2NS(nums[1]) - c_lo,
            ints[4] IS NOT NULL, ints[4] - c_lo,
            mapContains(pl_client1, $K_FIRST_TOKEN_EVENT),
                toInt64(pl_client1[$K_FIRST_TOKEN_EVENT]) - c_lo,
            nums[2] IS NOT NULL, starts[client1] + $S2NS(nums[2]) - c_lo,
            ints[5] IS NOT NULL, ints[5] - c_lo,
            mapContains(pl_client2, $K_FIRST_TOKEN_EVENT),
                toInt64(pl_client2[$K_FIRST_TOKEN_EVENT]) - c_lo,
            nums[3] IS NOT NULL, starts[client2] + $S2NS(nums[3]) - c_lo,
            NULL) AS ttft_client
    FROM numbers
),
streaming AS (
    SELECT
        * EXCEPT (try_outputs, client_output),
        if(arrayExists(x -> x IS NOT NULL, try_outputs),
            least(arraySum(arrayMap(x -> ifNull(x, 0), try_outputs)), $MAX_TOKENS),
            client_output) AS output0,
        $GAPS(offsets)
    FROM parsed
),
figured AS (
    -- The token figures (tokens.token_figures, as the single-call path reads them), a column
    -- before the expressions that read them.
    SELECT *, $TOKEN_FIGURES(offsets) AS figures FROM streaming
),
rows AS (
    SELECT
        *,
        -- Server TTFT, TPOT, ITL and stalls from the token times, else from the latency figures.
        multiIf(streamed = 0, NULL,
            decode_span != 0, decode_start + offsets[1] * 1000 - decode_attempt_start,
            notEmpty(try_ttfts), arrayMin(try_ttfts), NULL) AS ttft_server,
        multiIf(decode_span != 0 AND n_gaps > 0, figures[$AT_TPOT],
            decode_span = 0 AND last_decode IS NOT NULL
                AND last_output > 1, last_decode / (last_output - 1),
            NULL) AS tpot,
        $ITL_COLUMNS(n_gaps > 0),
        if(output0 IS NULL AND decode_span != 0,
            if(token_count BETWEEN 1 AND $MAX_TOKENS, token_count, length(offsets)),
            output0) AS output_tokens
    FROM figured
)
