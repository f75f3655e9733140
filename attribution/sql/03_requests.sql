-- Stage 3: one row per request (ARRAY JOIN of each trace's request keys): its attempts, their
-- windows (engine.Request.bounds: the model service's outermost SERVER span, cut at the end of
-- its response where the ASGI instrumentation recorded it), its client and client chain, and its
-- tries.
request_spans AS (
    SELECT
        * EXCEPT (is_inference, request_key, clients, outer_server),
        ids[req] AS request_span_id,
        -- Attempts: the inference spans under this key, oldest first (start, then span id).
        arraySort(i -> span_rank[i],
            arrayFilter((i, f, k) -> f AND k = req, idx, is_inference, request_key)) AS attempts,
        request_client[attempts[1]] AS client
    FROM traces
    ARRAY JOIN arrayDistinct(arrayFilter((k, f) -> f, request_key, is_inference)) AS req
),
request_fields AS (
    SELECT
        * EXCEPT (services, resources, req, request_client),
        toUInt32(length(ids)) AS n,
        length(attempts) AS n_attempts,
        attempts[-1] AS last,
        services[attempts[-1]] AS service,
        resources[attempts[-1]] AS resource,
        arrayMap(a -> starts[a], attempts) AS a_starts,
        arrayMap(a -> ends[a], attempts) AS a_ends,
        arrayMap(a -> window_of[a], attempts) AS windows,
        -- The payloads stage 5 reads: the attempts', the last one's window's, and the client
        -- chain's (the last attempt's transport and the links above it up to the client, nearest
        -- first; 0 and an empty map: none).
        arrayMap(a -> payloads[a], attempts) AS a_payloads,
        payloads[window_of[attempts[-1]]] AS pl_window,
        client_of[attempts[-1]] AS client0,
        if(client = client_of[attempts[-1]], 0, call_up[client_of[attempts[-1]]]) AS client1,
        if(client = client_of[attempts[-1]] OR client = call_up[client_of[attempts[-1]]], 0,
            call_up[call_up[client_of[attempts[-1]]]]) AS client2
    FROM request_spans
),
request_clients AS (
    SELECT
        * EXCEPT (call_up, response_owner, window_of),
        payloads[client0] AS pl_client,
        payloads[client1] AS pl_client1,
        payloads[client2] AS pl_client2,
        starts[client] AS c_lo,
        ends[client] - starts[client] AS c_dur,
        arrayMap(w -> starts[w], windows) AS w_lo,
        -- When each window's response-body messages were handed to the server (their spans'
        -- starts, finding._response_span), latest first (empty: none recorded).
        arrayMap(w -> arrayReverseSort(arrayMap(j -> starts[j],
            arrayFilter(j -> response_owner[j] = w, idx))), windows) AS w_sends,
        -- The client covers the whole response: a GenAI operation, or latscope's client, which
        -- records when it read the last byte.
        client != 0 AND (model_calls[client] OR arrayExists(x -> x IS NOT NULL,
            arrayMap(raw -> $PARSE_INT(raw), [payloads[client0][$K_LAST_BYTE],
                payloads[client1][$K_LAST_BYTE], payloads[client2][$K_LAST_BYTE]])))
            AS whole_response
    FROM request_fields
),
-- Each window cut at the end of its response's last message (w_hi), and where its content ended
-- (w_content, finding._response_span: a stream's closing message left out).
request_windows AS (
    SELECT
        * EXCEPT (w_sends),
        arrayMap((w, e) -> if(empty(e), ends[w], least(ends[w], greatest(starts[w], e[1]))),
            windows, w_sends) AS w_hi,
        arrayMap(e -> notEmpty(e), w_sends) AS w_responds,
        arrayMap((w, e) -> if(empty(e), ends[w],
            least(ends[w], greatest(starts[w], e[least(2, length(e))]))), windows, w_sends)
            AS w_content
    FROM request_clients
),
-- The request's tries, built up one column a layer: each reads the columns before it as
-- columns (see attribution/sql/__init__.py, "Layers").
request_tries AS (
    SELECT
        *,
        -- Tries: attempts whose windows overlap in time are one (vLLM's n > 1 samples, the two
        -- workers of a disaggregated request); a retry starts when every earlier one has ended.
        arrayMap(k -> k = 1 OR w_lo[k] >= arrayMax(arraySlice(w_hi, 1, k - 1)),
            range(1, n_attempts + 1)) AS new_try
    FROM request_windows
),
try_numbers AS (
    SELECT
        *,
        toUInt16(arrayCount(x -> x, new_try)) AS tries,
        arrayCumSum(arrayMap(x -> toUInt32(x), new_try)) AS try_of,
        arrayLastIndex(x -> x, new_try) AS last_try_at
    FROM request_tries
),
-- Of each try, the attempts the response waited for (finding.critical_attempts): the one that
-- ended last, then started last; every part of a disaggregated try (an engine's prefill and
-- decode roles, or several engine spans under one serving system). And the last try's samples
-- (engine._samples): the decode role's when it has roles; their output tokens
-- (engine._output_tokens): a serving system's last part's; their first token from the try's
-- start (the serving system's window's under one).
try_roles AS (
    SELECT
        *,
        arrayMap(t -> arrayExists(k -> try_of[k] = t AND disaggregated[attempts[k]],
            range(1, n_attempts + 1)), range(1, tries + 1)) AS role_try
    FROM try_numbers
),
try_parts AS (
    SELECT
        *,
        arrayMap(t -> role_try[t] OR (arrayCount(k -> try_of[k] = t, range(1, n_attempts + 1)) > 1
            AND arrayExists(k -> try_of[k] = t AND sys_of[attempts[k]] != 0,
                range(1, n_attempts + 1))), range(1, tries + 1)) AS split_try,
        arrayFilter(k -> try_of[k] = tries AND (NOT role_try[tries]
            OR decode_roots[attempts[k]]), range(1, n_attempts + 1)) AS samples
    FROM try_roles
),
requests AS (
    SELECT
        *,
        arrayFlatten(arrayMap(t -> if(split_try[t],
            arrayFilter(k -> try_of[k] = t, range(1, n_attempts + 1)),
            [arraySort(k -> (a_ends[k], a_starts[k], k),
                arrayFilter(k -> try_of[k] = t, range(1, n_attempts + 1)))[-1]]),
            range(1, tries + 1))) AS critical,
        if(NOT role_try[tries] AND length(samples) > 1
            AND arrayExists(k -> sys_of[attempts[k]] != 0, samples),
            [arraySort(k -> (a_ends[k], a_starts[k], k), samples)[-1]], samples) AS token_samples,
        arrayMin(arrayMap(k -> if(sys_of[attempts[k]] != 0, w_lo[k], a_starts[k]), samples))
            AS try_lo,
        -- The attempt whose prompt count is the request's (engine._input_tokens): a try in
        -- parts' prefill part (its prefill role, else its first part); 0: the merged one's.
        if(split_try[tries], arrayFirst(k -> try_of[k] = tries AND (NOT role_try[tries]
            OR (disaggregated[attempts[k]] AND NOT decode_roots[attempts[k]])),
            range(1, n_attempts + 1)), 0) AS input_at
    FROM try_parts
)
