"""Every span attribute, event and value that latscope writes or reads, in one place.

The SDK writes these names and the attributor reads them; the OpenTelemetry GenAI semantic
conventions are used where they exist, and vLLM / SGLang's ``gen_ai.latency.*`` keys are listed
so a vLLM server with tracing on needs no latscope SDK.
"""

from __future__ import annotations

from typing import Final


class Phase:
    """Values of ``latscope.phase``: the server-side buckets a phase span can stand for."""

    QUEUE: Final = "queue"
    PREPROCESS: Final = "preprocess"
    PREFILL: Final = "prefill"
    DECODE: Final = "decode"
    POSTPROCESS: Final = "postprocess"

    ALL: Final = (QUEUE, PREPROCESS, PREFILL, DECODE, POSTPROCESS)


#: The seven buckets of a request's end-to-end latency, in display order.
BUCKETS: Final = ("network", "queue", "preprocess", "prefill", "decode", "postprocess", "other")


class SpanKind:
    """``SpanKind`` strings as the spans table stores them (OTel ClickHouse exporter style)."""

    INTERNAL: Final = "Internal"
    SERVER: Final = "Server"
    CLIENT: Final = "Client"
    PRODUCER: Final = "Producer"
    CONSUMER: Final = "Consumer"
    UNSPECIFIED: Final = "Unspecified"

    #: Spellings of older OpenTelemetry Collector ClickHouse exporters (the protobuf enum
    #: names): read as the current ones.
    LEGACY: Final = {
        "SPAN_KIND_INTERNAL": INTERNAL,
        "SPAN_KIND_SERVER": SERVER,
        "SPAN_KIND_CLIENT": CLIENT,
        "SPAN_KIND_PRODUCER": PRODUCER,
        "SPAN_KIND_CONSUMER": CONSUMER,
        "SPAN_KIND_UNSPECIFIED": UNSPECIFIED,
    }

    @staticmethod
    def normalize(raw: str) -> str:
        """``SPAN_KIND_SERVER`` -> ``Server``; current spellings unchanged."""
        return SpanKind.LEGACY.get(raw, raw)


class StatusCode:
    """``StatusCode`` strings as the spans table stores them, and the older exporters' ones."""

    UNSET: Final = "Unset"
    OK: Final = "Ok"
    ERROR: Final = "Error"

    LEGACY: Final = {"STATUS_CODE_UNSET": UNSET, "STATUS_CODE_OK": OK, "STATUS_CODE_ERROR": ERROR}

    @staticmethod
    def normalize(raw: str) -> str:
        """``STATUS_CODE_ERROR`` -> ``Error``; current spellings unchanged."""
        return StatusCode.LEGACY.get(raw, raw)


class LatscopeAttributes:
    """latscope's own attribute and event names."""

    PHASE: Final = "latscope.phase"
    #: Absolute time (ns since the epoch, on the span's own clock) the first token was seen.
    FIRST_TOKEN_NS: Final = "latscope.first_token_ns"
    #: Event name alternative to FIRST_TOKEN_NS on a client span.
    FIRST_TOKEN_EVENT: Final = "latscope.first_token"
    #: Time the first byte of the response was seen (client span), ns since the epoch.
    FIRST_BYTE_NS: Final = "latscope.first_byte_ns"
    #: Int array on the decode span: each token's offset in µs from the decode span's start.
    TOKEN_OFFSETS_US: Final = "latscope.token_offsets_us"
    #: Int, how many tokens were recorded (equals len(TOKEN_OFFSETS_US) unless it was capped).
    TOKEN_COUNT: Final = "latscope.token_count"
    #: Why a stream ended early: "client_disconnect", "cancelled", ...
    STREAM_END: Final = "latscope.stream.end"
    #: GPU figures on prefill / decode phase spans.
    GPU_UTIL_MEAN: Final = "latscope.gpu.utilization.mean"
    GPU_UTIL_MAX: Final = "latscope.gpu.utilization.max"
    GPU_MEMORY_USED_MAX: Final = "latscope.gpu.memory.used.max"
    GPU_POWER_MEAN: Final = "latscope.gpu.power.mean"
    GPU_SM_CLOCK: Final = "latscope.gpu.sm_clock"
    GPU_ENERGY_MJ: Final = "latscope.gpu.energy_mj"
    GPU_UUIDS: Final = "latscope.gpu.uuids"


