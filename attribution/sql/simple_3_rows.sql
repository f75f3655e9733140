-- The single-call path, stage 3: the request of each trace and its row, by the same rules as
-- stages 3-5 of the general path with one attempt S (hull = S, its own window) and its client
-- chain c, c1, c2: the transport (S's parent) and the CLIENT spans above it up to the request's
-- client, the outermost GenAI operation among them, else the transport (clients[0]: none, an
-- empty tuple). $SV(s, NAME) is the non-empty value of an attribute, else '' (as a payload of the
-- general path holds non-empty values only).
simple_requests AS (
    SELECT
        trace_id, n, phases, n_timed,
        -- The last by (start, span id), as the general path's span rank orders them.
        arraySort(x -> (x.1, x.2), decodes)[-1] AS decode,
        arrayMap(x -> (x.3, x.4), arraySort(x -> (x.1, x.2), gpu_prefills))[-1] AS gpu_prefill,
        arrayMap(x -> (x.3, x.4), arraySort(x -> (x.1, x.2), gpu_decodes))[-1] AS gpu_decode,
        server.1 AS s_id,
        server.3 AS service,
        server.4 AS s_start,
        server.5 AS s_end,
        server.6 AS status,
        $RESOURCE_OF AS resource,
        (server.8, server.9) AS s,
        client,
        clients[client] AS c,
        toUInt32(if(client = 0, 0, indexOf(client_ids, c.1))) AS up1,
        toUInt32(if(up1 = 0, 0, indexOf(client_ids, clients[up1].1))) AS up2,
        -- The request's client: the outermost GenAI operation of the chain (its position in
        -- clients), else the transport.
        multiIf(up2 != 0 AND clients[up2].8, up2, up1 != 0 AND clients[up1].8, up1, client)
            AS request_client,
        clients[if(request_client != client, up1, 0)] AS c1,
        clients[if(request_client = up2, up2, 0)] AS c2,
        clients[request_client] AS rc,
        if(client = 0, s_id, client_ids[request_client]) AS request_span_id
    FROM simple_traces
),
-- The non-empty attributes of the client chain, and of S then the chain, nearest first, each as
-- one (codes, values) pair: a code's first value in a pair is the merged value, so each merged
-- attribute is one lookup instead of a coalesce over four spans (those 40-odd expressions were
-- a third of ClickHouse's analysis and planning of the statement, a fixed cost of every pass).
simple_chain AS (
    SELECT
        *,
        arrayFilter((k, v) -> v != '', arrayConcat(c.5, c1.5, c2.5), arrayConcat(c.6, c1.6, c2.6))
            AS chain_codes,
        arrayFilter(v -> v != '', arrayConcat(c.6, c1.6, c2.6)) AS chain_values,
        arrayFilter((k, v) -> v != '', arrayConcat(s.1, c.5, c1.5, c2.5),
            arrayConcat(s.2, c.6, c1.6, c2.6)) AS merged_codes,
        arrayFilter(v -> v != '', arrayConcat(s.2, c.6, c1.6, c2.6)) AS merged_values
    FROM simple_requests
),
simple_values AS (
    SELECT
        trace_id, n, phases, n_timed, decode, gpu_prefill, gpu_decode, service, status,
        resource, client, request_span_id, s_start, s_end,
        $SIMPLE_MERGED,
        -- Every integer and decimal number the row reads, parsed by one lambda each (one copy of
        -- the parse in the statement, and one call per row).
        arrayMap(raw -> $PARSE_INT(raw), [$SV(s, OUTPUT), $SV(s, COMPLETION), c_output,
            c_completion, m_input, m_prompt, decode.3, c_oi_completion, m_oi_prompt,
            $SV(s, OI_COMPLETION),
            $SV((c.5, c.6), FIRST_TOKEN_NS), $SV((c1.5, c1.6), FIRST_TOKEN_NS),
            $SV((c2.5, c2.6), FIRST_TOKEN_NS)]) AS ints,
        arrayMap(raw -> $NUM(raw), [$SIMPLE_NUMS]) AS nums,
        $SIMPLE_STREAMED AS streamed,
        rc.2 AS c_lo,
        rc.3 - rc.2 AS c_dur,
        client != 0 AND (rc.8 OR arrayExists(x -> x IS NOT NULL, arrayMap(
            raw -> $PARSE_INT(raw), [$SV((c.5, c.6), LAST_BYTE), $SV((c1.5, c1.6), LAST_BYTE),
                $SV((c2.5, c2.6), LAST_BYTE)]))) AS whole_response,
        (c.7, c1.7, c2.7) AS first_token_events,
        (c.2, c1.2, c2.2) AS chain_starts,
        -- How far the server's phases run (engine._reach): clipped to S; NULL without.
        arrayMap(p -> least(p.3, s_end),
            arrayFilter(p -> least(p.3, s_end) > greatest(p.2, s_start), phases)) AS reach_ends,
        if(empty(reach_ends), NULL, arrayMax(reach_ends)) AS reach
    FROM simple_chain
),
-- The timeline (engine.timeline with one attempt: the hull is S).
simple_timeline AS (
    SELECT
        *,
        $TIMELINE(client, c_lo, c_dur, s_start, s_end, whole_response, reach)
    FROM simple_values
),
simple_clocked AS (
    SELECT
        *,
        $TIMELINE_WINDOW(client, c_lo, c_dur, s_start, s_end)
    FROM simple_timeline
),
-- The sweep (stage 4): S as `other`, its phases clipped to it, all moved onto the client's clock
-- and clipped to the window.
--
-- Most requests' phases do not overlap (`flat`: sorted by start, each starts where the one
-- before ended or later). Then the sweep's answer needs no sweep: every phase is its own bucket,
-- S less its phases is `other`, the window less S is network ($FLAT_SUMS). The sweep runs only
-- for the rest: their cuts are left empty, and the segments of no cuts cost nothing (the
-- segments' nested lambda and the sums over them are the costly part of this path after its
-- GROUP BY).
simple_intervals AS (
    SELECT
        * EXCEPT (phases),
        greatest(s_start + offset, lo) AS a_lo,
        least(s_end + offset, hi) AS a_hi,
        if(a_hi > a_lo, a_hi - a_lo, 0) AS s_length,
        arrayFilter(iv -> iv.3 > iv.2,
            arrayMap(p -> (p.1, greatest(p.2 + offset, a_lo), least(p.3 + offset, a_hi)),
                phases)) AS phase_ivs,
        arrayConcat(if(a_hi > a_lo, [(toUInt8($OTHER_RANK), a_lo, a_hi)], []), phase_ivs) AS ivs,
        arraySort(iv -> iv.2, phase_ivs) AS by_start,
        arrayAll((a, b) -> b.2 >= a.3, arrayPopBack(by_start), arrayPopFront(by_start)) AS flat
    FROM simple_clocked
),
simple_cut AS (
    SELECT
        * EXCEPT (a_lo, a_hi, by_start),
        if(flat, [], $CUTS(lo, hi, ivs)) AS cuts
    FROM simple_intervals
),
simple_swept AS (
    SELECT
        * EXCEPT (ivs, cuts),
        $SEGMENTS(cuts, ivs) AS segments
    FROM simple_cut
),
-- Stage 5: tokens, streaming figures of the last timed decode span, the client's TTFT, GPU.
simple_parsed AS (
    SELECT
        * EXCEPT (segments, decode, gpu_prefill, gpu_decode, s_length, phase_ivs, flat),
        $FLAT_SUMS,
        -- The last timed decode span's token figures as the collector stored them, else its
        -- token offsets (us from the span's start) to compute them from.
        $STORED_FIGURES AS stored_figures,
        $INT_LIST(n_timed != 0 AND empty(stored_figures), decode.4) AS offsets,
        decode.1 AS decode_start,
        ints[7] AS token_count,
        $TOKENS(ints[1], ints[2], ints[10]) AS try_output,
        $GPU_MAP AS gpu,
        toUInt16(1) AS tries,
        -- No SGLang stage, so no KV-cache transfer, on this path.
        CAST(NULL, 'Nullable(Int64)') AS kv_transfer
    FROM simple_swept
),
simple_streaming AS (
    SELECT
        *,
        if(m_model != '', m_model, m_response_model) AS model,
        if(m_provider != '', m_provider, m_system) AS provider,
        $TOKENS(ints[5], ints[6], ints[9]) AS input_tokens,
        $GAPS(offsets),
        if(try_output IS NOT NULL, least(try_output, $MAX_TOKENS),
            $TOKENS(ints[3], ints[4], ints[8])) AS output0,
        -- engine._client_ttft along the chain, nearest first; none for a call made without
        -- streaming.
        multiIf(client = 0 OR streamed = 0, NULL,
            ints[11] IS NOT NULL, ints[11] - c_lo,
            first_token_events.1 != '', toInt64(first_token_events.1) - c_lo,
            nums[1] IS NOT NULL, chain_starts.1 + $S2NS(nums[1]) - c_lo,
            ints[12] IS NOT NULL, ints[12] - c_lo,
            first_token_events.2 != '', toInt64(first_token_events.2) - c_lo,
            nums[2] IS NOT NULL, chain_starts.2 + $S2NS(nums[2]) - c_lo,
            ints[13] IS NOT NULL, ints[13] - c_lo,
            first_token_events.3 != '', toInt64(first_token_events.3) - c_lo,
            nums[3] IS NOT NULL, chain_starts.3 + $S2NS(nums[3]) - c_lo,
            NULL) AS ttft_client
    FROM simple_parsed
),
-- tokens.token_figures: as stored, else from the offsets; a column before the expressions that
-- read it.
simple_figured AS (
    SELECT
        *,
        if(notEmpty(stored_figures), stored_figures, $TOKEN_FIGURES(offsets)) AS figures
    FROM simple_streaming
),
rows AS (
    SELECT
        *,
        if(n_timed != 0 AND ifNull(streamed, 1) != 0,
            decode_start + toInt64(figures[$AT_FIRST_OFFSET]) * 1000 - s_start, NULL)
            AS ttft_server,
        -- With one token there are no gaps: no TPOT or ITL.
        figures[$AT_TOKENS] > 1 AS has_gaps,
        if(has_gaps, figures[$AT_TPOT], NULL) AS tpot,
        $ITL_COLUMNS(has_gaps),
        if(output0 IS NULL AND n_timed != 0,
            if(token_count BETWEEN 1 AND $MAX_TOKENS, token_count, toUInt64(figures[$AT_TOKENS])),
            output0) AS output_tokens
    FROM simple_figured
)
