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
are ClickHouse parameters, ``{name:Type}``, bound at run time). The codes and flags the stages
share with the spans table are in ``codes.py``, the small expressions in ``expressions.py``.

Layers: ClickHouse's analyzer copies an alias's expression into every expression of the same
SELECT that reads it, and analysing and planning the statement is a fixed cost of every pass
(for a small batch, most of it). So an expression that several others read is computed in one
SELECT and read as a column by the next, and every number a row parses goes through one lambda
over an array of the raw values (one copy of each parse in the statement, whatever the number
of values).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, partial
from importlib import resources

from latscope import sqltext
from latscope.attribution import rules
from latscope.attribution.engine import (
    CLIENT_CHAIN,
    KV_RANK,
    MAX_ANCESTRY,
    MAX_PHASE_DEPTH,
    MAX_TOKENS,
    NETWORK_RANK,
    OTHER_RANK,
    RANK,
)
from latscope.attribution.sql.codes import (
    CODES,
    FACTS,
    FLAGS,
    GPU,
    KEYS,
    LATENCY,
    PAYLOAD,
    PHASE_CODES,
    _array,
    _bucket,
    _mask,
    literal,
)
from latscope.attribution.sql.engines import EngineSql
from latscope.attribution.sql.expressions import (
    FIGURE_AT,
    _ancestry,
    _bucket_columns,
    _bucket_sums,
    _dedup_columns,
    _engine_phases_of,
    _flat_sums,
    _gpu_map,
    _gpu_spans,
    _gpu_values,
    _merged_values,
    _part_phases_of,
    _simple_merged,
    _simple_nums,
    _simple_streamed,
    cuts,
    fact,
    flag,
    gaps,
    has_gpu,
    int_list,
    itl_columns,
    num,
    parse_int,
    quantile,
    s2ns,
    segments,
    streamed,
    sv,
    timed,
    timeline,
    timeline_window,
    token_figures,
    tokens,
)
from latscope.semconv import (
    INFERENCE_ROUTES,
    KV_TRANSFER,
    GenAIOperation,
    HttpAttributes,
    OpenInferenceAttributes,
    Phase,
    SpanKind,
    StatusCode,
)
from latscope.storage import RESOURCE_REFRESH_S, RESOURCES_TABLE
from latscope.tokens import DEFAULT_STALL_NS

__all__ = [
    "CODES",
    "FACTS",
    "GPU",
    "KEYS",
    "LATENCY",
    "NO_JIT",
    "PHASE_CODES",
    "SETTINGS",
    "STORED_STALL_NS",
    "attribution_select",
    "gaps",
    "literal",
    "parse_int",
    "render",
    "rule_keys",
    "rule_reads",
    "simple_select",
    "token_figures",
]

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
        "GPU_VALUES": _gpu_values(),
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


def rule_reads() -> tuple[Callable[[str], str], str]:
    """How a statement reads the rulebook's attributes from the spans table, as stage 0 does:
    the expression of one by its key (``rule_attr``: over ``codes`` and ``vals``, the keys and
    values of LatscopeRuleAttributes, and ``rule_vals``), and the expression of ``rule_vals``.
    Only what no code covers is read from SpanAttributes by name: reading that map reads every
    attribute of every span, prompts and completions included."""
    uncoded = [k for k in _engine_sql().attributes() if k not in _KEY_CODES]
    values = (
        f"[{', '.join(f'SpanAttributes[{literal(k)}]' for k in uncoded)}]"
        if uncoded
        else "CAST([], 'Array(String)')"
    )
    return partial(rule_attr, book_keys=uncoded), values


def rule_keys() -> list[str]:
    """Every span attribute key the attributor's statements read: the coded ones (``KEYS``) and
    those of the rulebook in force. The attribution rows are worked out from these alone (the
    tests hold the statements' rows equal to the reference engine's), so the reference engine
    reads a wide trace's spans with these only (``queries.TRACE_SPANS_READ_BY_RULES``)."""
    return list(dict.fromkeys([*KEYS.values(), *_engine_sql().attributes()]))


def _engine_values() -> dict[str, str]:
    """The placeholders the rulebook fills (``latscope.attribution.sql.engines``)."""
    sql = _engine_sql()
    attr, values = rule_reads()
    kind = sql.kind_name("kind", FLAGS["SERVER"], FLAGS["CLIENT"])
    no_latency_key = sql.without_latency_key(set(LATENCY.values()))
    hint = partial(sql.engine_code, attr, "name", kind, event_names="event_names")
    return {
        "RULE_VALUES": values,
        "RULE_EVENTS": sql.rule_events(),
        "ENGINE": sql.engine_code(attr, "name", kind),
        "SYSTEM": sql.engine_code(attr, "name", kind, system=True),
        # The single-call path: a span of an engine that needs no gen_ai.latency.* key (those
        # send a trace to the general path already), or of a serving system. It tests events by
        # name, so its statement builds no span's rule_events (2-3 % of its CPU).
        "ENGINE_HINT": f"({hint(no_latency_key)} != 0 OR {hint(None, system=True)} != 0)",
        "RULE_FIGURES": sql.figure_columns(attr),
        "RULE_DERIVED": sql.derived_columns(),
        "PREFILL_ROOT": sql.role("prefill"),
        "DECODE_ROOT": sql.role("decode"),
        "ENGINE_PHASES": sql.phases(RANK),
        "ENGINE_FIRST": sql.first_token(),
        "ENGINE_TPOT": sql.tpot_decode(),
    }


_MACROS: dict[str, Callable[..., str]] = {
    "NUM": num,
    "PARSE_INT": parse_int,
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
    "TIMELINE_WINDOW": timeline_window,
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
    trace_check: str = "",
) -> str:
    """``attribution_select`` for the traces of ``batch_sql`` that hold one call of the common
    shape (``simple_2_traces.sql`` says which); the other traces give no row here and are left to
    ``attribution_select``. Same parameters, same columns, the same rows for the traces it
    answers. ``stored_figures``: a decode span's token figures are read as the collector stored
    them where it did, which holds for the ``stall_ns`` parameter ``STORED_STALL_NS`` only;
    without, they are always computed from its token offsets. ``resource_ids``: the server span's
    resource is carried as its id and its attributes looked up in ``resources_table``
    (``resources_by_id``, which takes the ``after_us`` parameter); a trace whose resource has no
    id or no row there is left to ``attribution_select``. ``trace_check``: a condition (``AND
    ...``) over ``simple_2_traces.sql``'s aggregates that a trace of ``batch_sql`` must meet as
    well, when that batch is a superset of the traces to attribute (the attributor's early
    statements: ``latscope.attribution.statements``)."""
    values = {
        **_values(spans_table, span_bounds, stored_figures, resource_ids),
        "TRACE_CHECK": trace_check,
    }
    ctes = [f"batch AS ({batch_sql})"] + [render(_stage(s), values).strip() for s in SIMPLE_STAGES]
    if resource_ids:
        ctes.insert(0, resources_by_id(resources_table))
    final = render(_stage(FINAL), values).strip()
    return "WITH\n" + ",\n".join(ctes) + "\n" + final + "\n" + SETTINGS


# A rulebook put in force (``latscope serve --rules``) renders the statements anew.
rules.on_install(attribution_select.cache_clear)
rules.on_install(simple_select.cache_clear)
