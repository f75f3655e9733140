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

#: GenAI / HTTP attributes merged per request: column name -> attribute key.
ATTRIBUTES: dict[str, str] = {
    "model": GenAIAttributes.REQUEST_MODEL,
    "response_model": GenAIAttributes.RESPONSE_MODEL,
    "provider": GenAIAttributes.PROVIDER_NAME,
    "system": GenAIAttributes.SYSTEM,
    "operation": GenAIAttributes.OPERATION_NAME,
    "route": HttpAttributes.ROUTE,
    "input": GenAIAttributes.USAGE_INPUT_TOKENS,
    "prompt": GenAIAttributes.USAGE_PROMPT_TOKENS,
    "output": GenAIAttributes.USAGE_OUTPUT_TOKENS,
    "completion": GenAIAttributes.USAGE_COMPLETION_TOKENS,
}

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


def tokens(*exprs: str) -> str:
    """engine._tokens: the first of the raw values that holds a number, if within range."""
    out = "NULL"
    for e in reversed(exprs):
        v = integer(e)
        out = f"if({v} IS NOT NULL, if({v} BETWEEN 0 AND {MAX_TOKENS}, {v}, NULL), {out})"
    return out


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


def _synthetic(a: str) -> str:
    """engine.synthetic_phases for attempt index ``a``: three (rank, start, end) tuples."""
    q, ttft, prefill, decode, e2e = (
        f"v_queues[{a}]",
        f"v_ttfts[{a}]",
        f"v_prefills[{a}]",
        f"v_decodes[{a}]",
        f"v_e2es[{a}]",
    )
    q_ns = f"ifNull({s2ns(q)}, 0)"
    prefill_given = f"ifNull({s2ns(prefill)}, 0)"
    ttft_ns = f"if({ttft} IS NOT NULL, {s2ns(ttft)}, {q_ns} + {prefill_given})"
    prefill_ns = (
        f"if({prefill} IS NOT NULL, {s2ns(prefill)}, "
        f"if({ttft} IS NOT NULL, greatest(0, {ttft_ns} - {q_ns}), 0))"
    )
    decode_ns = (
        f"multiIf({decode} IS NOT NULL, {s2ns(decode)}, "
        f"{e2e} IS NOT NULL AND {ttft} IS NOT NULL, greatest(0, {s2ns(e2e)} - {ttft_ns}), 0)"
    )
    s = f"starts[{a}]"
    first = f"({s} + {ttft_ns})"

    def tup(name: str, lo: str, hi: str) -> str:
        return f"(toUInt8({RANK[name]}), toInt64({lo}), toInt64({hi}))"

    return (
        "["
        + ", ".join(
            [
                tup(
                    Phase.QUEUE,
                    f"{first} - {prefill_ns} - {q_ns}",
                    f"{first} - {prefill_ns}",
                ),
                tup(Phase.PREFILL, f"{first} - {prefill_ns}", first),
                tup(Phase.DECODE, first, f"{first} + {decode_ns}"),
            ]
        )
        + "]"
    )


