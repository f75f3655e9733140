from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetAttributionRequest(_message.Message):
    __slots__ = ("trace_id", "request_id")
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    trace_id: str
    request_id: str
    def __init__(self, trace_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class ListRequestsRequest(_message.Message):
    __slots__ = ("trace_id",)
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    trace_id: str
    def __init__(self, trace_id: _Optional[str] = ...) -> None: ...

class ListRequestsResponse(_message.Message):
    __slots__ = ("trace_id", "requests")
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    trace_id: str
    requests: _containers.RepeatedCompositeFieldContainer[RequestAttribution]
    def __init__(self, trace_id: _Optional[str] = ..., requests: _Optional[_Iterable[_Union[RequestAttribution, _Mapping]]] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("trace_id",)
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    trace_id: str
    def __init__(self, trace_id: _Optional[str] = ...) -> None: ...

class PathBuckets(_message.Message):
    __slots__ = ("network", "queue", "preprocess", "prefill", "decode", "postprocess", "other")
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PREPROCESS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    DECODE_FIELD_NUMBER: _ClassVar[int]
    POSTPROCESS_FIELD_NUMBER: _ClassVar[int]
    OTHER_FIELD_NUMBER: _ClassVar[int]
    network: float
    queue: float
    preprocess: float
    prefill: float
    decode: float
    postprocess: float
    other: float
    def __init__(self, network: _Optional[float] = ..., queue: _Optional[float] = ..., preprocess: _Optional[float] = ..., prefill: _Optional[float] = ..., decode: _Optional[float] = ..., postprocess: _Optional[float] = ..., other: _Optional[float] = ...) -> None: ...

class RunBudget(_message.Message):
    __slots__ = ("llm", "llm_buckets", "tool", "app")
    LLM_FIELD_NUMBER: _ClassVar[int]
    LLM_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    APP_FIELD_NUMBER: _ClassVar[int]
    llm: float
    llm_buckets: PathBuckets
    tool: float
    app: float
    def __init__(self, llm: _Optional[float] = ..., llm_buckets: _Optional[_Union[PathBuckets, _Mapping]] = ..., tool: _Optional[float] = ..., app: _Optional[float] = ...) -> None: ...

class RunRoot(_message.Message):
    __slots__ = ("span_id", "name", "service", "kind")
    SPAN_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    span_id: str
    name: str
    service: str
    kind: str
    def __init__(self, span_id: _Optional[str] = ..., name: _Optional[str] = ..., service: _Optional[str] = ..., kind: _Optional[str] = ...) -> None: ...

class RunCall(_message.Message):
    __slots__ = ("request_id", "start_ms", "e2e_ms", "on_critical_path_ms", "on_critical_path_buckets_ms", "attribution")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    E2E_MS_FIELD_NUMBER: _ClassVar[int]
    ON_CRITICAL_PATH_MS_FIELD_NUMBER: _ClassVar[int]
    ON_CRITICAL_PATH_BUCKETS_MS_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    start_ms: float
    e2e_ms: float
    on_critical_path_ms: float
    on_critical_path_buckets_ms: PathBuckets
    attribution: RequestAttribution
    def __init__(self, request_id: _Optional[str] = ..., start_ms: _Optional[float] = ..., e2e_ms: _Optional[float] = ..., on_critical_path_ms: _Optional[float] = ..., on_critical_path_buckets_ms: _Optional[_Union[PathBuckets, _Mapping]] = ..., attribution: _Optional[_Union[RequestAttribution, _Mapping]] = ...) -> None: ...

class RunTool(_message.Message):
    __slots__ = ("span_id", "name", "tool", "start_ms", "duration_ms", "on_critical_path_ms")
    SPAN_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    ON_CRITICAL_PATH_MS_FIELD_NUMBER: _ClassVar[int]
    span_id: str
    name: str
    tool: str
    start_ms: float
    duration_ms: float
    on_critical_path_ms: float
    def __init__(self, span_id: _Optional[str] = ..., name: _Optional[str] = ..., tool: _Optional[str] = ..., start_ms: _Optional[float] = ..., duration_ms: _Optional[float] = ..., on_critical_path_ms: _Optional[float] = ...) -> None: ...

class PathStep(_message.Message):
    __slots__ = ("span_id", "name", "category", "bucket", "request_id", "start_ms", "end_ms")
    SPAN_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    span_id: str
    name: str
    category: str
    bucket: str
    request_id: str
    start_ms: float
    end_ms: float
    def __init__(self, span_id: _Optional[str] = ..., name: _Optional[str] = ..., category: _Optional[str] = ..., bucket: _Optional[str] = ..., request_id: _Optional[str] = ..., start_ms: _Optional[float] = ..., end_ms: _Optional[float] = ...) -> None: ...

class Run(_message.Message):
    __slots__ = ("trace_id", "root", "e2e_ms", "critical_path_ms", "calls", "tools", "path", "cycles")
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    E2E_MS_FIELD_NUMBER: _ClassVar[int]
    CRITICAL_PATH_MS_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    CYCLES_FIELD_NUMBER: _ClassVar[int]
    trace_id: str
    root: RunRoot
    e2e_ms: float
    critical_path_ms: RunBudget
    calls: _containers.RepeatedCompositeFieldContainer[RunCall]
    tools: _containers.RepeatedCompositeFieldContainer[RunTool]
    path: _containers.RepeatedCompositeFieldContainer[PathStep]
    cycles: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, trace_id: _Optional[str] = ..., root: _Optional[_Union[RunRoot, _Mapping]] = ..., e2e_ms: _Optional[float] = ..., critical_path_ms: _Optional[_Union[RunBudget, _Mapping]] = ..., calls: _Optional[_Iterable[_Union[RunCall, _Mapping]]] = ..., tools: _Optional[_Iterable[_Union[RunTool, _Mapping]]] = ..., path: _Optional[_Iterable[_Union[PathStep, _Mapping]]] = ..., cycles: _Optional[_Iterable[str]] = ...) -> None: ...

class Buckets(_message.Message):
    __slots__ = ("network", "queue", "preprocess", "prefill", "decode", "postprocess", "other")
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PREPROCESS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    DECODE_FIELD_NUMBER: _ClassVar[int]
    POSTPROCESS_FIELD_NUMBER: _ClassVar[int]
    OTHER_FIELD_NUMBER: _ClassVar[int]
    network: float
    queue: float
    preprocess: float
    prefill: float
    decode: float
    postprocess: float
    other: float
    def __init__(self, network: _Optional[float] = ..., queue: _Optional[float] = ..., preprocess: _Optional[float] = ..., prefill: _Optional[float] = ..., decode: _Optional[float] = ..., postprocess: _Optional[float] = ..., other: _Optional[float] = ...) -> None: ...

class InterTokenLatency(_message.Message):
    __slots__ = ("p50", "p99", "max")
    P50_FIELD_NUMBER: _ClassVar[int]
    P99_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    p50: float
    p99: float
    max: float
    def __init__(self, p50: _Optional[float] = ..., p99: _Optional[float] = ..., max: _Optional[float] = ...) -> None: ...

class GpuFigures(_message.Message):
    __slots__ = ("figures",)
    class FiguresEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    FIGURES_FIELD_NUMBER: _ClassVar[int]
    figures: _containers.ScalarMap[str, float]
    def __init__(self, figures: _Optional[_Mapping[str, float]] = ...) -> None: ...

class RequestAttribution(_message.Message):
    __slots__ = ("trace_id", "service", "model", "e2e_ms", "buckets_ms", "ttft_ms", "ttft_server_ms", "tpot_ms", "itl_ms", "stalls", "input_tokens", "output_tokens", "clock_skew_ms", "attempts", "gpu", "start_unix_nano", "request_id", "client_headers_only", "kv_transfer_ms")
    class GpuEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: GpuFigures
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[GpuFigures, _Mapping]] = ...) -> None: ...
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    E2E_MS_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_MS_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    TTFT_SERVER_MS_FIELD_NUMBER: _ClassVar[int]
    TPOT_MS_FIELD_NUMBER: _ClassVar[int]
    ITL_MS_FIELD_NUMBER: _ClassVar[int]
    STALLS_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CLOCK_SKEW_MS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    START_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_HEADERS_ONLY_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_MS_FIELD_NUMBER: _ClassVar[int]
    trace_id: str
    service: str
    model: str
    e2e_ms: float
    buckets_ms: Buckets
    ttft_ms: float
    ttft_server_ms: float
    tpot_ms: float
    itl_ms: InterTokenLatency
    stalls: int
    input_tokens: int
    output_tokens: int
    clock_skew_ms: float
    attempts: int
    gpu: _containers.MessageMap[str, GpuFigures]
    start_unix_nano: int
    request_id: str
    client_headers_only: bool
    kv_transfer_ms: float
    def __init__(self, trace_id: _Optional[str] = ..., service: _Optional[str] = ..., model: _Optional[str] = ..., e2e_ms: _Optional[float] = ..., buckets_ms: _Optional[_Union[Buckets, _Mapping]] = ..., ttft_ms: _Optional[float] = ..., ttft_server_ms: _Optional[float] = ..., tpot_ms: _Optional[float] = ..., itl_ms: _Optional[_Union[InterTokenLatency, _Mapping]] = ..., stalls: _Optional[int] = ..., input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., clock_skew_ms: _Optional[float] = ..., attempts: _Optional[int] = ..., gpu: _Optional[_Mapping[str, GpuFigures]] = ..., start_unix_nano: _Optional[int] = ..., request_id: _Optional[str] = ..., client_headers_only: _Optional[bool] = ..., kv_transfer_ms: _Optional[float] = ...) -> None: ...

