"""The production attributor's SQL: the rules of ``attribution/engine.py`` as one ClickHouse
``INSERT ... SELECT`` from the spans table into the attribution table, so spans never leave the
store and attribution runs where the data is (shard-local on a cluster).

The statement is built from one ``.sql`` file per stage (a common table expression each, read in
order): ``01_spans`` parses the attributes the rules read, ``02_traces`` groups each trace's spans
into arrays and finds its requests, ``03_requests`` gives one row per request with its attempts,
client and timeline, ``04_buckets`` runs the priority sweep, ``05_rows`` the streaming figures,
tokens and GPU figures, ``06_insert`` names the table's columns. docs/attribution.md ("The SQL
attributor") walks through a worked example.

The stage files hold ``$NAME`` placeholders for values that come from the Python rules (attribute
keys, priorities, regular expressions), and ``$NAME(a, b)`` for small repeated expressions; both
are rendered here from named constants and nothing else: an unknown name is an error, and no
value from a request or a span is ever rendered into the text (those are ClickHouse parameters,
``{name:Type}``, bound at run time).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, partial
from importlib import resources

from latscope import sqltext
from latscope.attribution.engine import (
    GPU_KEYS,
    GPU_PHASES,
    MAX_ANCESTRY,
    MAX_PHASE_DEPTH,
    MAX_TOKENS,
    NETWORK_RANK,
    OTHER_RANK,
    RANK,
)
from latscope.attribution.model import INT_ARRAY, INTEGER, NUMBER
from latscope.attribution.table import BUCKET_COLUMNS
from latscope.semconv import (
    SGLANG_STAGES,
    ClientAttributes,
    GenAIAttributes,
    GenAIOperation,
    HttpAttributes,
    LatscopeAttributes,
    Phase,
    SpanKind,
    StatusCode,
    VllmAttributes,
)

STAGES = (
    "01_spans.sql",
    "02_traces.sql",
    "03_requests.sql",
    "04_buckets.sql",
    "05_rows.sql",
)
FINAL = "06_insert.sql"

#: GenAI / HTTP attributes merged per request (m_<name>): name -> attribute key.
ATTRIBUTES: dict[str, str] = {
    "model": GenAIAttributes.REQUEST_MODEL,
    "response_model": GenAIAttributes.RESPONSE_MODEL,
    "provider": GenAIAttributes.PROVIDER_NAME,
    "system": GenAIAttributes.SYSTEM,
    "operation": GenAIAttributes.OPERATION_NAME,
    "route": HttpAttributes.ROUTE,
    "input": GenAIAttributes.USAGE_INPUT_TOKENS,
    "prompt": GenAIAttributes.USAGE_PROMPT_TOKENS,
}
OUTPUT = GenAIAttributes.USAGE_OUTPUT_TOKENS
COMPLETION = GenAIAttributes.USAGE_COMPLETION_TOKENS
LATENCY_KEYS = (
    VllmAttributes.TIME_IN_QUEUE,
    VllmAttributes.TIME_TO_FIRST_TOKEN,
    VllmAttributes.TIME_IN_MODEL_PREFILL,
    VllmAttributes.TIME_IN_MODEL_DECODE,
    VllmAttributes.E2E,
)
#: Attributes kept as strings per span (stage 1's `attrs`): what is merged or read as text, and
#: the token counts, whose first non-empty value decides which span a count comes from.
STRING_KEYS: tuple[str, ...] = (
    *ATTRIBUTES.values(),
    OUTPUT,
    COMPLETION,
    LatscopeAttributes.TOKEN_OFFSETS_US,
)
#: Attributes parsed as decimal numbers per span (`nums`).
FLOAT_KEYS: tuple[str, ...] = (
    *LATENCY_KEYS,
    GenAIAttributes.RESPONSE_TIME_TO_FIRST_CHUNK,
    *GPU_KEYS,
)
#: Attributes parsed as integers per span (`ints`).
INT_KEYS: tuple[str, ...] = (
    LatscopeAttributes.FIRST_TOKEN_NS,
    ClientAttributes.LAST_BYTE_NS,
    LatscopeAttributes.TOKEN_COUNT,
    GenAIAttributes.USAGE_INPUT_TOKENS,
    GenAIAttributes.USAGE_PROMPT_TOKENS,
    OUTPUT,
    COMPLETION,
)


def literal(value: str) -> str:
    """A ClickHouse string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _array(values: list[str]) -> str:
    return "[" + ", ".join(literal(v) for v in values) + "]"


# -- small expressions used in several places ----------------------------------------------------