def _ancestry() -> tuple[str, str, str]:
    """The ancestry CTEs (anc_0 .. anc_k, the last with ``up{MAX_ANCESTRY}``), the last CTE's
    name and its ancestor column: each step its own SELECT, so no array is expanded twice."""
    ctes = [
        "anc_0 AS (SELECT *, range(1, n + 1) AS idx, "
        "arrayMap(p -> toUInt32(indexOf(ids, p)), parents) AS parent_idx FROM trace_arrays)",
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


def _merged_attributes() -> str:
    cols = []
    for name in ATTRIBUTES:
        cols.append(
            f"arrayFirst(v -> v != '', arrayMap(s -> if(s = 0, '', a_{name}[s]), attr_spans)) "
            f"AS m_{name}"
        )
    return ",\n        ".join(cols)


def _client_output_raw() -> str:
    """The client chain's output-token values (nearest non-empty per key): c_output,
    c_completion."""
    return ",\n        ".join(
        f"arrayFirst(v -> v != '', arrayMap(s -> if(s = 0, '', a_{key}[s]), "
        f"[client, client1, client2])) AS c_{key}"
        for key in ("output", "completion")
    )


def _gpu_spans() -> str:
    """gpu_<phase>: the request's last phase span of that bucket with any GPU figure (0: none)."""
    any_fig = " OR ".join(f"g_{name}[j] IS NOT NULL" for name in GPU_KEYS.values())
    return ",\n        ".join(
        f"arrayLast(j -> 1, arraySort(j -> (starts[j], ids[j]), arrayFilter(j -> "
        f"buckets[j] = {literal(phase)} AND ({any_fig}), my_phases))) AS gpu_{phase}"
        for phase in GPU_PHASES
    )


def _gpu_map() -> str:
    """The Gpu column: '<phase>.<figure>' -> value for the figures those spans have."""
    pairs = ", ".join(
        f"({literal(f'{phase}.{name}')}, g_{name}[gpu_{phase}])"
        for phase in GPU_PHASES
        for name in GPU_KEYS.values()
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


def _values(spans_table: str, span_bounds: str) -> dict[str, str]:
    attr_columns = [f"attrs[{literal(k)}] AS a_{n}" for n, k in ATTRIBUTES.items()]
    gpu_columns = [f"{num(f'attrs[{literal(k)}]')} AS g_{n}" for k, n in GPU_KEYS.items()]
    return {
        "SPANS_TABLE": spans_table,
        "SPAN_BOUNDS": span_bounds,
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
        "Q_KEY": literal(VllmAttributes.TIME_IN_QUEUE),
        "TTFT_KEY": literal(VllmAttributes.TIME_TO_FIRST_TOKEN),
        "PREFILL_KEY": literal(VllmAttributes.TIME_IN_MODEL_PREFILL),
        "DECODE_KEY": literal(VllmAttributes.TIME_IN_MODEL_DECODE),
        "E2E_KEY": literal(VllmAttributes.E2E),
        "OPERATION_KEY": literal(GenAIAttributes.OPERATION_NAME),
        "FIRST_TOKEN_KEY": literal(LatscopeAttributes.FIRST_TOKEN_NS),
        "FIRST_TOKEN_EVENT": literal(LatscopeAttributes.FIRST_TOKEN_EVENT),
        "LAST_BYTE_KEY": literal(ClientAttributes.LAST_BYTE_NS),
        "TTFC_KEY": literal(GenAIAttributes.RESPONSE_TIME_TO_FIRST_CHUNK),
        "OFFSETS_KEY": literal(LatscopeAttributes.TOKEN_OFFSETS_US),
        "TOKEN_COUNT_KEY": literal(LatscopeAttributes.TOKEN_COUNT),
        "INT_ARRAY": literal(INT_ARRAY.pattern),
        "ATTR_COLUMNS": ",\n        ".join(attr_columns),
        "GPU_COLUMNS": ",\n        ".join(gpu_columns),
        "ATTR_ARRAYS": ",\n        ".join(f"groupArray(a_{n}) AS a_{n}" for n in ATTRIBUTES),
        "GPU_ARRAYS": ",\n        ".join(
            f"{nullable_array(f'g_{n}')} AS g_{n}" for n in GPU_KEYS.values()
        ),
        "MAX_ANCESTRY": str(MAX_ANCESTRY),
        "MAX_PHASE_DEPTH": str(MAX_PHASE_DEPTH),
        "ANCESTRY": _ancestry()[0],
        "LAST_ANCESTRY": _ancestry()[1],
        "LAST_UP": _ancestry()[2],
        "OTHER_RANK": str(OTHER_RANK),
        "NETWORK_RANK": str(NETWORK_RANK),
        "SYNTHETIC": _synthetic("a"),
        "BUCKET_SUMS": _bucket_sums(),
        "BUCKET_COLUMNS": _bucket_columns(),
        "MERGED_ATTRIBUTES": _merged_attributes(),
        "CLIENT_OUTPUT_RAW": _client_output_raw(),
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