class GenAIAttributes:
    """OpenTelemetry GenAI semantic-convention keys (and the older names still in the wild)."""

    OPERATION_NAME: Final = "gen_ai.operation.name"
    #: The conversation (session, thread) a call belongs to, across traces.
    CONVERSATION_ID: Final = "gen_ai.conversation.id"
    #: What the SDK writes; ``SYSTEM`` is its deprecated predecessor, still read.
    PROVIDER_NAME: Final = "gen_ai.provider.name"
    SYSTEM: Final = "gen_ai.system"
    TOOL_NAME: Final = "gen_ai.tool.name"
    #: Seconds from the request's start until the first chunk of a streamed response (client).
    RESPONSE_TIME_TO_FIRST_CHUNK: Final = "gen_ai.response.time_to_first_chunk"
    #: Whether the call asked for a streamed response (semantic conventions v1.41; a boolean).
    REQUEST_STREAM: Final = "gen_ai.request.stream"
    #: traceloop's (opentelemetry-instrumentation-openai) spelling of the same.
    IS_STREAMING: Final = "gen_ai.is_streaming"
    REQUEST_MODEL: Final = "gen_ai.request.model"
    RESPONSE_MODEL: Final = "gen_ai.response.model"
    REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
    USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
    USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
    # Older names, still emitted by vLLM and SGLang.
    USAGE_PROMPT_TOKENS: Final = "gen_ai.usage.prompt_tokens"
    USAGE_COMPLETION_TOKENS: Final = "gen_ai.usage.completion_tokens"


class GenAIOperation:
    """Values of ``gen_ai.operation.name`` that the run explanation tells apart."""

    EXECUTE_TOOL: Final = "execute_tool"
    INVOKE_AGENT: Final = "invoke_agent"
    #: Operations that are a call to a model (a span with one of these wraps an LLM call).
    MODEL_CALLS: Final = ("chat", "text_completion", "generate_content", "embeddings")


class GenAIEvents:
    """Span events of the GenAI client instrumentations that mark the first chunk of a stream:
    latscope's own, OpenInference's (on its LLM span) and traceloop's (one per chunk; the
    earliest is the first)."""

    LATSCOPE_FIRST_TOKEN: Final = "latscope.first_token"
    OPENINFERENCE_FIRST_TOKEN: Final = "First Token Stream Event"
    TRACELOOP_CHUNK: Final = "gen_ai.content.completion.chunk"
    FIRST_CHUNK: Final = (LATSCOPE_FIRST_TOKEN, OPENINFERENCE_FIRST_TOKEN, TRACELOOP_CHUNK)


class OpenInferenceAttributes:
    """OpenInference's attributes latscope reads (its LLM client spans are INTERNAL) and its
    session id (``using_session``)."""

    SPAN_KIND: Final = "openinference.span.kind"
    LLM: Final = "LLM"
    SESSION_ID: Final = "session.id"
    #: The call's parameters as JSON; ``"stream": true`` among them for a streamed call.
    INVOCATION_PARAMETERS: Final = "llm.invocation_parameters"
    TOKEN_COUNT_PROMPT: Final = "llm.token_count.prompt"
    TOKEN_COUNT_COMPLETION: Final = "llm.token_count.completion"


#: ``llm.invocation_parameters`` of a streamed call (JSON's whitespace only, so Python's ``re``
#: and ClickHouse's RE2 read it alike).
STREAM_PARAMETER: Final = r'"stream"[ \t\n\r]*:[ \t\n\r]*true'


class TraceloopAttributes:
    """traceloop-sdk's session id, as an association property
    (``Traceloop.set_association_properties({"session_id": ...})``); its newer
    ``set_conversation_id`` writes ``gen_ai.conversation.id``."""

    SESSION_ID: Final = "traceloop.association.properties.session_id"


