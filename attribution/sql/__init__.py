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

import re
from collections.abc import Callable, Mapping
from functools import cache
from importlib import resources

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
LATENCY_KEYS = (
    VllmAttributes.TIME_IN_QUEUE,
    VllmAttributes.TIME_TO_FIRST_TOKEN,
    VllmAttributes.TIME_IN_MODEL_PREFILL,
    VllmAttributes.TIME_IN_MODEL_DECODE,
    VllmAttributes.E2E,
)
#: Every span attribute the rules read: stage 1 keeps only these.
READ_KEYS: tuple[str, ...] = (
    LatscopeAttributes.PHASE,
    *LATENCY_KEYS,
    *ATTRIBUTES.values(),
    GenAIAttributes.USAGE_OUTPUT_TOKENS,
    GenAIAttributes.USAGE_COMPLETION_TOKENS,
    GenAIAttributes.RESPONSE_TIME_TO_FIRST_CHUNK,
    LatscopeAttributes.FIRST_TOKEN_NS,
    ClientAttributes.LAST_BYTE_NS,
    LatscopeAttributes.TOKEN_OFFSETS_US,
    LatscopeAttributes.TOKEN_COUNT,
    *GPU_KEYS,
)

_PLACEHOLDER = re.compile(r"\$([A-Z][A-Z0-9_]*)(\()?")


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


def tokens(first: str, second: str) -> str:
    """engine._tokens over two parsed values: the first that is a number, if within range."""
    return (
        f"if({first} IS NOT NULL, if({first} BETWEEN 0 AND {MAX_TOKENS}, {first}, NULL), "
        f"if({second} BETWEEN 0 AND {MAX_TOKENS}, {second}, NULL))"
    )


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
    figures stage 4 parsed (q_ns, first_ns, prefill_ns, decode_ns)."""
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


def _ancestry() -> tuple[str, str, str]:
    """The ancestry CTEs (anc_0 .. anc_k, the last with ``up{MAX_ANCESTRY}``), the last CTE's
    name and its ancestor column: each step its own SELECT, so no array is expanded twice."""
    ctes = [
        "anc_0 AS (SELECT *, range(1, n + 1) AS idx, "
        "arrayMap(p -> toUInt32(indexOf(ids, p)), parents) AS parent_idx FROM unique_spans)",
        "anc_1 AS (SELECT *, arrayMap(p -> if(p = 0, [], [p]), parent_idx) AS up1 FROM anc_0)",
    ]
    k, step = 1, 1
    while k < MAX_ANCESTRY:
        prev, nxt = f"up{k}", f"up{2 * k}"
        ctes.append(
            f"anc_{step + 1} AS (SELECT * EXCEPT ({prev}), arrayMap(l -> if(length(l) = {k}, "
            f"arrayConcat(l, {prev}[l[{k}]]), l), {prev}) AS {nxt} FROM anc_{step})"
        )
        k, step = 2 * k, step + 1
    return ",\n".join(ctes), f"anc_{step}", f"up{k}"


def _pick(key: str, maps: tuple[str, ...]) -> str:
    """The value of ``key`` in the first of ``maps`` (attribute maps, nearest first) that has
    it: nested ifs over plain columns, not a lambda that would copy every span's map."""
    k = literal(key)
    out = "''"
    for m in reversed(maps):
        out = f"if({m}[{k}] != '', {m}[{k}], {out})"
    return out


_MERGED = ("last_attrs", "client_attrs", "client1_attrs", "client2_attrs")


def _merged_attributes() -> str:
    return ",\n        ".join(
        f"{_pick(key, _MERGED)} AS m_{name}" for name, key in ATTRIBUTES.items()
    )


def _client_output() -> str:
    return ",\n        ".join(
        f"{_pick(key, _MERGED[1:])} AS c_{name}"
        for name, key in (
            ("output", GenAIAttributes.USAGE_OUTPUT_TOKENS),
            ("completion", GenAIAttributes.USAGE_COMPLETION_TOKENS),
        )
    )


def _client_ttft() -> str:
    """engine._client_ttft: latscope's first-token attribute or event on the client span, else a
    time_to_first_chunk on the client chain, from the span that carries it."""
    first = integer(f"client_attrs[{literal(LatscopeAttributes.FIRST_TOKEN_NS)}]")
    branches = [
        "client = 0",
        "NULL",
        f"{first} IS NOT NULL",
        f"{first} - starts[client]",
        "first_token_events[client] IS NOT NULL",
        "first_token_events[client] - starts[client]",
    ]
    for s in ("client", "client1", "client2"):
        chunk = num(f"{s}_attrs[{literal(GenAIAttributes.RESPONSE_TIME_TO_FIRST_CHUNK)}]")
        branches += [
            f"{s} != 0 AND {chunk} IS NOT NULL",
            f"starts[{s}] + {s2ns(chunk)} - starts[client]",
        ]
    return "multiIf(" + ", ".join(branches) + ", NULL)"


