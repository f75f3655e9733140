"""The codes the SQL attributor's statements and the spans table share: every attribute key the
rules read and its code (``LatscopeRuleAttributes``), what each kind of span keeps in its
payload, the facts and phase codes ClickHouse computes as a span is stored, and the per-span
flags; with the literals they are rendered as.
"""

from __future__ import annotations

from latscope.attribution.engine import (
    GPU_KEYS,
    LATENCY_KEYS,
    RANK,
)
from latscope.semconv import (
    ClientAttributes,
    GenAIAttributes,
    HttpAttributes,
    LatscopeAttributes,
    OpenInferenceAttributes,
    Phase,
    VllmAttributes,
)

#: Attributes merged per request (the last attempt's, else the client chain's; m_<name>).
MERGED: dict[str, str] = {
    "MODEL": GenAIAttributes.REQUEST_MODEL,
    "RESPONSE_MODEL": GenAIAttributes.RESPONSE_MODEL,
    "PROVIDER": GenAIAttributes.PROVIDER_NAME,
    "SYSTEM": GenAIAttributes.SYSTEM,
    "OPERATION": GenAIAttributes.OPERATION_NAME,
    "ROUTE": HttpAttributes.ROUTE,
    "INPUT": GenAIAttributes.USAGE_INPUT_TOKENS,
    "PROMPT": GenAIAttributes.USAGE_PROMPT_TOKENS,
    "OUTPUT": GenAIAttributes.USAGE_OUTPUT_TOKENS,
    "COMPLETION": GenAIAttributes.USAGE_COMPLETION_TOKENS,
    "OI_PROMPT": OpenInferenceAttributes.TOKEN_COUNT_PROMPT,
    "OI_COMPLETION": OpenInferenceAttributes.TOKEN_COUNT_COMPLETION,
}
#: Output counts: read from the client chain alone (c_<name>), the attempts' own beside.
OUTPUT_COUNTS = ("OUTPUT", "COMPLETION", "OI_COMPLETION")
#: What a client chain says of streaming (engine.streamed).
STREAMING: dict[str, str] = {
    "STREAM": GenAIAttributes.REQUEST_STREAM,
    "IS_STREAMING": GenAIAttributes.IS_STREAMING,
    "OI_PARAMS": OpenInferenceAttributes.INVOCATION_PARAMETERS,
}
#: Latency figures of vLLM / SGLang (seconds) by their code name; engine.LATENCY_KEYS in order.
LATENCY: dict[str, str] = dict(
    zip(("QUEUE", "TTFT", "PREFILL", "DECODE", "E2E"), LATENCY_KEYS, strict=True)
)
assert LATENCY["TTFT"] == VllmAttributes.TIME_TO_FIRST_TOKEN
GPU: dict[str, str] = {f"GPU_{i}": key for i, key in enumerate(GPU_KEYS, 1)}
#: Every attribute key the rules read, by the name of its code (``$K_<NAME>``): codes 1, 2, ... in
#: this order. The spans table stores each span's attributes of these keys by code
#: (``LatscopeRuleAttributes``, deploy/clickhouse/007_rule_attributes.sql, a list a test holds
#: equal to this one): so the order never changes, and a new key goes last, with a new DDL file.
KEYS: dict[str, str] = {
    **{name: key for name, key in MERGED.items() if not name.startswith("OI_")},
    "OFFSETS": LatscopeAttributes.TOKEN_OFFSETS_US,
    "TOKEN_COUNT": LatscopeAttributes.TOKEN_COUNT,
    "FIRST_TOKEN_NS": LatscopeAttributes.FIRST_TOKEN_NS,
    "LAST_BYTE": ClientAttributes.LAST_BYTE_NS,
    "FIRST_CHUNK": GenAIAttributes.RESPONSE_TIME_TO_FIRST_CHUNK,
    **LATENCY,
    **GPU,
    "PHASE": LatscopeAttributes.PHASE,
    # deploy/clickhouse/014_calls_as_made.sql
    "OI_PROMPT": OpenInferenceAttributes.TOKEN_COUNT_PROMPT,
    "OI_COMPLETION": OpenInferenceAttributes.TOKEN_COUNT_COMPLETION,
    **STREAMING,
    "OI_KIND": OpenInferenceAttributes.SPAN_KIND,
    "ASGI_EVENT": HttpAttributes.ASGI_EVENT_TYPE,
    "ASGI_EVENT_OLD": HttpAttributes.ASGI_EVENT_TYPE_OLD,
    # deploy/clickhouse/016_engine_rules.sql: what the shipped rulebook reads beyond these
    # (attribution/rules; a user's file reads its own keys by name).
    "KV_TRANSFER_TIME": "gen_ai.latency.kv_cache_transfer_time",
    "TGI_VALIDATION": "validation_time",
    "TGI_QUEUE": "queue_time",
    "TGI_INFERENCE": "inference_time",
    "TGI_TOTAL": "total_time",
    "DYNAMO_METHOD": "method",
    "DYNAMO_URI": "uri",
}
#: Codes of payload values that are not attributes: the span's status, and the time of
#: latscope's first-token event.
EXTRA_CODES = ("STATUS", "FIRST_TOKEN_EVENT")
CODES: dict[str, int] = {name: code for code, name in enumerate([*KEYS, *EXTRA_CODES], 1)}
assert max(CODES.values()) < 64  # a set of codes is a UInt64 bit mask