class SummaryRequest(_message.Message):
    __slots__ = ("since", "until", "service", "model", "group_by", "exact")
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    GROUP_BY_FIELD_NUMBER: _ClassVar[int]
    EXACT_FIELD_NUMBER: _ClassVar[int]
    since: str
    until: str
    service: str
    model: str
    group_by: str
    exact: bool
    def __init__(self, since: _Optional[str] = ..., until: _Optional[str] = ..., service: _Optional[str] = ..., model: _Optional[str] = ..., group_by: _Optional[str] = ..., exact: _Optional[bool] = ...) -> None: ...

class Percentiles(_message.Message):
    __slots__ = ("p50", "p90", "p95", "p99", "mean")
    P50_FIELD_NUMBER: _ClassVar[int]
    P90_FIELD_NUMBER: _ClassVar[int]
    P95_FIELD_NUMBER: _ClassVar[int]
    P99_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    p50: float
    p90: float
    p95: float
    p99: float
    mean: float
    def __init__(self, p50: _Optional[float] = ..., p90: _Optional[float] = ..., p95: _Optional[float] = ..., p99: _Optional[float] = ..., mean: _Optional[float] = ...) -> None: ...

class BucketStats(_message.Message):
    __slots__ = ("p50", "p95", "p99", "mean", "share")
    P50_FIELD_NUMBER: _ClassVar[int]
    P95_FIELD_NUMBER: _ClassVar[int]
    P99_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    p50: float
    p95: float
    p99: float
    mean: float
    share: float
    def __init__(self, p50: _Optional[float] = ..., p95: _Optional[float] = ..., p99: _Optional[float] = ..., mean: _Optional[float] = ..., share: _Optional[float] = ...) -> None: ...

