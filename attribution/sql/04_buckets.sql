-- Stage 4: the sweep (engine.request_segments). Every attempt is an `other` interval and each of
-- its phases (its phase spans, else the synthetic phases of its gen_ai.latency.* figures,
-- anchored at the first token) an interval of its bucket's rank, all moved onto the client's
-- clock and clipped: phases to their attempt, attempts to the window. The window is cut at every
-- interval end; each piece goes to the lowest rank covering it, or to network where none does.
latency_s AS (
    SELECT
        * EXCEPT (new_try, hull_lo, hull_hi, whole_response, c_dur, try_of),
        arrayMap(t -> arraySort(k -> (a_ends[k], a_starts[k], k),
            arrayFilter(k -> try_of[k] = t, range(1, n_attempts + 1)))[-1],
            range(1, tries + 1)) AS critical,
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
intervals AS (
    SELECT
        *,
        arrayFilter(iv -> iv.3 > iv.2, arrayFlatten(arrayMap(k -> arrayConcat(
            [(toUInt8($OTHER_RANK), greatest(a_starts[k] + offset, lo),
                least(a_ends[k] + offset, hi))],
            arrayMap(p -> (p.1, greatest(p.2 + offset, greatest(a_starts[k] + offset, lo)),
                               least(p.3 + offset, least(a_ends[k] + offset, hi))),
                if(has(owner, attempts[k]),
                    arrayMap(j -> (toUInt8(buckets[j] - 1), starts[j], ends[j]),
                        arrayFilter(j -> owner[j] = attempts[k], idx)),
                    if(latency[attempts[k]], $SYNTHETIC(k), [])))),
            critical))) AS ivs
    FROM synthetic
),
cut AS (
    SELECT
        * EXCEPT (a_starts, a_ends, q_ns, first_ns, prefill_ns, latency, critical),
        $CUTS(lo, hi, ivs) AS cuts
    FROM intervals
),
swept AS (
    SELECT
        * EXCEPT (ivs, cuts),
        $SEGMENTS(cuts, ivs) AS segments
    FROM cut
)
