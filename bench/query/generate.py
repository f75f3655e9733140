"""Synthetic attributed requests, generated inside ClickHouse (INSERT ... SELECT FROM numbers()).

Shapes loosely follow an LLM chat service: log-normal-ish buckets, a model-dependent prefill that
grows with prompt length, a queue that blows up in a few peak minutes, and some server-only rows.

Planted causes, for the questions "since when", "what is different" and "cold starts" (times
are offsets from ``plant_t0_ns``, the start of the generated week):

* a scale-up: pods 8-11 appear at 2 d 10 h (before it, requests go to pods 0-7); each replica's
  first ``COLD_S`` seconds run cold (prefill takes 2-4 s longer);
* one slow pod: from 4 d 14 h to 4 d 17 h, ``pod-3`` queues 2-5 s longer.

The buckets add up to E2eNs (network counts 0 without a client span, as the attributor writes
it). Each request's resource attributes name its replica (``service.instance.id``,
``k8s.pod.name``), its node (``host.name``, 4 nodes) and its zone (``cloud.availability_zone``,
3 zones).
"""

from __future__ import annotations

from bench.sqlids import hex_trace_id
from latscope.storage import ATTRIBUTION_TABLE, Store

_S = 10**9
#: When the planted causes happen, in seconds from the start of the generated week.
SCALE_UP_S = 2 * 86_400 + 10 * 3600
SLOW_POD_S = (4 * 86_400 + 14 * 3600, 4 * 86_400 + 17 * 3600)
SLOW_POD = "pod-3"
NEW_PODS = ("pod-8", "pod-9", "pod-10", "pod-11")
#: How long a replica that appears at the scale-up runs cold.
COLD_S = 120