def num(expr: str) -> str:
    """model.parse_float: a decimal number, else NULL."""
    return f"if(match({expr}, {literal(NUMBER.pattern)}), toFloat64OrNull({expr}), NULL)"


def integer(expr: str) -> str:
    """model.parse_int: an integer read exactly, else a number truncated toward zero, else
    NULL (also outside Int64)."""
    as_float = f"toFloat64OrZero({expr})"
    return (
        f"if(match({expr}, {literal(INTEGER.pattern)}) AND toInt64OrNull({expr}) IS NOT NULL, "
        f"toInt64OrNull({expr}), if(match({expr}, {literal(NUMBER.pattern)}) "
        f"AND {as_float} >= -9.223372036854775808e18 AND {as_float} < 9.223372036854775808e18, "
        f"toInt64(trunc({as_float})), NULL))"
    )


def nullable_array(expr: str) -> str:
    """groupArray keeping NULLs (groupArray itself skips them, which would misalign arrays)."""
    return f"arrayMap(t -> t.1, groupArray(tuple({expr})))"


def s2ns(expr: str) -> str:
    """engine.seconds_to_ns: float seconds -> ns, rounded half up."""
    return f"toInt64(floor({expr} * 1e9 + 0.5))"


def tokens(map_a: str, key_a: str, map_b: str, key_b: str) -> str:
    """engine._tokens: ``key_a`` in ``map_a`` if it parsed (an integers map), else ``key_b`` in
    ``map_b``; either only within [0, MAX_TOKENS]."""

    def one(m: str, k: str, otherwise: str) -> str:
        in_range = f"if({m}[{k}] BETWEEN 0 AND {MAX_TOKENS}, {m}[{k}], NULL)"
        return f"if(mapContains({m}, {k}), {in_range}, {otherwise})"

    return one(map_a, key_a, one(map_b, key_b, "NULL"))


def quantile(sorted_values: str, n: str, q: str) -> str:
    """engine.linear_quantile over an already sorted array of ``n`` values (n >= 1)."""
    pos = f"({q} * ({n} - 1))"
    i = f"toInt64(floor({pos}))"
    return (
        f"if({i} + 1 >= {n}, toFloat64({sorted_values}[{n}]), "
        f"{sorted_values}[{i} + 1] + ({sorted_values}[{i} + 2] - {sorted_values}[{i} + 1]) "
        f"* ({pos} - {i}))"
    )


def rank(bucket: str) -> str:
    names = list(RANK)
    return f"transform({bucket}, {_array(names)}, {[RANK[n] for n in names]}, {NETWORK_RANK})"


