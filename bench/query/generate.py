"""Synthetic attributed requests, generated inside ClickHouse (INSERT ... SELECT FROM numbers()).

Shapes loosely follow an LLM chat service: log-normal-ish buckets, a model-dependent prefill that
grows with prompt length, a queue that blows up in a few peak minutes, and some server-only rows.
"""

from __future__ import annotations

from latscope.storage import ATTRIBUTION_TABLE, Store

#: ``rows`` requests spread over ``span_s`` seconds from ``t0_ns``; deterministic per row number.
GENERATE_SQL = f"""
INSERT INTO {ATTRIBUTION_TABLE} (Timestamp, TraceId, ServiceName, Model, Operation, Route,
    ResourceAttributes, StatusCode, HasClient, Attempts, E2eNs, NetworkNs, QueueNs, PreprocessNs,
    PrefillNs, DecodeNs, PostprocessNs, OtherNs, TtftClientNs, TtftServerNs, TpotNs, ItlP50Ns,
    ItlP99Ns, ItlMaxNs, Stalls, InputTokens, OutputTokens, ClockSkewNs, Gpu, SpanCount,
    SpansIngestedAt, Version, IsDeleted)
SELECT
    fromUnixTimestamp64Nano({{t0_ns:Int64}} + toInt64(sec) * 1000000000
                            + toInt64(cityHash64(number, 1) % 1000000000)) AS Timestamp,
    lower(hex(cityHash64(number, 2))) || lower(hex(cityHash64(number, 3))) AS TraceId,
    ['chat-api', 'embed-api', 'rag-api'][1 + cityHash64(number, 4) % 3] AS ServiceName,
    ['llama-3-8b', 'llama-3-70b', 'mistral-7b', 'qwen-2-72b'][1 + cityHash64(number, 5) % 4]
        AS Model,
    'chat' AS Operation,
    ['/v1/chat/completions', '/v1/completions'][1 + cityHash64(number, 6) % 2] AS Route,
    map('k8s.pod.name', 'pod-' || toString(cityHash64(number, 7) % 8)) AS ResourceAttributes,
    if(cityHash64(number, 8) % 100 = 0, 'Error', 'Ok') AS StatusCode,
    has_client AS HasClient,
    toUInt16(1 + (cityHash64(number, 9) % 50 = 0)) AS Attempts,
    network + queue + pre + prefill + decode + post + other AS E2eNs,
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
        cityHash64(number, 11) % 10 != 0 AS has_client,
        toUInt32(16 + cityHash64(number, 12) % 4000) AS in_tokens,
        toUInt32(1 + cityHash64(number, 13) % 300) AS out_tokens,
        toUInt32(cityHash64(number, 14) % 40 = 0) AS stalls,
        toUInt64(2e6 + cityHash64(number, 15) % 30000000) AS network,
        -- peak minutes (every 17th) queue for much longer
        toUInt64((cityHash64(number, 16) % 20000000) * if(intDiv(sec, 60) % 17 = 0, 25, 1))
            AS queue,
        toUInt64(1e6 + cityHash64(number, 17) % 5000000) AS pre,
        toUInt64(in_tokens * (40000 + cityHash64(number, 18) % 20000)) AS prefill,
        toUInt64(out_tokens * (8000000 + cityHash64(number, 19) % 12000000)) AS decode,
        toUInt64(cityHash64(number, 20) % 3000000) AS post,
        toUInt64(cityHash64(number, 21) % 2000000) AS other
    FROM numbers({{first:UInt64}}, {{rows:UInt64}})
)
"""


def generate(store: Store, *, rows: int, t0_ns: int, span_s: int, first: int = 0) -> None:
    """Insert ``rows`` synthetic requests (numbers ``first``..) over ``span_s`` s from ``t0_ns``."""
    params = {"rows": rows, "t0_ns": t0_ns, "span_s": span_s, "first": first}
    store.command(GENERATE_SQL, params)
