"""The production attributor's SQL: the rules of ``attribution/engine.py`` as one ClickHouse
``INSERT ... SELECT`` from the spans table into the attribution table, so spans never leave the
store and attribution runs where the data is (shard-local on a cluster).

The statement is built from one ``.sql`` file per stage (common table expressions, read in
order): ``00_span_rows`` reads the batch's spans with their attribute keys as codes (both paths
read it), ``01_spans`` reduces each span to its times, kind, flags and the raw values of the
attributes a later stage may read, ``02_traces`` groups each trace's spans into arrays and finds
its requests, ``03_requests`` gives one row per request with its attempts, their windows, its
client and tries, ``04_buckets`` places them on the client's clock and runs the priority sweep,
``05_rows`` parses the attributes of the spans each request picks and computes the streaming
figures, tokens and GPU figures, ``06_insert`` names the table's columns. ``simple_1_spans``
.. ``simple_3_rows`` are the single-call path, the same rows for the traces of one call of the
common shape from one ``GROUP BY`` per trace (``simple_select``). docs/attribution.md ("The SQL
attributor") walks through a worked example and gives the cost of each stage.

The stage files hold ``$NAME`` placeholders for values that come from the Python rules (attribute
keys and their codes, flags, priorities, regular expressions), and ``$NAME(a, b)`` for small
repeated expressions; both are rendered here from named constants and nothing else: an unknown
name is an error, and no value from a request or a span is ever rendered into the text (those
are ClickHouse parameters, ``{name:Type}``, bound at run time).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, partial
from importlib import resources

from latscope import sqltext
from latscope.attribution import rules
from latscope.attribution.engine import (
    CLIENT_CHAIN,
    DEFAULT_STALL_NS,
    FIRST_OFFSET_US,
    GPU_KEYS,
    GPU_PHASES,
    ITL_MAX_NS,
    ITL_P50_NS,
    ITL_P99_NS,
    KV_RANK,
    LATENCY_KEYS,
    MAX_ANCESTRY,
    MAX_PHASE_DEPTH,
    MAX_SECONDS,
    MAX_TOKENS,
    NETWORK_RANK,
    OTHER_RANK,
    RANK,
    STALLS,
    TOKENS,
    TPOT_NS,
)
from latscope.attribution.model import INTEGER, MAX_FLOAT, NUMBER
from latscope.attribution.sql.engines import EngineSql
from latscope.attribution.table import BUCKET_COLUMNS
from latscope.semconv import (
    INFERENCE_ROUTES,
    KV_TRANSFER,
    STREAM_PARAMETER,
    ClientAttributes,
    GenAIAttributes,
    GenAIOperation,
    HttpAttributes,
    LatscopeAttributes,
    OpenInferenceAttributes,
    Phase,
    SpanKind,
    StatusCode,
    VllmAttributes,
)
from latscope.storage import RESOURCE_REFRESH_S, RESOURCES_TABLE

#: Read by both paths: the batch's spans with their attribute codes.
SPAN_ROWS = "00_span_rows.sql"
STAGES = (
    SPAN_ROWS,
    "01_spans.sql",
    "02_traces.sql",
    "03_requests.sql",
    "04_buckets.sql",
    "05_rows.sql",
)
FINAL = "06_insert.sql"
#: The single-call path: one GROUP BY per trace for traces of the common shape (a client, one
#: server span, its phases), the same rows as the stages above (``simple_select``).
SIMPLE_STAGES = (SPAN_ROWS, "simple_1_spans.sql", "simple_2_traces.sql", "simple_3_rows.sql")

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


# -- small expressions used in several places ----------------------------------------------------


def num(expr: str) -> str:
    """model.parse_float: a decimal number clamped to +-MAX_FLOAT, else NULL."""
    value = clamp(f"toFloat64OrNull({expr})", MAX_FLOAT)
    return f"if(match({expr}, {literal(NUMBER.pattern)}), {value}, NULL)"


def clamp(value: str, bound: float) -> str:
    """``value`` clamped to [-bound, bound]; NULL stays NULL (ClickHouse's least and greatest
    skip a NULL argument, so they would turn NULL into a bound)."""
    return f"if(abs({value}) > {bound}, sign({value}) * {bound}, {value})"


def parse_int(raw: str) -> str:
    """model.parse_int of ``raw``, a name bound once (a lambda's argument): see ``integer``.

    Most values are an integer written as ClickHouse writes it (no sign but a minus, no leading
    zero): those are read without the regular expressions, which cost more than the rest of
    the parse. Such a value matches the integer pattern, so the answer is the same; any other
    value takes the patterns."""
    exact = f"toInt64OrNull({raw})"
    return (
        f"if({exact} IS NOT NULL AND toString({exact}) = {raw}, {exact}, "
        f"if(match({raw}, {literal(INTEGER.pattern)}) AND {exact} IS NOT NULL, {exact}, "
        f"if(match({raw}, {literal(NUMBER.pattern)}), "
        f"accurateCastOrNull(trunc(toFloat64OrNull({raw})), 'Int64'), NULL)))"
    )


def integer(expr: str) -> str:
    """model.parse_int: an integer read exactly, else a number truncated toward zero, else
    NULL (also outside Int64).

    The value is bound once by a lambda, and accurateCastOrNull does the Int64 range check:
    the statement has a dozen of these, and spelled out with the value in every branch and
    the range as two float comparisons they would be most of ClickHouse's analysis of it,
    paid by every pass."""
    return f"arrayMap(raw -> {parse_int('raw')}, [{expr}])[1]"


def num_at(payload: str, code: str) -> str:
    """The decimal number at ``code`` of a payload, else NULL (parsed only where present)."""
    return f"if(mapContains({payload}, {code}), {num(f'{payload}[{code}]')}, NULL)"


def int_at(payload: str, code: str) -> str:
    """The integer at ``code`` of a payload, else NULL (parsed only where present)."""
    return f"if(mapContains({payload}, {code}), {integer(f'{payload}[{code}]')}, NULL)"


def int_list(valid: str, expr: str) -> str:
    """model.parse_int_list of the token offsets ``expr`` where ``valid`` (the span has the
    ``OFFSETS`` fact: a JSON array of integers that fit Int64), else []. Parsed as ClickHouse's
    text form of an array, the same integers as ``JSONExtract`` gives for such a value, for less
    CPU; the text is '[]' where not ``valid``, as a cast
    of any other text fails whether or not its row is used."""
    return f"CAST(if({valid}, {expr}, '[]'), 'Array(Int64)')"


def s2ns(expr: str) -> str:
    """engine.seconds_to_ns: float seconds clamped to +-MAX_SECONDS -> ns, rounded half up."""
    return f"toInt64(floor({clamp(expr, MAX_SECONDS)} * 1e9 + 0.5))"


def tokens(*counts: str) -> str:
    """engine._tokens over parsed counts, preferred first: the first that parsed, if within
    [0, MAX_TOKENS]."""
    out = "NULL"
    for value in reversed(counts):
        in_range = f"if({value} BETWEEN 0 AND {MAX_TOKENS}, {value}, NULL)"
        out = f"if({value} IS NOT NULL, {in_range}, {out})"
    return out


def _streamed(values: Callable[[str], list[str]]) -> str:
    """engine.streamed: 1, 0, or NULL where nothing says, from ``values(NAME)``: the chain's
    values of a ``KEYS`` name, nearest first."""
    branches = []
    for stream, flag, params in zip(
        values("STREAM"), values("IS_STREAMING"), values("OI_PARAMS"), strict=True
    ):
        for value in (f"lower({stream})", f"lower({flag})"):
            branches += [f"{value} IN ('true', 'false')", f"{value} = 'true'"]
        branches += [f"{params} != ''", f"match({params}, {literal(STREAM_PARAMETER)})"]
    return "multiIf(" + ", ".join(branches) + ", NULL)"


def streamed(*chain: str) -> str:
    """engine.streamed over the client chain's payloads (maps by code), nearest first."""
    return _streamed(lambda name: [f"{p}[{CODES[name]}]" for p in chain])


def quantile(sorted_values: str, n: str, q: str, scale: int = 1) -> str:
    """engine.linear_quantile over an already sorted array of ``n`` values (n >= 1), each
    multiplied by ``scale`` first."""
    pos = f"({q} * ({n} - 1))"
    i = f"toInt64(floor({pos}))"

    def at(k: str) -> str:
        return f"{sorted_values}[{k}]" if scale == 1 else f"({sorted_values}[{k}] * {scale})"

    return (
        f"if({i} + 1 >= {n}, toFloat64({at(n)}), "
        f"{at(f'{i} + 1')} + ({at(f'{i} + 2')} - {at(f'{i} + 1')}) * ({pos} - {i}))"
    )


def fact(name: str) -> str:
    """Whether stage 0's span has fact ``name`` (a ``FACTS`` name) among its stored facts."""
    return f"bitTest(facts, {FACTS[name].bit_length() - 1})"


def timed(bucket: str) -> str:
    """A decode span with token offsets (a JSON array of integers, not empty)."""
    return f"({bucket} = {_bucket(Phase.DECODE)} AND {fact('OFFSETS')})"


def has_gpu(bucket: str) -> str:
    """A prefill or decode span with a GPU figure that is a number."""
    buckets = ", ".join(str(_bucket(p)) for p in GPU_PHASES)
    return f"({bucket} IN ({buckets}) AND {fact('GPU_NUMBER')})"


def timeline(
    client: str, c_lo: str, c_dur: str, hull_lo: str, hull_hi: str, whole: str, reach: str
) -> str:
    """engine.timeline: ``offset`` (moves the server's clock onto the client's), ``lo`` and
    ``hi`` (the window), ``headers_only`` and ``skew`` (reported) of a request whose windows span
    ``[hull_lo, hull_hi]`` and whose server record runs to ``reach`` (NULL: no phase or response
    record), with a client span starting at ``c_lo`` lasting ``c_dur`` (``client`` 0: none, the
    request is its one attempt) that covers the whole response when ``whole``."""
    half = f"intDiv({c_dur}, 2)"
    hull = f"({hull_hi} - {hull_lo})"
    c_hi = f"({c_lo} + {c_dur})"
    fits = f"({hull_lo} >= {c_lo} AND {hull_hi} <= {c_hi})"
    # A misfit within the room the network legs leave is not a skew (engine.timeline).
    misfit = f"greatest({c_lo} - {hull_lo}, {hull_hi} - {c_hi})"
    room = f"({hull} <= {c_dur} AND {misfit} <= {c_dur} - {hull})"
    headers = f"(NOT {whole} AND {reach} IS NOT NULL AND {reach} - {hull_lo} > {c_dur})"
    return (
        f"multiIf({client} = 0 OR {fits}, 0, "
        f"{room}, if({hull_lo} < {c_lo}, {c_lo} - {hull_lo}, {c_hi} - {hull_hi}), "
        f"{hull} <= {c_dur}, {c_lo} + intDiv({c_dur} - {hull}, 2) - {hull_lo}, "
        # headers-only: the server started half-way through the client span
        f"{headers}, {c_lo} + {half} - {hull_lo}, "
        f"greatest(0, {c_lo} - {hull_lo})) AS offset,\n"
        f"        {client} != 0 AND {hull} > {c_dur} AND {headers} AS headers_only,\n"
        f"        if({client} = 0 OR {fits} OR {room}, 0, -offset) AS skew,\n"
        f"        if({client} = 0, {hull_lo}, {c_lo}) AS lo,\n"
        f"        multiIf({client} = 0, {hull_hi}, headers_only, "
        f"{hull_hi} + offset + ({c_dur} - {half}), {c_hi}) AS hi"
    )


def cuts(lo: str, hi: str, ivs: str) -> str:
    """The sweep's cut points: the window's ends and every interval's, sorted, distinct."""
    return (
        f"arraySort(arrayDistinct(arrayConcat([{lo}, {hi}], "
        f"arrayMap(iv -> iv.2, {ivs}), arrayMap(iv -> iv.3, {ivs}))))"
    )


def segments(cut: str, ivs: str) -> str:
    """Each piece between cuts as (the lowest rank of the (rank, start, end) intervals covering
    it, else network; its length)."""
    network = f"toUInt8({NETWORK_RANK})"
    return (
        f"arrayMap((a, b) -> (arrayMin(arrayConcat([{network}], "
        f"arrayMap(iv -> if(iv.2 <= a AND iv.3 >= b, iv.1, {network}), {ivs}))), b - a), "
        f"arrayPopBack({cut}), arrayPopFront({cut}))"
    )


def gaps(offsets: str) -> str:
    """engine.timed_decode's inter-token gaps, in us, from the decode span's token offsets
    ``offsets`` (us): ``gaps_us``, ``sorted_gaps_us`` and ``n_gaps``.

    The token times are the span's start plus each offset * 1000, so their gaps (ns) are these
    * 1000, exactly (the same Int64 arithmetic, wrapping included). The figures scale the few
    values they read (``token_figures``) instead of every token's time being computed: the
    single-call statement 3-5 % cheaper for 64 tokens a request, the same rows."""
    return (
        f"arrayPopFront(arrayDifference({offsets})) AS gaps_us,\n"
        "        arraySort(gaps_us) AS sorted_gaps_us,\n        length(gaps_us) AS n_gaps"
    )


def token_figures(offsets: str) -> str:
    """engine.token_figures of the token offsets ``offsets`` (us, an Array(Int64)) at the
    statement's stall threshold, an Array(Float64) of seven (all 0 where there are no offsets),
    by the same arithmetic: the figures the collector stores with each span
    (``LatscopeTokenFigures``, deploy/clickhouse/011_token_figures.sql), computed where a writer
    stored none. Reads the offsets' gaps as ``gaps`` names them beside the offsets (they stay in
    us, and the few values the figures read are scaled to ns: the same Int64 products)."""
    p50, p99 = (quantile("sorted_gaps_us", "n_gaps", q, scale=1000) for q in ("0.5", "0.99"))
    figures = {
        FIRST_OFFSET_US: f"toFloat64({offsets}[1])",
        TPOT_NS: f"if(n_gaps > 0, toFloat64(({offsets}[-1] - {offsets}[1]) * 1000) / n_gaps, 0)",
        ITL_P50_NS: f"if(n_gaps > 0, {p50}, 0)",
        ITL_P99_NS: f"if(n_gaps > 0, {p99}, 0)",
        ITL_MAX_NS: "if(n_gaps > 0, toFloat64(sorted_gaps_us[n_gaps] * 1000), 0)",
        STALLS: "toFloat64(arrayCount(g -> g * 1000 > {stall_ns:Int64}, gaps_us))",
        TOKENS: f"toFloat64(length({offsets}))",
    }
    return "[" + ", ".join(figures[at] for at in sorted(figures)) + "]"


#: The figures of ``engine.token_figures`` by the names the single-call path's rows read them
#: (``$AT_<name>``), at the engine's positions plus one (ClickHouse indexes arrays from 1).
FIGURE_AT: dict[str, int] = {
    name: at + 1
    for name, at in {
        "FIRST_OFFSET": FIRST_OFFSET_US,
        "TPOT": TPOT_NS,
        "ITL_P50": ITL_P50_NS,
        "ITL_P99": ITL_P99_NS,
        "ITL_MAX": ITL_MAX_NS,
        "STALLS": STALLS,
        "TOKENS": TOKENS,
    }.items()
}


def itl_columns(has_gaps: str) -> str:
    """A row's ITL p50 / p99 / max (ns; NULL where ``has_gaps`` is false: one token has no gaps)
    and its stall count, read from its ``figures`` (``token_figures``' array, or the figures the
    collector stored): the same columns on both paths."""
    return ",\n        ".join(
        [
            *(
                f"if({has_gaps}, figures[{FIGURE_AT[name]}], NULL) AS {name.lower()}"
                for name in ("ITL_P50", "ITL_P99", "ITL_MAX")
            ),
            f"toUInt32(figures[{FIGURE_AT['STALLS']}]) AS stalls",
        ]
    )


def flag(flags: str, name: str) -> str:
    """Whether a span's packed flags have ``FLAGS[name]``."""
    return f"(bitAnd({flags}, {FLAGS[name]}) != 0)"


def _engine_phases_of(k: str) -> str:
    """engine.synthetic_phases for the k-th attempt: its engine's phases from its figures
    (stage 1), all of them without stage spans below it, else those kept beside them."""
    return (
        f"arrayMap(p -> (p.1, p.2, p.3), arrayFilter(p -> p.4 = 1 OR NOT has(owner, "
        f"attempts[{k}]), ephases[attempts[{k}]]))"
    )


def _part_phases_of(k: str) -> str:
    """The k-th attempt's part phases (finding.engine_parts): those of the parts inside it."""
    return (
        f"arrayFlatten(arrayMap(j -> pphases[j], arrayFilter(j -> part_of[j] = attempts[{k}], "
        "idx)))"
    )


def _up(k: int) -> str:
    """up{2k} from up{k}: each list of k ancestors extended by its k-th ancestor's list."""
    prev = f"up{k}"
    return (
        f"arrayMap(l -> if(length(l) = {k}, arrayConcat(l, {prev}[l[{k}]]), l), {prev}) "
        f"AS up{2 * k}"
    )


def _ancestry() -> str:
    """Two CTEs: anc_near (up1, up2, up4) and anc_far (up8 .. up{MAX_ANCESTRY} as
    ``ancestors``), each step reading the previous step's column only once per step."""
    near, k = ["arrayMap(p -> if(p = 0, [], [p]), parent_idx) AS up1"], 1
    while k < 4:
        near.append(_up(k))
        k *= 2
    far = []
    while 2 * k < MAX_ANCESTRY:
        far.append(_up(k))
        k *= 2
    far.append(_up(k).rsplit(" AS ", 1)[0] + " AS ancestors")
    drop = ", ".join(f"up{2**e}" for e in range(3))
    return (
        f"anc_near AS (SELECT *, {', '.join(near)} FROM parents),\n"
        f"anc_far AS (SELECT * EXCEPT ({drop}), {', '.join(far)} FROM anc_near)"
    )


#: The spans attributes are merged from, nearest first: their payloads (columns of a request's
#: row, so each map is taken out of its trace's array once).
_CHAIN = ("pl_client", "pl_client1", "pl_client2")


def _first_of(code: str, payloads: tuple[str, ...]) -> str:
    """The value at ``code`` of the first of ``payloads`` that has it, else ''."""
    branches = []
    for p in payloads:
        branches += [f"mapContains({p}, {code})", f"{p}[{code}]"]
    return "multiIf(" + ", ".join(branches) + ", '')"


def _merged_values() -> str:
    cols = [
        f"{_first_of(str(CODES[name]), ('pl_last', 'pl_window', *_CHAIN))} AS m_{name.lower()}"
        for name in MERGED
        if name not in OUTPUT_COUNTS
    ]
    cols += [f"{_first_of(str(CODES[name]), _CHAIN)} AS c_{name.lower()}" for name in OUTPUT_COUNTS]
    return ",\n        ".join(cols)


def _gpu_spans() -> str:
    """gpu_<phase>: the request's last phase span of that bucket with GPU figures (0: none)."""
    return ",\n        ".join(
        f"arrayLast(j -> 1, arraySort(j -> span_rank[j], arrayFilter(j -> "
        f"gpu_phases[j] AND buckets[j] = {_bucket(phase)}, my_phases))) AS gpu_{phase}"
        for phase in GPU_PHASES
    )


def _gpu_map() -> str:
    """The Gpu column: '<phase>.<figure>' -> value for the figures those spans have."""
    names, values = [], []
    for phase in GPU_PHASES:
        for code_name, key in GPU.items():
            names.append(literal(f"{phase}.{GPU_KEYS[key]}"))
            values.append(num_at(f"payloads[gpu_{phase}]", str(CODES[code_name])))
    return (
        f"mapFilter((k, v) -> v IS NOT NULL, "
        f"mapFromArrays([{', '.join(names)}], [{', '.join(values)}]))"
    )


def sv(pair: str, name: str) -> str:
    """The value of attribute ``name`` (a ``KEYS`` name) in a span's ``(codes, values)`` pair,
    else '' (absent and empty are the same: a payload holds non-empty values only)."""
    return f"{pair}.2[indexOf({pair}.1, {CODES[name]})]"


#: The single-call path's client chain: the (codes, values) of the client and the CLIENT spans
#: above it, nearest first (``simple_3_rows.sql``'s c, c1, c2).
_SIMPLE_CHAIN = ("(c.5, c.6)", "(c1.5, c1.6)", "(c2.5, c2.6)")


def _simple_merged() -> str:
    """The single-call path's merged attributes: the first non-empty of S and the client chain
    (m_<name>), and the client chain's alone (c_<name>) for the output counts, each one lookup
    in the (codes, values) pairs ``simple_chain`` gathers (empty values left out)."""
    cols = [
        f"merged_values[indexOf(merged_codes, {CODES[name]})] AS m_{name.lower()}"
        for name in MERGED
        if name not in OUTPUT_COUNTS
    ]
    cols += [
        f"chain_values[indexOf(chain_codes, {CODES[name]})] AS c_{name.lower()}"
        for name in OUTPUT_COUNTS
    ]
    return ",\n        ".join(cols)


def _simple_streamed() -> str:
    """engine.streamed over the single-call path's client chain."""
    return _streamed(lambda name: [sv(span, name) for span in _SIMPLE_CHAIN])


def _simple_nums() -> str:
    """The decimal numbers the single-call row parses (its ``nums``): the client chain's first
    chunk figures, then the GPU figures of its last prefill and decode phases."""
    chunks = [sv(span, "FIRST_CHUNK") for span in _SIMPLE_CHAIN]
    gpu = [sv(f"gpu_{phase}", name) for phase in GPU_PHASES for name in GPU]
    return ", ".join(chunks + gpu)


def _simple_gpu_map() -> str:
    """The Gpu column from the single-call path's parsed GPU figures (``nums``, after the
    client chain's)."""
    names = [literal(f"{phase}.{GPU_KEYS[key]}") for phase in GPU_PHASES for key in GPU.values()]
    at = len(_SIMPLE_CHAIN) + 1
    return (
        f"mapFilter((k, v) -> v IS NOT NULL, "
        f"mapFromArrays([{', '.join(names)}], arraySlice(nums, {at}, {len(names)})))"
    )


def _swept_sum(bucket: str) -> str:
    """A bucket's time in the sweep's ``segments`` ((rank, length) pairs); ``other`` holds the
    KV-cache transfer stages' rank too (engine.rank_name)."""
    if bucket == "other":
        ranks = f"p.1 IN ({KV_RANK}, {OTHER_RANK})"
    else:
        ranks = f"p.1 = {NETWORK_RANK if bucket == 'network' else RANK[bucket]}"
    return f"arraySum(arrayMap(p -> if({ranks}, p.2, 0), segments))"


def _bucket_sums() -> str:
    return ",\n        ".join(f"{_swept_sum(bucket)} AS r_{bucket}" for bucket in BUCKET_COLUMNS)


def _flat_sums() -> str:
    """The single-call path's bucket sums (r_<bucket>): for a request whose phases do not overlap
    (``flat``), each phase's clipped length in its bucket, S's length less its phases' in
    ``other`` and the window's less S's in network; else the sweep's (``_swept_sum``)."""
    out = []
    for bucket in BUCKET_COLUMNS:
        if bucket == "network":
            flat = "(hi - lo) - s_length"
        elif bucket == "other":
            flat = "s_length - arraySum(arrayMap(p -> p.3 - p.2, phase_ivs))"
        else:
            flat = f"arraySum(arrayMap(p -> if(p.1 = {RANK[bucket]}, p.3 - p.2, 0), phase_ivs))"
        out.append(f"if(flat, {flat}, {_swept_sum(bucket)}) AS r_{bucket}")
    return ",\n        ".join(out)


def _bucket_columns() -> str:
    out = []
    for bucket, column in BUCKET_COLUMNS.items():
        if bucket == "network":
            expr = "if(client = 0, NULL, r_network)"
        elif bucket == "other":
            expr = "r_other + if(client = 0, r_network, 0)"
        else:
            expr = f"r_{bucket}"
        out.append(f"{expr} AS {column}")
    return ",\n    ".join(out)


#: The per-span arrays of stage 2 (each filtered the same way when a trace repeats a span id).
SPAN_ARRAYS = (
    "ids",
    "parents",
    "services",
    "starts",
    "ends",
    "flags",
    "payloads",
    "resources",
)


def _dedup_columns() -> str:
    return ",\n        ".join(
        f"if(empty(keep), all_{a}, arrayFilter((x, k) -> k, all_{a}, keep)) AS {a}"
        for a in SPAN_ARRAYS
    )


def resources_by_id(table: str) -> str:
    """The resources by id the single-call path looks up (``resource_ids``), from ``table``: a
    constant of the statement, ``(ids, attributes, positions)`` with id 0 first at position 0
    (not found), so ``transform`` finds a resource's position with a hash table whatever their
    number. Rows written within RESOURCE_REFRESH_S before the slice's start: the collector writes
    a resource's row again at least that often while it stores spans that name it."""
    return f"""(
    SELECT (arrayConcat([toUInt64(0)], groupArray(ResourceId)), groupArray(attributes),
            range(toUInt32(count() + 1)))
    FROM (
        SELECT ResourceId, argMax(ResourceAttributes, Timestamp) AS attributes
        FROM {table}
        WHERE Timestamp >= fromUnixTimestamp64Micro(
            {{after_us:Int64}} - {int(RESOURCE_REFRESH_S * 1_000_000)})
        GROUP BY ResourceId)
) AS resources"""


def _values(
    spans_table: str, span_bounds: str, stored_figures: bool = False, resource_ids: bool = False
) -> dict[str, str]:
    kinds = {
        SpanKind.SERVER: FLAGS["SERVER"],
        SpanKind.CLIENT: FLAGS["CLIENT"],
        **{
            legacy: FLAGS[current.upper()]
            for legacy, current in SpanKind.LEGACY.items()
            if current in (SpanKind.SERVER, SpanKind.CLIENT)
        },
    }
    values = {
        "SPANS_TABLE": spans_table,
        "SPAN_BOUNDS": span_bounds,
        "DEDUP_COLUMNS": _dedup_columns(),
        "KIND_CODE": (
            # CAST: a function of a LowCardinality column is LowCardinality too.
            f"CAST(transform(SpanKind, {_array(list(kinds))}, {list(kinds.values())}, 0), 'UInt16')"
        ),
        "STATUS": (
            f"transform(StatusCode, {_array(list(StatusCode.LEGACY))}, "
            f"{_array(list(StatusCode.LEGACY.values()))}, StatusCode)"
        ),
        "SERVER": str(FLAGS["SERVER"]),
        "CLIENT": str(FLAGS["CLIENT"]),
        "DECODE_BUCKET": str(_bucket(Phase.DECODE)),
        "MODEL_CALLS": _array(list(GenAIOperation.MODEL_CALLS)),
        "OI_LLM": literal(OpenInferenceAttributes.LLM),
        "ASGI_RESPONSE_BODY": literal(HttpAttributes.ASGI_RESPONSE_BODY),
        **_engine_values(),
        "CLIENT_CHAIN": str(CLIENT_CHAIN),
        "KV_RANK": str(KV_RANK),
        "KV_BUCKET": str(_bucket(KV_TRANSFER)),
        **{f"{kind}_MASK": _mask(names) for kind, names in PAYLOAD.items()},
        **{f"K_{name}": str(code) for name, code in CODES.items()},
        **{f"F_{name}": str(value) for name, value in FLAGS.items()},
        "MAX_ANCESTRY": str(MAX_ANCESTRY),
        "MAX_PHASE_DEPTH": str(MAX_PHASE_DEPTH),
        "ANCESTRY": _ancestry(),
        "LAST_ANCESTRY": "anc_far",
        "OTHER_RANK": str(OTHER_RANK),
        "NETWORK_RANK": str(NETWORK_RANK),
        "BUCKET_SUMS": _bucket_sums(),
        "KV_SUM": f"arraySum(arrayMap(p -> if(p.1 = {KV_RANK}, p.2, 0), segments))",
        "FLAT_SUMS": _flat_sums(),
        "BUCKET_COLUMNS": _bucket_columns(),
        "MERGED_VALUES": _merged_values(),
        "MAX_TOKENS": str(MAX_TOKENS),
        "GPU_MAP": _gpu_map(),
        "SIMPLE_GPU_MAP": _simple_gpu_map(),
        "SIMPLE_MERGED": _simple_merged(),
        "SIMPLE_NUMS": _simple_nums(),
        "SIMPLE_STREAMED": _simple_streamed(),
        "PREFILL_BUCKET": str(_bucket(Phase.PREFILL)),
        "GPU_SPANS": _gpu_spans(),
        # The single-call path's decode span: the token figures the collector stored with it,
        # and its offsets' text where it has none (or every time, when the statement's stall
        # threshold is not the stored one).
        "DECODE_FIGURES": ", token_figures" if stored_figures else "",
        "STORED_FIGURES": "decode.5" if stored_figures else "emptyArrayFloat64()",
        "DECODE_OFFSETS": (
            f"if(empty(token_figures), vals[indexOf(codes, {CODES['OFFSETS']})], '')"
            if stored_figures
            else f"vals[indexOf(codes, {CODES['OFFSETS']})]"
        ),
        **{f"AT_{name}": str(at) for name, at in FIGURE_AT.items()},
        # The single-call path's server span carries its resource's id (looked up after the
        # GROUP BY in resources_by_id), or its attributes.
        "SIMPLE_RESOURCE": "resource_id AS resource" if resource_ids else "resource",
        "RESOURCE_AT": (
            "toUInt32(transform(server.7, resources.1, resources.3, toUInt32(0)))"
            if resource_ids
            else "toUInt32(1)"
        ),
        "RESOURCE_OF": "resources.2[resource_at]" if resource_ids else "server.7",
    }
    return values


def _phase_bucket(code: str) -> str:
    """The bucket (rank + 1; 0: none) of a stored ``LatscopePhase`` code."""
    buckets = [0] * (len(PHASE_CODES) + 1)
    for phase, at in PHASE_CODES.items():
        buckets[at] = _bucket(phase)
    return f"{buckets}[{code} + 1]"


def inference_route(route: str) -> str:
    """engine.inference_route: ``route`` ends with one of ``INFERENCE_ROUTES``."""
    return f"arrayExists(r -> endsWith({route}, r), {_array(list(INFERENCE_ROUTES))})"


def _engine_sql() -> EngineSql:
    return EngineSql(rules.active())


def _stage_code(name: str) -> str:
    return _engine_sql().stage_code(name)


def _stage_bucket(code: str) -> str:
    return f"toUInt8({_engine_sql().stage_bucket(code, _BUCKET_CODES)})"


def _stage_depth(engine: str, code: str) -> str:
    return _engine_sql().stage_depth(engine, code)


def _stage_first(engine: str, code: str) -> str:
    return _engine_sql().stage_first(engine, code, _BUCKET_CODES)


#: A phase bucket's code (rank + 1) by its name, for what the rulebook names.
_BUCKET_CODES: dict[str, int] = {name: rank + 1 for name, rank in RANK.items()}


def rule_attr(key: str, book_keys: list[str]) -> str:
    """Stage 1's raw value of a rulebook attribute: by its code where the rules already read it
    (``LatscopeRuleAttributes``), else from ``rule_vals`` (read by name in stage 0)."""
    code = _KEY_CODES.get(key)
    if code is not None:
        return f"vals[indexOf(codes, {code})]"
    return f"rule_vals[{book_keys.index(key) + 1}]"


_KEY_CODES: dict[str, int] = {key: CODES[name] for name, key in KEYS.items()}


def _engine_values() -> dict[str, str]:
    """The placeholders the rulebook fills (``latscope.attribution.sql.engines``)."""
    sql = _engine_sql()
    uncoded = [k for k in sql.attributes() if k not in _KEY_CODES]

    def attr(key: str) -> str:
        return rule_attr(key, uncoded)

    kind = sql.kind_name("kind", FLAGS["SERVER"], FLAGS["CLIENT"])
    no_latency_key = sql.without_latency_key(set(LATENCY.values()))
    return {
        "RULE_VALUES": (
            f"[{', '.join(f'SpanAttributes[{literal(k)}]' for k in uncoded)}]"
            if uncoded
            else "CAST([], 'Array(String)')"
        ),
        "RULE_EVENTS": sql.rule_events(),
        "ENGINE": sql.engine_code(attr, "name", kind),
        "SYSTEM": sql.engine_code(attr, "name", kind, system=True),
        # The single-call path: a span of an engine that needs no gen_ai.latency.* key (those
        # send a trace to the general path already), or of a serving system.
        "ENGINE_HINT": (
            f"({sql.engine_code(attr, 'name', kind, no_latency_key)} != 0"
            f" OR {sql.engine_code(attr, 'name', kind, system=True)} != 0)"
        ),
        "RULE_FIGURES": sql.figure_columns(attr),
        "PREFILL_ROOT": sql.role("prefill"),
        "DECODE_ROOT": sql.role("decode"),
        "ENGINE_PHASES": sql.phases(RANK),
        "ENGINE_FIRST": sql.first_token(),
        "ENGINE_TPOT": sql.tpot_decode(),
    }


_MACROS: dict[str, Callable[..., str]] = {
    "NUM": num,
    "INT": integer,
    "PARSE_INT": parse_int,
    "NUM_AT": num_at,
    "INT_AT": int_at,
    "INT_LIST": int_list,
    "S2NS": s2ns,
    "TOKENS": tokens,
    "STREAMED": streamed,
    "QUANTILE": quantile,
    "ENGINE_PHASES_OF": _engine_phases_of,
    "PART_PHASES_OF": _part_phases_of,
    "PART_CODE": lambda name: _engine_sql().part_code(name),
    "PART_DEPTH": lambda code: _engine_sql().part_depth(code),
    "PART_PHASES": lambda j, p, o: _engine_sql().part_phases(j, p, o, RANK),
    "FLAG": flag,
    "SV": sv,
    "TIMED": timed,
    "HAS_GPU": has_gpu,
    "FACT": fact,
    "TIMELINE": timeline,
    "CUTS": cuts,
    "SEGMENTS": segments,
    "GAPS": gaps,
    "TOKEN_FIGURES": token_figures,
    "ITL_COLUMNS": itl_columns,
    "PHASE_BUCKET": _phase_bucket,
    "STAGE_BUCKET": _stage_bucket,
    "STAGE_CODE": _stage_code,
    "STAGE_DEPTH": _stage_depth,
    "STAGE_FIRST": _stage_first,
    "SYSTEM_DEPTH": lambda code: _engine_sql().system_depth(code),
    "FIRST_TOKEN_AFTER": lambda a: _engine_sql().first_token_after(a, _BUCKET_CODES),
    "INFERENCE_ROUTE": inference_route,
}


#: ``render(text, values)``: the shared renderer (``latscope.sqltext``) with these macros.
render = partial(sqltext.render, macros=_MACROS)


def _stage(name: str) -> str:
    return resources.files(__name__).joinpath(name).read_text()


#: Settings of both statements. The per-trace GROUP BY stays single-level: a two-level hash
#: table hands its 50,000 groups on in 256 small blocks, and every function of the stages after
#: it then pays its per-block cost 256 times (the single-call path would cost about three times
#: as much a request).
#:
#: Two of ClickHouse's rewrites find nothing in these statements and would be most of the cost of
#: analysing and planning them, which every pass pays whatever its size:
#: ``optimize_and_compare_chain`` (deriving
#: comparisons with constants from AND chains: it hashes the query tree for each chain, and there
#: is no chain of comparisons with constants here) and ``query_plan_merge_expressions``
#: (merging the plan's consecutive expression steps, one per common table expression).
#:
#: No JIT compilation (``NO_JIT``): ClickHouse compiles an expression or an aggregate function
#: to machine code the third time it meets it, and these statements hold dozens: compiling them
#: costs a process's first passes CPU that the compiled code does not win back. The attributor's
#: other statements take it too.
NO_JIT = "compile_expressions = 0, compile_aggregate_expressions = 0, compile_sort_description = 0"
SETTINGS = (
    "SETTINGS group_by_two_level_threshold = 0, group_by_two_level_threshold_bytes = 0, "
    f"optimize_and_compare_chain = 0, query_plan_merge_expressions = 0, {NO_JIT}"
)


@cache
def attribution_select(batch_sql: str, spans_table: str, span_bounds: str) -> str:
    """``WITH batch AS (<batch_sql>), <stages> SELECT <columns>``: one row per request of every
    trace ``batch_sql`` names (a query returning a ``trace_id`` column). Parameters:
    ``stall_ns`` (Int64), ``through_us`` (Int64) and whatever ``batch_sql`` and ``span_bounds``
    (a condition on the spans table) bind."""
    values = _values(spans_table, span_bounds)
    ctes = [f"batch AS ({batch_sql})"] + [render(_stage(s), values).strip() for s in STAGES]
    final = render(_stage(FINAL), values).strip()
    return "WITH\n" + ",\n".join(ctes) + "\n" + final + "\n" + SETTINGS


#: The stall threshold of the token figures the collector stores (``LatscopeTokenFigures``).
STORED_STALL_NS = DEFAULT_STALL_NS


@cache
def simple_select(
    batch_sql: str,
    spans_table: str,
    span_bounds: str,
    stored_figures: bool = True,
    resource_ids: bool = False,
    resources_table: str = RESOURCES_TABLE,
) -> str:
    """``attribution_select`` for the traces of ``batch_sql`` that hold one call of the common
    shape (``simple_2_traces.sql`` says which); the other traces give no row here and are left to
    ``attribution_select``. Same parameters, same columns, the same rows for the traces it
    answers. ``stored_figures``: a decode span's token figures are read as the collector stored
    them where it did, which holds for the ``stall_ns`` parameter ``STORED_STALL_NS`` only;
    without, they are always computed from its token offsets. ``resource_ids``: the server span's
    resource is carried as its id and its attributes looked up in ``resources_table``
    (``resources_by_id``, which takes the ``after_us`` parameter); a trace whose resource has no
    id or no row there is left to ``attribution_select``."""
    values = _values(spans_table, span_bounds, stored_figures, resource_ids)
    ctes = [f"batch AS ({batch_sql})"] + [render(_stage(s), values).strip() for s in SIMPLE_STAGES]
    if resource_ids:
        ctes.insert(0, resources_by_id(resources_table))
    final = render(_stage(FINAL), values).strip()
    return "WITH\n" + ",\n".join(ctes) + "\n" + final + "\n" + SETTINGS


# A rulebook put in force (``latscope serve --rules``) renders the statements anew.
rules.on_install(attribution_select.cache_clear)
rules.on_install(simple_select.cache_clear)
