-- Stage 4: the sweep (engine.request_segments). Every attempt is an `other` interval and each of
-- its phases (its phase spans, else the synthetic phases of its gen_ai.latency.* figures,
-- anchored at the first token) an interval of its bucket's rank, all moved onto the client's
-- clock and clipped: phases to their attempt, attempts to the window. The window is cut at every
-- interval end; each piece goes to the lowest rank covering it, or to network where none does.
intervals AS (
    SELECT
        *,
        arrayFilter(iv -> iv.3 > iv.2, arrayFlatten(arrayMap(a -> arrayConcat(
            [(toUInt8($OTHER_RANK), greatest(starts[a] + offset, lo), least(ends[a] + offset, hi))],
            arrayMap(p -> (p.1, greatest(p.2 + offset, greatest(starts[a] + offset, lo)),
                               least(p.3 + offset, least(ends[a] + offset, hi))),
                if(has(owner, a),
                    arrayMap(j -> (toUInt8($RANK(buckets[j])), starts[j], ends[j]),
                        arrayFilter(j -> owner[j] = a, idx)),
                    if(latency[a], $SYNTHETIC, [])))), attempts))) AS ivs
    FROM requests
),
cut AS (
    SELECT
        *,
        arraySort(arrayDistinct(arrayConcat([lo, hi],
            arrayMap(iv -> iv.2, ivs), arrayMap(iv -> iv.3, ivs)))) AS cuts
    FROM intervals
),
pieces AS (
    SELECT
        *,
        arrayMap((a, b) -> (arrayMin(arrayConcat([toUInt8($NETWORK_RANK)],
                arrayMap(iv -> if(iv.2 <= a AND iv.3 >= b, iv.1, toUInt8($NETWORK_RANK)), ivs))),
            b - a),
            arrayPopBack(cuts), arrayPopFront(cuts)) AS segments
    FROM cut
),
swept AS (
    SELECT
        *,
        $BUCKET_SUMS
    FROM pieces
)