#: The attributes that name a span's conversation, first found wins: the GenAI convention, then
#: OpenInference's and traceloop's session ids (deploy/clickhouse/013_conversations.sql reads
#: the same keys in the same order; a test holds them equal).
CONVERSATION_KEYS: Final = (
    GenAIAttributes.CONVERSATION_ID,
    OpenInferenceAttributes.SESSION_ID,
    TraceloopAttributes.SESSION_ID,
)


class VllmAttributes:
    """vLLM / SGLang ``llm_request`` span latencies, floats in seconds.

    vLLM v1 sets all but the last two; older vLLM has no prefill/decode split (queue, TTFT, e2e
    only); SGLang's request root has TTFT, e2e, decode, inference and prefill (no queue).
    """

    SPAN_NAME: Final = "llm_request"
    TIME_IN_QUEUE: Final = "gen_ai.latency.time_in_queue"
    TIME_TO_FIRST_TOKEN: Final = "gen_ai.latency.time_to_first_token"
    TIME_IN_MODEL_PREFILL: Final = "gen_ai.latency.time_in_model_prefill"
    TIME_IN_MODEL_DECODE: Final = "gen_ai.latency.time_in_model_decode"
    TIME_IN_MODEL_FORWARD: Final = "gen_ai.latency.time_in_model_forward"
    TIME_IN_MODEL_EXECUTE: Final = "gen_ai.latency.time_in_model_execute"
    TIME_IN_MODEL_INFERENCE: Final = "gen_ai.latency.time_in_model_inference"
    E2E: Final = "gen_ai.latency.e2e"


#: What a stage slice stands for besides the buckets: the KV-cache hand-over of disaggregated
#: serving. It counts in ``other`` (it is neither queueing nor compute on this request) and is
#: reported on its own (``kv_transfer_ms``).
KV_TRANSFER: Final = "kv_transfer"

#: SGLang's request stage slices (``RequestStage`` in python/sglang/srt/observability/
#: req_time_stats.py): span name -> the bucket it stands for, under an SGLang request root. The
#: dispatch and preparation stages (``api_server_dispatch``, ``dpc_dispatch``,
#: ``request_process``, ``prefill_prepare``, ``decode_prepare``) are containers of these or
#: request handling: they stay ``other``. Under prefill/decode disaggregation (``prefill Req`` and
#: ``decode Req`` roots, ``SglangSpans``) the bootstrap stages wait for a slot on the other worker
#: (queue), and the KV-cache transfer (the prefill worker sending it, the decode worker waiting
#: for it) is ``KV_TRANSFER``.
SGLANG_STAGES: Final = {
    "tokenize": "preprocess",
    "prefill_waiting": "queue",
    "decode_waiting": "queue",
    "prefill_bootstrap": "queue",
    "decode_bootstrap": "queue",
    "prefill_forward": "prefill",
    "chunked_prefill": "prefill",
    "decode_forward": "decode",
    "decode_loop": "decode",
    "prefill_transfer_kv_cache": KV_TRANSFER,
    "decode_transferred": KV_TRANSFER,
}


class SglangSpans:
    """SGLang's request roots under prefill/decode disaggregation: ``f"{role} Req {rid[:8]}"``
    (python/sglang/srt/observability/trace.py), one on each worker, for one request."""

    PREFILL_ROOT: Final = "prefill Req "
    DECODE_ROOT: Final = "decode Req "


class HttpAttributes:
    """HTTP semantic-convention keys latscope reads for the route dimension."""

    ROUTE: Final = "http.route"
    #: On the ASGI instrumentation's ``http send`` spans (children of its SERVER span): which
    #: message was sent. The last ``http.response.body`` ends the response as the app hands it
    #: over (the span's start; its end is when the server's write returned).
    ASGI_EVENT_TYPE: Final = "asgi.event.type"
    #: Its name before opentelemetry-instrumentation-asgi 0.43b0 (0.41b0 writes ``type``).
    ASGI_EVENT_TYPE_OLD: Final = "type"
    ASGI_RESPONSE_BODY: Final = "http.response.body"
    URL_PATH: Final = "url.path"
    REQUEST_METHOD: Final = "http.request.method"
    RESPONSE_STATUS_CODE: Final = "http.response.status_code"