def _gpu_spans() -> str:
    """gpu_<phase>: the request's last phase span of that bucket with a GPU figure (0: none)."""
    return ",\n        ".join(
        f"arrayLast(j -> 1, arraySort(j -> (starts[j], ids[j]), arrayFilter(j -> "
        f"gpu_phases[j] AND buckets[j] = {literal(phase)}, my_phases))) AS gpu_{phase}"
        for phase in GPU_PHASES
    )


def _gpu_map() -> str:
    """The Gpu column: '<phase>.<figure>' -> value for the figures those spans have."""
    pairs = ", ".join(
        f"({literal(f'{phase}.{name}')}, {num(f'attributes[gpu_{phase}][{literal(key)}]')})"
        for phase in GPU_PHASES
        for key, name in GPU_KEYS.items()
    )
    kept = f"arrayFilter(p -> p.2 IS NOT NULL, [{pairs}])"
    return f"mapFromArrays(arrayMap(p -> p.1, {kept}), arrayMap(p -> assumeNotNull(p.2), {kept}))"


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


def _values(spans_table: str, span_bounds: str) -> dict[str, str]:
    has_latency = " OR ".join(f"{num(f'attrs[{literal(k)}]')} IS NOT NULL" for k in LATENCY_KEYS)
    ancestry, last_ancestry, last_up = _ancestry()
    return {
        "SPANS_TABLE": spans_table,
        "SPAN_BOUNDS": span_bounds,
        "DEDUP_COLUMNS": _dedup_columns(),
        "READ_KEYS": "(" + ", ".join(literal(k) for k in READ_KEYS) + ")",
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
        "HAS_LATENCY": f"({has_latency})",
        "HAS_GPU": "("
        + " OR ".join(f"{num(f'attrs[{literal(k)}]')} IS NOT NULL" for k in GPU_KEYS)
        + ")",
        "GPU_PHASES": "(" + ", ".join(literal(p) for p in GPU_PHASES) + ")",
        "Q_KEY": literal(VllmAttributes.TIME_IN_QUEUE),
        "TTFT_KEY": literal(VllmAttributes.TIME_TO_FIRST_TOKEN),
        "PREFILL_KEY": literal(VllmAttributes.TIME_IN_MODEL_PREFILL),
        "DECODE_KEY": literal(VllmAttributes.TIME_IN_MODEL_DECODE),
        "E2E_KEY": literal(VllmAttributes.E2E),
        "OPERATION_KEY": literal(GenAIAttributes.OPERATION_NAME),
        "OUTPUT_KEY": literal(GenAIAttributes.USAGE_OUTPUT_TOKENS),
        "COMPLETION_KEY": literal(GenAIAttributes.USAGE_COMPLETION_TOKENS),
        "FIRST_TOKEN_EVENT": literal(LatscopeAttributes.FIRST_TOKEN_EVENT),
        "LAST_BYTE_KEY": literal(ClientAttributes.LAST_BYTE_NS),
        "OFFSETS_KEY": literal(LatscopeAttributes.TOKEN_OFFSETS_US),
        "TOKEN_COUNT_KEY": literal(LatscopeAttributes.TOKEN_COUNT),
        "INT_ARRAY": literal(INT_ARRAY.pattern),
        "MAX_ANCESTRY": str(MAX_ANCESTRY),
        "MAX_PHASE_DEPTH": str(MAX_PHASE_DEPTH),
        "ANCESTRY": ancestry,
        "LAST_ANCESTRY": last_ancestry,
        "LAST_UP": last_up,
        "OTHER_RANK": str(OTHER_RANK),
        "NETWORK_RANK": str(NETWORK_RANK),
        "BUCKET_SUMS": _bucket_sums(),
        "BUCKET_COLUMNS": _bucket_columns(),
        "MERGED_ATTRIBUTES": _merged_attributes(),
        "CLIENT_OUTPUT": _client_output(),
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
    "TOKENS": tokens,
    "SYNTHETIC": _synthetic,
    "NULLABLE_ARRAY": nullable_array,
}


def _split_args(text: str) -> list[str]:
    args, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            args.append(text[start:i].strip())
            start = i + 1
    args.append(text[start:].strip())
    return args


def render(text: str, values: Mapping[str, str]) -> str:
    """Replace every ``$NAME`` by ``values[NAME]`` and every ``$NAME(args)`` by the macro of that
    name applied to the (rendered) arguments. SQL comments are dropped first."""
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))
    out, pos = [], 0
    while (m := _PLACEHOLDER.search(text, pos)) is not None:
        out.append(text[pos : m.start()])
        name = m.group(1)
        if m.group(2):
            depth, end = 1, m.end()
            while depth:
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                end += 1
            if name not in _MACROS:
                raise KeyError(f"unknown SQL macro ${name}(...)")
            args = [render(a, values) for a in _split_args(text[m.end() : end - 1])]
            out.append(_MACROS[name](*args))
            pos = end
        else:
            if name not in values:
                raise KeyError(f"unknown SQL placeholder ${name}")
            out.append(values[name])
            pos = m.end()
    out.append(text[pos:])
    return "".join(out)


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
