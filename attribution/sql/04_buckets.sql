-- Stage 4: the phases, the timeline and the sweep (engine.attempt_phases, engine.timeline,
-- engine.ranked_pieces). Each attempt's phases (its phase spans, else the synthetic phases of its
-- gen_ai.latency.* figures, anchored at the first token) are clipped to its window on the
-- server's clock; how far they and the response run (`reach`) decides, with the windows' hull,
-- the request's timeline on the client's clock (the skew offset, the window, headers-only).
-- Then every swept attempt's window is an `other` interval and each of its phases an interval of
-- its bucket's rank, all moved onto the client's clock and clipped to the window. The window is
-- cut at every interval end; each piece goes to the lowest rank covering it, or to network where
-- none does.
latency_s AS (
    SELECT
        * EXCEPT (new_try, try_of),
        -- Each attempt's gen_ai.latency.* figures (seconds), aligned with `attempts`.
        arrayMap(m -> $NUM_AT(m, $K_QUEUE), a_payloads) AS l_queue,
        arrayMap(m -> $NUM_AT(m, $K_TTFT), a_payloads) AS l_ttft,
        arrayMap(m -> $NUM_AT(m, $K_PREFILL), a_payloads) AS l_prefill,
        arrayMap(m -> $NUM_AT(m, $K_DECODE), a_payloads) AS l_decode,
        arrayMap(m -> $NUM_AT(m, $K_E2E), a_payloads) AS l_e2e
    FROM requests
),
latency_ns AS (
    SELECT
        * EXCEPT (l_queue, l_prefill, l_decode, l_e2e, l_ttft),
        -- engine.synthetic_phases in ns: queue, first token, prefill, and decode (e2e - ttft
        -- where the split is missing), each relative to its attempt's start.
        arrayMap(x -> ifNull($S2NS(x), 0), l_queue) AS q_ns,
        arrayMap(x -> $S2NS(x), l_ttft) AS ttft_ns,
        arrayMap((t, q, p) -> if(t IS NOT NULL, $S2NS(t), ifNull($S2NS(q), 0)
            + ifNull($S2NS(p), 0)), l_ttft, l_queue, l_prefill) AS first_ns,
        arrayMap(p -> $S2NS(p), l_prefill) AS prefill_given,
        arrayMap(d -> $S2NS(d), l_decode) AS decode_given,
        arrayMap(e -> $S2NS(e), l_e2e) AS e2e_ns
    FROM latency_s
),
synthetic AS (
    SELECT
        * EXCEPT (prefill_given, decode_given, e2e_ns),
        arrayMap((p, t, f, q) -> if(p IS NOT NULL, p, if(t IS NOT NULL, greatest(0, f - q), 0)),
            prefill_given, ttft_ns, first_ns, q_ns) AS prefill_ns,
        arrayMap((d, e, t, f) -> multiIf(d IS NOT NULL, d,
            e IS NOT NULL AND t IS NOT NULL, greatest(0, e - f), NULL),
            decode_given, e2e_ns, ttft_ns, first_ns) AS decode_ns
    FROM latency_ns
),
-- Each attempt's phases (rank, start, end) on the server's clock, clipped to its window.
attempt_phases AS (
    SELECT
        *,
        arrayMap(k -> arrayFilter(p -> p.3 > p.2, arrayMap(
            p -> (p.1, greatest(p.2, w_lo[k]), least(p.3, w_hi[k])),
            if(has(owner, attempts[k]),
                arrayMap(j -> (toUInt8(buckets[j] - 1), starts[j], ends[j]),
                    arrayFilter(j -> owner[j] = attempts[k], idx)),
                if(latency[attempts[k]], $SYNTHETIC(k), [])))),
            range(1, n_attempts + 1)) AS a_phases,
        arrayConcat(arrayFlatten(arrayMap(ps -> arrayMap(p -> p.3, ps), a_phases)),
            arrayFilter((h, r) -> r, w_hi, w_responds)) AS reach_ends
    FROM synthetic
),
timelines AS (
    SELECT
        * EXCEPT (reach_ends, w_responds),
        arrayMin(w_lo) AS hull_lo,
        arrayMax(w_hi) AS hull_hi,
        if(empty(reach_ends), NULL, arrayMax(reach_ends)) AS reach,
        -- offset, headers_only, skew, lo, hi (without a client the request is its one attempt).
        $TIMELINE(client, c_lo, c_dur, hull_lo, hull_hi, whole_response, reach)
    FROM attempt_phases
),
intervals AS (
    SELECT
        * EXCEPT (hull_lo, hull_hi, reach, whole_response, c_dur),
        arrayFilter(iv -> iv.3 > iv.2, arrayFlatten(arrayMap(k -> arrayConcat(
            [(toUInt8($OTHER_RANK), greatest(w_lo[k] + offset, lo), least(w_hi[k] + offset, hi))],
            arrayMap(p -> (p.1, greatest(p.2 + offset, greatest(w_lo[k] + offset, lo)),
                               least(p.3 + offset, least(w_hi[k] + offset, hi))), a_phases[k])),
            critical))) AS ivs,
        -- A KV-cache transfer recorded among the swept attempts' stages (engine._kv_transfer).
        arrayExists(k -> arrayExists(j -> owner[j] = attempts[k] AND buckets[j] = $KV_BUCKET,
            idx), critical) AS kv_recorded
    FROM timelines
),
cut AS (
    SELECT
        * EXCEPT (q_ns, first_ns, prefill_ns, latency, critical, a_phases, w_lo, w_hi),
        $CUTS(lo, hi, ivs) AS cuts
    FROM intervals
),
swept AS (
    SELECT
        * EXCEPT (ivs, cuts),
        $SEGMENTS(cuts, ivs) AS segments
    FROM cut
)