#: Routes of model-serving APIs: a SERVER span whose ``http.route`` ends with one of these serves
#: an inference call (OpenAI-compatible servers: vLLM, SGLang, TGI, llama.cpp, LiteLLM; SGLang's and
#: TGI's native ``/generate``; Triton's ``/v2/models/{model}/generate``; Anthropic-style
#: ``/v1/messages``).
INFERENCE_ROUTES: Final = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/messages",
    "/generate",
    "/generate_stream",
)


class ResourceAttributes:
    SERVICE_NAME: Final = "service.name"
    HOST_NAME: Final = "host.name"


class GpuMetricAttributes:
    """Attributes on the SDK's periodic NVML gauge samples."""

    UUID: Final = "gpu.uuid"
    INDEX: Final = "gpu.index"


class ServerAttributes:
    """What the SDK adds to a request's SERVER span (times in ns on the server's clock)."""

    #: Server-side time to first token: first recorded token − server span start.
    TTFT_NS: Final = "latscope.server.ttft_ns"
    #: Server-side time per output token after the first: (last − first) / (count − 1).
    TPOT_NS: Final = "latscope.server.tpot_ns"
    #: Tokens counted but not timed because the decode span's buffer was full (bounded memory).
    TOKENS_NOT_TIMED: Final = "latscope.token_not_timed"
    #: Values of ``LatscopeAttributes.STREAM_END``.
    END_CLIENT_DISCONNECT: Final = "client_disconnect"
    END_CANCELLED: Final = "cancelled"


class ClientAttributes:
    """What the SDK adds to a CLIENT span besides ``LatscopeAttributes.FIRST_*_NS``."""

    #: Time the response's last byte was read, ns since the epoch on the client's clock.
    LAST_BYTE_NS: Final = "latscope.last_byte_ns"
    URL_FULL: Final = "url.full"
    SERVER_ADDRESS: Final = "server.address"
    SERVER_PORT: Final = "server.port"
    ERROR_TYPE: Final = "error.type"


class GpuMetrics:
    """Names and units of the SDK's periodic NVML gauges (OTLP metrics)."""

    UTILIZATION: Final = "latscope.gpu.utilization"  # percent
    MEMORY_USED: Final = "latscope.gpu.memory.used"  # bytes
    POWER: Final = "latscope.gpu.power"  # watts
    SM_CLOCK: Final = "latscope.gpu.sm_clock"  # MHz
    ENERGY: Final = "latscope.gpu.energy"  # mJ, the driver's counter since it loaded


class GenAIMetrics:
    """The GenAI semantic conventions' metrics the SDK emits: (name, unit, bucket boundaries).

    The boundaries are the conventions' ``ExplicitBucketBoundaries`` advice, so a Prometheus or
    Grafana user sees the standard histograms.
    """

    _SECONDS: Final = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                       40.96, 81.92)  # fmt: skip
    SERVER_REQUEST_DURATION: Final = ("gen_ai.server.request.duration", "s", _SECONDS)
    SERVER_TIME_TO_FIRST_TOKEN: Final = (
        "gen_ai.server.time_to_first_token",
        "s",
        (
            0.001,
            0.005,
            0.01,
            0.02,
            0.04,
            0.06,
            0.08,
            0.1,
            0.25,
            0.5,
            0.75,
            1.0,
            2.5,
            5.0,
            7.5,
            10.0,
        ),
    )
    SERVER_TIME_PER_OUTPUT_TOKEN: Final = (
        "gen_ai.server.time_per_output_token",
        "s",
        (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5),
    )
    CLIENT_OPERATION_DURATION: Final = ("gen_ai.client.operation.duration", "s", _SECONDS)
    CLIENT_TOKEN_USAGE: Final = (
        "gen_ai.client.token.usage",
        "{token}",
        tuple(float(4**i) for i in range(14)),  # 1, 4, 16, ... 67108864
    )
    #: ``gen_ai.token.type`` on ``CLIENT_TOKEN_USAGE``, and its two values.
    TOKEN_TYPE: Final = "gen_ai.token.type"
    TOKEN_INPUT: Final = "input"
    TOKEN_OUTPUT: Final = "output"