def _synthetic(k: str) -> str:
    """engine.synthetic_phases for the k-th attempt: three (rank, start, end) tuples from the
    figures stage 4 computed (q_ns, first_ns, prefill_ns, decode_ns)."""
    first = f"(a_starts[{k}] + first_ns[{k}])"
    prefill, queue = f"prefill_ns[{k}]", f"q_ns[{k}]"
    decode = f"ifNull(decode_ns[{k}], 0)"

    def tup(name: str, lo: str, hi: str) -> str:
        return f"(toUInt8({RANK[name]}), toInt64({lo}), toInt64({hi}))"

    return (
        "["
        + ", ".join(
            [
                tup(Phase.QUEUE, f"{first} - {prefill} - {queue}", f"{first} - {prefill}"),
                tup(Phase.PREFILL, f"{first} - {prefill}", first),
                tup(Phase.DECODE, first, f"{first} + {decode}"),
            ]
        )
        + "]"
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


#: The spans attributes are merged from, nearest first, and their attribute maps (columns of
#: one request's row, so each map is taken out of its trace's array once).
_MERGED = (
    ("last", "last_attrs"),
    ("client", "client_attrs"),
    ("client1", "client1_attrs"),
    ("client2", "client2_attrs"),
)


def _first_with(key: str, spans: tuple[tuple[str, str], ...]) -> str:
    """The first of ``spans`` (index, attribute map) whose map has ``key``, else 0."""
    k = literal(key)
    branches = []
    for span, attrs in spans:
        branches += [f"{attrs}[{k}] != ''", span]
    return "multiIf(" + ", ".join(branches) + ", 0)"


def _picked_spans() -> str:
    cols = [f"{_first_with(key, _MERGED)} AS s_{name}" for name, key in ATTRIBUTES.items()]
    cols += [
        f"{_first_with(key, _MERGED[1:])} AS s_client_{name}"
        for name, key in (("output", OUTPUT), ("completion", COMPLETION))
    ]
    return ",\n        ".join(cols)


def _merged_values() -> str:
    """m_<name>: the merged attribute's value, from the map of the span it was picked from."""
    cols = []
    for name, key in ATTRIBUTES.items():
        if name in ("input", "prompt"):
            continue
        k = literal(key)
        branches = [f"s_{name} = {span}, {attrs}[{k}]" for span, attrs in _MERGED]
        cols.append(f"multiIf(s_{name} = 0, '', {', '.join(branches)}, '') AS m_{name}")
    cols.append("if(m_model != '', m_model, m_response_model) AS model")
    cols.append("if(m_provider != '', m_provider, m_system) AS provider")
    cols.append(
        tokens(
            "integers[s_input]",
            literal(GenAIAttributes.USAGE_INPUT_TOKENS),
            "integers[s_prompt]",
            literal(GenAIAttributes.USAGE_PROMPT_TOKENS),
        )
        + " AS input_tokens"
    )
    cols.append(
        tokens(
            "integers[s_client_output]",
            literal(OUTPUT),
            "integers[s_client_completion]",
            literal(COMPLETION),
        )
        + " AS client_output"
    )
    return ",\n        ".join(cols)


def _client_ttft() -> str:
    """engine._client_ttft: latscope's first-token attribute or event on the client span, else a
    time_to_first_chunk on the client chain, from the span that carries it."""
    first, chunk = (
        literal(LatscopeAttributes.FIRST_TOKEN_NS),
        literal(GenAIAttributes.RESPONSE_TIME_TO_FIRST_CHUNK),
    )
    branches = [
        "client = 0",
        "NULL",
        f"mapContains(client_ints, {first})",
        f"client_ints[{first}] - c_lo",
        "first_token_events[client] IS NOT NULL",
        "first_token_events[client] - c_lo",
    ]
    for span in ("client", "client1", "client2"):
        branches += [
            f"{span} != 0 AND mapContains(numbers[{span}], {chunk})",
            f"starts[{span}] + {s2ns(f'numbers[{span}][{chunk}]')} - c_lo",
        ]
    return "multiIf(" + ", ".join(branches) + ", NULL)"


def _gpu_spans() -> str:
    """gpu_<phase>: the request's last phase span of that bucket with a GPU figure (0: none)."""
    return ",\n        ".join(
        f"arrayLast(j -> 1, arraySort(j -> span_rank[j], arrayFilter(j -> "
        f"gpu_phases[j] AND buckets[j] = {literal(phase)}, my_phases))) AS gpu_{phase}"
        for phase in GPU_PHASES
    )


def _gpu_map() -> str:
    """The Gpu column: '<phase>.<figure>' -> value for the figures those spans have."""
    names, values = [], []
    for phase in GPU_PHASES:
        for key, name in GPU_KEYS.items():
            k = literal(key)
            names.append(literal(f"{phase}.{name}"))
            values.append(
                f"if(mapContains(numbers[gpu_{phase}], {k}), numbers[gpu_{phase}][{k}], NULL)"
            )
    return (
        f"mapFilter((k, v) -> v IS NOT NULL, "
        f"mapFromArrays([{', '.join(names)}], [{', '.join(values)}]))"
    )


def _bucket_sums() -> str:
    out = []
    for bucket in BUCKET_COLUMNS:
        r = NETWORK_RANK if bucket == "network" else RANK.get(bucket, OTHER_RANK)
        out.append(f"arraySum(arrayMap(p -> if(p.1 = {r}, p.2, 0), segments)) AS r_{bucket}")
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
    "kinds",
    "services",
    "statuses",
    "starts",
    "ends",
    "resources",
    "attributes",
    "buckets",
    "latscope_phases",
    "latency",
    "serverlike",
    "tools",
    "timed_decodes",
    "gpu_phases",
    "first_token_events",
)


def _dedup_columns() -> str:
    keep = "arrayMap((s, i) -> indexOf(ids, s) = i, ids, arrayEnumerate(ids))"
    return ", ".join(
        f"if(repeated, arrayFilter((x, k) -> k, {a}, {keep}), {a}) AS {a}" for a in SPAN_ARRAYS
    )


def _keys(keys: tuple[str, ...]) -> str:
    return "[" + ", ".join(literal(k) for k in keys) + "]"