class SummaryGroup(_message.Message):
    __slots__ = ("key", "count", "e2e_ms", "buckets_ms")
    class BucketsMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: BucketStats
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[BucketStats, _Mapping]] = ...) -> None: ...
    KEY_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    E2E_MS_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_MS_FIELD_NUMBER: _ClassVar[int]
    key: str
    count: int
    e2e_ms: Percentiles
    buckets_ms: _containers.MessageMap[str, BucketStats]
    def __init__(self, key: _Optional[str] = ..., count: _Optional[int] = ..., e2e_ms: _Optional[_Union[Percentiles, _Mapping]] = ..., buckets_ms: _Optional[_Mapping[str, BucketStats]] = ...) -> None: ...

class SummaryResponse(_message.Message):
    __slots__ = ("count", "e2e_ms", "buckets_ms", "groups", "since", "until")
    class BucketsMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: BucketStats
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[BucketStats, _Mapping]] = ...) -> None: ...
    COUNT_FIELD_NUMBER: _ClassVar[int]
    E2E_MS_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_MS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    count: int
    e2e_ms: Percentiles
    buckets_ms: _containers.MessageMap[str, BucketStats]
    groups: _containers.RepeatedCompositeFieldContainer[SummaryGroup]
    since: str
    until: str
    def __init__(self, count: _Optional[int] = ..., e2e_ms: _Optional[_Union[Percentiles, _Mapping]] = ..., buckets_ms: _Optional[_Mapping[str, BucketStats]] = ..., groups: _Optional[_Iterable[_Union[SummaryGroup, _Mapping]]] = ..., since: _Optional[str] = ..., until: _Optional[str] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("service", "model", "min_e2e_ms")
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MIN_E2E_MS_FIELD_NUMBER: _ClassVar[int]
    service: str
    model: str
    min_e2e_ms: float
    def __init__(self, service: _Optional[str] = ..., model: _Optional[str] = ..., min_e2e_ms: _Optional[float] = ...) -> None: ...
