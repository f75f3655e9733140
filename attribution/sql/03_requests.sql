-- Stage 3: one row per request (ARRAY JOIN of each trace's request keys): its attempts, its
-- client chain, its tries, and its timeline on the client's clock (engine.timeline): the skew
-- offset, the window, and whether the client span ended at the response headers.
request_spans AS (
    SELECT
        * EXCEPT (is_inference, request_key, client_of, clients),
        ids[req] AS request_span_id,
        -- Attempts: the inference spans under this key, oldest first (start, then span id).
        arraySort(i -> span_rank[i],
            arrayFilter((i, f, k) -> f AND k = req, idx, is_inference, request_key)) AS attempts,
        client_of[attempts[1]] AS client
    FROM traces
    ARRAY JOIN arrayDistinct(arrayFilter((k, f) -> f, request_key, is_inference)) AS req
),
request_fields AS (
    SELECT
        * EXCEPT (services, resources, req),
        toUInt32(length(ids)) AS n,
        length(attempts) AS n_attempts,
        attempts[-1] AS last,
        services[attempts[-1]] AS service,
        resources[attempts[-1]] AS resource,
        arrayMap(a -> starts[a], attempts) AS a_starts,
        arrayMap(a -> ends[a], attempts) AS a_ends,
        -- The payloads stage 5 reads: the attempts', and the client chain's (the client span
        -- and the CLIENT spans directly above it, nearest first; 0 and an empty map: none).
        arrayMap(a -> payloads[a], attempts) AS a_payloads,
        client_parent[client] AS client1,
        client_parent[client_parent[client]] AS client2,
        payloads[client] AS pl_client,
        payloads[client_parent[client]] AS pl_client1,
        payloads[client_parent[client_parent[client]]] AS pl_client2
    FROM request_spans
),
request_clients AS (
    SELECT
        * EXCEPT (client_parent),
        starts[client] AS c_lo,
        ends[client] - starts[client] AS c_dur,
        arrayMin(a_starts) AS hull_lo,
        arrayMax(a_ends) AS hull_hi,
        -- latscope's client records when it read the last byte: its span is the whole response.
        client != 0 AND $INT(pl_client[$K_LAST_BYTE]) IS NOT NULL AS whole_response,
        -- Tries: attempts that overlap in time are one (vLLM's n > 1 samples); a retry starts
        -- when every earlier attempt has ended.
        arrayMap(k -> k = 1 OR a_starts[k] >= arrayMax(arraySlice(a_ends, 1, k - 1)),
            range(1, length(attempts) + 1)) AS new_try
    FROM request_fields
),
requests AS (
    SELECT
        *,
        toUInt16(arrayCount(x -> x, new_try)) AS tries,
        -- Of each try, the attempt (its position in `attempts`) that ended last, then started
        -- last (engine.critical_attempts): the one the response waited for.
        arrayCumSum(arrayMap(x -> toUInt32(x), new_try)) AS try_of,
        arrayLastIndex(x -> x, new_try) AS last_try_at,
        client != 0 AND hull_hi - hull_lo > c_dur AND NOT whole_response AS headers_only,
        -- offset, lo, hi (without a client the request is its one attempt: the hull).
        $TIMELINE(client, c_lo, c_dur, hull_lo, hull_hi, whole_response)
    FROM request_clients
)