def _values(spans_table: str, span_bounds: str) -> dict[str, str]:
    return {
        "SPANS_TABLE": spans_table,
        "SPAN_BOUNDS": span_bounds,
        "DEDUP_COLUMNS": _dedup_columns(),
        "STRING_KEYS": "(" + ", ".join(literal(k) for k in STRING_KEYS) + ")",
        "FLOAT_KEYS": "(" + ", ".join(literal(k) for k in FLOAT_KEYS) + ")",
        "INT_KEYS": "(" + ", ".join(literal(k) for k in INT_KEYS) + ")",
        "LATENCY_KEYS": _keys(LATENCY_KEYS),
        "GPU_KEYS": _keys(tuple(GPU_KEYS)),
        "KIND": (
            f"transform(SpanKind, {_array(list(SpanKind.LEGACY))}, "
            f"{_array(list(SpanKind.LEGACY.values()))}, SpanKind)"
        ),
        "STATUS": (
            f"transform(StatusCode, {_array(list(StatusCode.LEGACY))}, "
            f"{_array(list(StatusCode.LEGACY.values()))}, StatusCode)"
        ),
        "SERVER": literal(SpanKind.SERVER),
        "CLIENT": literal(SpanKind.CLIENT),
        "DECODE": literal(Phase.DECODE),
        "EXECUTE_TOOL": literal(GenAIOperation.EXECUTE_TOOL),
        "PHASE_KEY": literal(LatscopeAttributes.PHASE),
        "PHASES": "(" + ", ".join(literal(p) for p in Phase.ALL) + ")",
        "STAGE_BUCKET": (
            f"transform(SpanName, {_array(list(SGLANG_STAGES))}, "
            f"{_array(list(SGLANG_STAGES.values()))}, '')"
        ),
        "GPU_PHASES": "(" + ", ".join(literal(p) for p in GPU_PHASES) + ")",
        "Q_KEY": literal(VllmAttributes.TIME_IN_QUEUE),
        "TTFT_KEY": literal(VllmAttributes.TIME_TO_FIRST_TOKEN),
        "PREFILL_KEY": literal(VllmAttributes.TIME_IN_MODEL_PREFILL),
        "DECODE_KEY": literal(VllmAttributes.TIME_IN_MODEL_DECODE),
        "E2E_KEY": literal(VllmAttributes.E2E),
        "OPERATION_KEY": literal(GenAIAttributes.OPERATION_NAME),
        "OUTPUT_KEY": literal(OUTPUT),
        "COMPLETION_KEY": literal(COMPLETION),
        "FIRST_TOKEN_EVENT": literal(LatscopeAttributes.FIRST_TOKEN_EVENT),
        "LAST_BYTE_KEY": literal(ClientAttributes.LAST_BYTE_NS),
        "OFFSETS_KEY": literal(LatscopeAttributes.TOKEN_OFFSETS_US),
        "TOKEN_COUNT_KEY": literal(LatscopeAttributes.TOKEN_COUNT),
        "INT_ARRAY": literal(INT_ARRAY.pattern),
        "MAX_ANCESTRY": str(MAX_ANCESTRY),
        "MAX_PHASE_DEPTH": str(MAX_PHASE_DEPTH),
        "ANCESTRY": _ancestry(),
        "LAST_ANCESTRY": "anc_far",
        "OTHER_RANK": str(OTHER_RANK),
        "NETWORK_RANK": str(NETWORK_RANK),
        "BUCKET_SUMS": _bucket_sums(),
        "BUCKET_COLUMNS": _bucket_columns(),
        "PICKED_SPANS": _picked_spans(),
        "MERGED_VALUES": _merged_values(),
        "CLIENT_TTFT": _client_ttft(),
        "MAX_TOKENS": str(MAX_TOKENS),
        "GPU_MAP": _gpu_map(),
        "GPU_SPANS": _gpu_spans(),
    }


_MACROS: dict[str, Callable[..., str]] = {
    "NUM": num,
    "INT": integer,
    "S2NS": s2ns,
    "RANK": rank,
    "QUANTILE": quantile,
    "TOKENS": lambda m, a, b: tokens(m, a, m, b),
    "SYNTHETIC": _synthetic,
    "NULLABLE_ARRAY": nullable_array,
}


#: ``render(text, values)``: the shared renderer (``latscope.sqltext``) with these macros.
render = partial(sqltext.render, macros=_MACROS)


def _stage(name: str) -> str:
    return resources.files(__name__).joinpath(name).read_text()


@cache
def attribution_select(batch_sql: str, spans_table: str, span_bounds: str) -> str:
    """``WITH batch AS (<batch_sql>), <stages> SELECT <columns>``: one row per request of every
    trace ``batch_sql`` names (a query returning a ``trace_id`` column). Parameters:
    ``stall_ns`` (Int64), ``through_us`` (Int64) and whatever ``batch_sql`` and ``span_bounds``
    (a condition on the spans table) bind."""
    values = _values(spans_table, span_bounds)
    ctes = [f"batch AS ({batch_sql})"] + [render(_stage(s), values).strip() for s in STAGES]
    return "WITH\n" + ",\n".join(ctes) + "\n" + render(_stage(FINAL), values).strip()
