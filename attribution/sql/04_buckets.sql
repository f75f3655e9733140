-- Stage 4: the phases, the timeline and the sweep (engine.attempt_phases, engine.timeline,
-- engine.ranked_pieces). Each attempt's phases (its phase spans, else the synthetic phases of its
-- gen_ai.latency.* figures, anchored at the first token) are clipped to its window on the
-- server's clock; how far they and the response run (`reach`) decides, with the windows' hull,
-- the request's timeline on the client's clock (the skew offset, the window, headers-only).
-- Then every swept attempt's window is an `other` interval and each of its phases an interval of
-- its bucket's rank, all moved onto the client's clock and clipped to the window. The window is
-- cut at every interval end; each piece goes to the lowest rank covering it, or to network where
-- none does.
engine_figures AS (
    SELECT
        * EXCEPT (new_try, try_of),
        -- Each attempt's first token from its start and the decode time its TPOT divides, by
        -- its engine's rules (stage 1), aligned with `attempts`.
        arrayMap(a -> if(efigures[a].1 IS NOT NULL, efigures[a].1,
            $FIRST_TOKEN_AFTER(a)), attempts) AS ttft_ns,
        arrayMap(a -> efigures[a].2, attempts) AS decode_ns
    FROM requests
),
-- Each attempt's synthetic phases (rank, start, end): its engine's from its figures, and its
-- parts' (engine.synthetic_phases, finding.engine_parts), unclipped.
attempt_synthetic AS (
    SELECT
        *,
        arrayMap(k -> arrayConcat($ENGINE_PHASES_OF(k), $PART_PHASES_OF(k)),
            range(1, n_attempts + 1)) AS a_synthetic
    FROM engine_figures
),
-- Each attempt's phases (rank, start, end) on the server's clock, clipped to its window.
attempt_phases AS (
    SELECT
        *,
        arrayMap(k -> arrayFilter(p -> p.3 > p.2, arrayMap(
            p -> (p.1, greatest(p.2, w_lo[k]), least(p.3, w_hi[k])),
            arrayConcat(
                arrayMap(j -> (toUInt8(buckets[j] - 1), starts[j], ends[j]),
                    arrayFilter(j -> owner[j] = attempts[k], idx)),
                a_synthetic[k]))),
            range(1, n_attempts + 1)) AS a_phases
    FROM attempt_synthetic
),
hulls AS (
    SELECT
        * EXCEPT (w_responds, w_content),
        arrayMin(w_lo) AS hull_lo,
        arrayMax(w_hi) AS hull_hi,
        -- How far the phases and the response's content run on the server's clock (NULL: no
        -- record).
        arrayConcat(arrayFlatten(arrayMap(ps -> arrayMap(p -> p.3, ps), a_phases)),
            arrayFilter((c, r) -> r, w_content, w_responds)) AS reach_ends,
        if(empty(reach_ends), NULL, arrayMax(reach_ends)) AS reach
    FROM attempt_phases
),
-- The timeline (without a client the request is its one attempt): offset and headers_only,
-- then skew and the window (lo, hi) from them.
timelines AS (
    SELECT
        * EXCEPT (reach_ends),
        $TIMELINE(client, c_lo, c_dur, hull_lo, hull_hi, whole_response, reach)
    FROM hulls
),
clocked AS (
    SELECT
        *,
        $TIMELINE_WINDOW(client, c_lo, c_dur, hull_lo, hull_hi)
    FROM timelines
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
            idx) OR arrayExists(p -> p.1 = $KV_RANK, a_synthetic[k]), critical)
            AS kv_recorded
    FROM clocked
),
cut AS (
    SELECT
        * EXCEPT (latency, critical, a_phases, a_synthetic, w_lo, w_hi, ephases, efigures),
        $CUTS(lo, hi, ivs) AS cuts
    FROM intervals
),
swept AS (
    SELECT
        * EXCEPT (ivs, cuts),
        $SEGMENTS(cuts, ivs) AS segments
    FROM cut
)