#: What each kind of span keeps in its payload (stage 1): a server-like span (a possible attempt)
#: its merged attributes, latency figures and status; a CLIENT span (a possible link of a client
#: chain) its merged attributes and first-token figures; a decode span with token offsets those
#: and its token count; a prefill or decode span with GPU figures those.
PAYLOAD: dict[str, tuple[str, ...]] = {
    "ATTEMPT": (*MERGED, "STATUS"),
    "CLIENT": (
        *MERGED,
        "FIRST_TOKEN_NS",
        "LAST_BYTE",
        "FIRST_CHUNK",
        "FIRST_TOKEN_EVENT",
        *STREAMING,
    ),
    "DECODE": ("OFFSETS", "TOKEN_COUNT"),
    "GPU": tuple(GPU),
}

#: What ClickHouse computes for each span as it is stored (deploy/clickhouse/010_span_facts.sql,
#: a test holds the two equal): ``LatscopePhase``, the code of its latscope.phase value (its
#: position in Phase.ALL plus one; 0: none), and ``LatscopeFacts``, these bits of its rule
#: attributes: a gen_ai.latency.* key, a gen_ai.latency.* value that is a number, token offsets
#: that are a JSON array of integers (not empty), a GPU figure that is a number.
PHASE_CODES: dict[str, int] = {phase: code for code, phase in enumerate(Phase.ALL, 1)}
FACTS: dict[str, int] = {"LATENCY_KEY": 1, "LATENCY_NUMBER": 2, "OFFSETS": 4, "GPU_NUMBER": 8}

#: Per-span flags (stage 1 packs them into one UInt32, stage 2 unpacks them into arrays): the
#: kind (SERVER, CLIENT), latscope.phase set, gen_ai.latency.* figures, server-like, a
#: client-side GenAI operation (engine.is_model_call), a SERVER span's own word that it serves a
#: model (engine._says_inference), an ASGI response-body message, an SGLang prefill or decode
#: worker's root, a decode span with token offsets, a phase span with GPU figures; the phase
#: bucket (rank + 1) is stored above them, times BUCKET.
FLAGS: dict[str, int] = {
    "SERVER": 1,
    "CLIENT": 2,
    "LATSCOPE_PHASE": 4,
    "LATENCY": 8,
    "SERVER_LIKE": 16,
    "MODEL_CALL": 32,
    "TIMED": 64,
    "GPU": 128,
    "SAYS": 256,
    "RESPONSE": 512,
    "PREFILL_ROOT": 1024,
    "DECODE_ROOT": 2048,
    "BUCKET": 4096,
}


def literal(value: str) -> str:
    """A ClickHouse string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _array(values: list[str]) -> str:
    return "[" + ", ".join(literal(v) for v in values) + "]"


def _mask(names: tuple[str, ...]) -> str:
    return f"toUInt64({sum(1 << CODES[n] for n in names)})"


def _bucket(name: str) -> int:
    """A phase bucket's code: its rank + 1 (0: not a phase)."""
    return RANK[name] + 1
