-- Stage 3: one row per request (ARRAY JOIN of each trace's request keys): its attempts, its
-- client chain, its tries, and its timeline on the client's clock (engine.timeline): the skew
-- offset, the window, and whether the client span ended at the response headers.
request_spans AS (
    SELECT
        * EXCEPT (request_keys),
        req AS req_idx,
        -- Attempts: the inference spans under this key, oldest first (start, then span id).
        arraySort(i -> (starts[i], ids[i]),
            arrayFilter((i, f, k) -> f AND k = req, idx, is_inference, request_key)) AS attempts,
        client_of[attempts[1]] AS client,
        arrayMap(a -> attributes[a], attempts) AS attempt_attrs
    FROM traces
    ARRAY JOIN request_keys AS req
),
request_tries AS (
    SELECT
        *,
        length(attempts) AS n_attempts,
        attempts[n_attempts] AS last,
        -- The client span and the CLIENT spans directly above it (client-side attributes).
        if(client != 0 AND kinds[parent_idx[client]] = $CLIENT, parent_idx[client], 0) AS client1,
        -- Tries: attempts that overlap in time are one (vLLM's n > 1 samples); a retry starts
        -- when every earlier attempt has ended.
        arrayMap(a -> starts[a], attempts) AS a_starts,
        arrayMap(a -> ends[a], attempts) AS a_ends,
        arrayMin(a_starts) AS hull_lo,
        arrayMax(a_ends) AS hull_hi,
        if(client = 0, 0, starts[client]) AS c_lo,
        if(client = 0, 0, ends[client] - starts[client]) AS c_dur,
        -- latscope's client records when it read the last byte: its span is the whole response.
        attributes[client] AS client_attrs,
        client != 0 AND $INT(client_attrs[$LAST_BYTE_KEY]) IS NOT NULL AS whole_response
    FROM request_spans
),
requests AS (
    SELECT
        *,
        if(client1 != 0 AND kinds[parent_idx[client1]] = $CLIENT, parent_idx[client1], 0)
            AS client2,
        attempt_attrs[n_attempts] AS last_attrs,
        attributes[client1] AS client1_attrs,
        arrayMap(k -> k = 1 OR a_starts[k] >= arrayMax(arraySlice(a_ends, 1, k - 1)),
            range(1, n_attempts + 1)) AS new_try,
        toUInt16(arrayCount(x -> x, new_try)) AS tries,
        arrayLastIndex(x -> x, new_try) AS last_try_at,
        arraySlice(attempts, last_try_at) AS last_try,
        client != 0 AND hull_hi - hull_lo > c_dur AND NOT whole_response AS headers_only,
        multiIf(
            client = 0, 0,
            hull_lo >= c_lo AND hull_hi <= c_lo + c_dur, 0,
            hull_hi - hull_lo <= c_dur, c_lo + intDiv(c_dur - (hull_hi - hull_lo), 2) - hull_lo,
            -- headers-only: the server started half-way through the client span
            NOT whole_response, c_lo + intDiv(c_dur, 2) - hull_lo,
            c_lo - hull_lo) AS offset,
        if(client = 0, a_starts[1], c_lo) AS lo,
        multiIf(client = 0, a_ends[1],
            hull_hi - hull_lo > c_dur AND NOT whole_response,
                hull_hi + offset + (c_dur - intDiv(c_dur, 2)),
            c_lo + c_dur) AS hi
    FROM request_tries
)