#: ``rows`` requests spread over ``span_s`` seconds from ``t0_ns``; deterministic per row number.
GENERATE_SQL = f"""
INSERT INTO {ATTRIBUTION_TABLE} (Timestamp, TraceId, ServiceName, Model, Operation, Route,
    ResourceAttributes, StatusCode, HasClient, Attempts, E2eNs, NetworkNs, QueueNs, PreprocessNs,
    PrefillNs, DecodeNs, PostprocessNs, OtherNs, TtftClientNs, TtftServerNs, TpotNs, ItlP50Ns,
    ItlP99Ns, ItlMaxNs, Stalls, InputTokens, OutputTokens, ClockSkewNs, Gpu, SpanCount,
    SpansIngestedAt, Version, IsDeleted)
SELECT
    fromUnixTimestamp64Nano(ts_ns) AS Timestamp,
    {hex_trace_id("number")} AS TraceId,
    ['chat-api', 'embed-api', 'rag-api'][1 + cityHash64(number, 4) % 3] AS ServiceName,
    ['llama-3-8b', 'llama-3-70b', 'mistral-7b', 'qwen-2-72b'][1 + cityHash64(number, 5) % 4]
        AS Model,
    'chat' AS Operation,
    ['/v1/chat/completions', '/v1/completions'][1 + cityHash64(number, 6) % 2] AS Route,
    map('k8s.pod.name', pod_name, 'service.instance.id', pod_name || '-a1f3',
        'host.name', 'node-' || toString(pod % 4),
        'cloud.availability_zone', ['us-east-1a', 'us-east-1b', 'us-east-1c'][1 + pod % 3])
        AS ResourceAttributes,
    if(cityHash64(number, 8) % 100 = 0, 'Error', 'Ok') AS StatusCode,
    has_client AS HasClient,
    toUInt16(1 + (cityHash64(number, 9) % 50 = 0)) AS Attempts,
    if(has_client, network, 0) + queue + pre + prefill + decode + post + other AS E2eNs,
    if(has_client, network, NULL) AS NetworkNs,
    queue AS QueueNs, pre AS PreprocessNs, prefill AS PrefillNs, decode AS DecodeNs,
    post AS PostprocessNs, other AS OtherNs,
    if(has_client, toInt64(network + queue + pre + prefill), NULL) AS TtftClientNs,
    toInt64(queue + pre + prefill) AS TtftServerNs,
    decode / greatest(out_tokens - 1, 1) AS TpotNs,
    decode / greatest(out_tokens - 1, 1) * 0.9 AS ItlP50Ns,
    decode / greatest(out_tokens - 1, 1) * (2 + stalls * 10) AS ItlP99Ns,
    decode / greatest(out_tokens - 1, 1) * (3 + stalls * 20) AS ItlMaxNs,
    stalls AS Stalls,
    in_tokens AS InputTokens,
    out_tokens AS OutputTokens,
    toInt64(0) AS ClockSkewNs,
    map('decode.energy_mj', toFloat64(decode / 1e6 * 0.3),
        'prefill.energy_mj', toFloat64(prefill / 1e6 * 0.35),
        'decode.utilization_mean', toFloat64(40 + cityHash64(number, 10) % 50)) AS Gpu,
    toUInt32(7) AS SpanCount,
    now64(6) AS SpansIngestedAt,
    toUInt64(7) AS Version,
    toUInt8(0) AS IsDeleted
FROM (
    SELECT number,
        intDiv((number - {{first:UInt64}}) * {{span_s:UInt64}}, {{rows:UInt64}}) AS sec,
        {{t0_ns:Int64}} + toInt64(sec) * {_S} + toInt64(cityHash64(number, 1) % {_S}) AS ts_ns,
        -- seconds since the start of the week (where the planted causes are placed)
        intDiv(ts_ns - {{plant_t0_ns:Int64}}, {_S}) AS week_s,
        if(week_s >= {SCALE_UP_S}, cityHash64(number, 7) % 12, cityHash64(number, 7) % 8) AS pod,
        'pod-' || toString(pod) AS pod_name,
        pod >= 8 AND week_s < {SCALE_UP_S + COLD_S} AS cold,
        pod_name = '{SLOW_POD}' AND week_s >= {SLOW_POD_S[0]} AND week_s < {SLOW_POD_S[1]}
            AS slow_pod,
        cityHash64(number, 11) % 10 != 0 AS has_client,
        toUInt32(16 + cityHash64(number, 12) % 4000) AS in_tokens,
        toUInt32(1 + cityHash64(number, 13) % 300) AS out_tokens,
        toUInt32(cityHash64(number, 14) % 40 = 0) AS stalls,
        toUInt64(2e6 + cityHash64(number, 15) % 30000000) AS network,
        -- peak minutes (every 17th) queue for much longer, and so does the slow pod
        toUInt64((cityHash64(number, 16) % 20000000) * if(intDiv(sec, 60) % 17 = 0, 25, 1)
                 + if(slow_pod, 2000000000 + cityHash64(number, 22) % 3000000000, 0)) AS queue,
        toUInt64(1e6 + cityHash64(number, 17) % 5000000) AS pre,
        toUInt64(in_tokens * (40000 + cityHash64(number, 18) % 20000)
                 + if(cold, 2000000000 + cityHash64(number, 23) % 2000000000, 0)) AS prefill,
        toUInt64(out_tokens * (8000000 + cityHash64(number, 19) % 12000000)) AS decode,
        toUInt64(cityHash64(number, 20) % 3000000) AS post,
        toUInt64(cityHash64(number, 21) % 2000000) AS other
    FROM numbers({{first:UInt64}}, {{rows:UInt64}})
)
"""


def generate(
    store: Store,
    *,
    rows: int,
    t0_ns: int,
    span_s: int,
    first: int = 0,
    plant_t0_ns: int | None = None,
) -> None:
    """Insert ``rows`` synthetic requests (numbers ``first``..) over ``span_s`` s from ``t0_ns``;
    the planted causes are placed from ``plant_t0_ns`` (default ``t0_ns``)."""
    params = {
        "rows": rows,
        "t0_ns": t0_ns,
        "span_s": span_s,
        "first": first,
        "plant_t0_ns": t0_ns if plant_t0_ns is None else plant_t0_ns,
    }
    store.command(GENERATE_SQL, params)
