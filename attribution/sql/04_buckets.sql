-- Stage 4: the sweep (engine.request_segments). Every attempt is an `other` interval and each of
-- its phases (its phase spans, else the synthetic phases of its gen_ai.latency.* figures,
-- anchored at the first token) an interval of its bucket's rank, all moved onto the client's
-- clock and clipped: phases to their attempt, attempts to the window. The window is cut at every
-- interval end; each piece goes to the lowest rank covering it, or to network where none does.
latency AS (
    SELECT
        *,
        -- Each attempt's gen_ai.latency.* figures in ns (engine.synthetic_phases), aligned with
        -- `attempts`: queue, first token, prefill, decode (e2e - ttft where the split is missing).
        arrayMap(m -> $NUM(m[$Q_KEY]), attempt_attrs) AS l_queue,
        arrayMap(m -> $NUM(m[$TTFT_KEY]), attempt_attrs) AS l_ttft,
        arrayMap(m -> $NUM(m[$PREFILL_KEY]), attempt_attrs) AS l_prefill,
        arrayMap(m -> $NUM(m[$DECODE_KEY]), attempt_attrs) AS l_decode,
        arrayMap(m -> $NUM(m[$E2E_KEY]), attempt_attrs) AS l_e2e
    FROM requests
),
latency_ns AS (
    SELECT
        * EXCEPT (l_queue, l_prefill, l_decode, l_e2e),
        arrayMap(x -> ifNull($S2NS(x), 0), l_queue) AS q_ns,
        arrayMap(x -> $S2NS(x), l_ttft) AS ttft_ns,
        arrayMap((t, q, p) -> if(t IS NOT NULL, t, q + ifNull($S2NS(p), 0)), ttft_ns, q_ns, l_prefill)
            AS first_ns,
        arrayMap((p, t, f, q) -> if(p IS NOT NULL, $S2NS(p),
            if(t IS NOT NULL, greatest(0, f - q), 0)), l_prefill, ttft_ns, first_ns, q_ns)
            AS prefill_ns,
        arrayMap((d, e, t, f) -> multiIf(d IS NOT NULL, $S2NS(d),
            e IS NOT NULL AND t IS NOT NULL, greatest(0, $S2NS(e) - f), NULL),
            l_decode, l_e2e, ttft_ns, first_ns) AS decode_ns
    FROM latency
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
                    arrayMap(j -> (toUInt8($RANK(buckets[j])), starts[j], ends[j]),
                        arrayFilter(j -> owner[j] = attempts[k], idx)),
                    if(latency[attempts[k]], $SYNTHETIC(k), [])))),
            range(1, n_attempts + 1)))) AS ivs
    FROM latency_ns
),
cut AS (
    SELECT
        *,
        arraySort(arrayDistinct(arrayConcat([lo, hi],
            arrayMap(iv -> iv.2, ivs), arrayMap(iv -> iv.3, ivs)))) AS cuts
    FROM intervals
),
swept AS (
    SELECT
        * EXCEPT (cuts),
        arrayMap((a, b) -> (arrayMin(arrayConcat([toUInt8($NETWORK_RANK)],
                arrayMap(iv -> if(iv.2 <= a AND iv.3 >= b, iv.1, toUInt8($NETWORK_RANK)), ivs))),
            b - a),
            arrayPopBack(cuts), arrayPopFront(cuts)) AS segments
    FROM cut
),
sums AS (
    SELECT
        * EXCEPT (segments, ivs),
        $BUCKET_SUMS
    FROM swept
)
