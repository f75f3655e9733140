"""Small SQL expressions the attributor's stage files use in several places (``$NAME(a, b)``
macros and the longer column lists ``_values`` renders): each the ClickHouse spelling of one
function of ``attribution/engine.py`` or ``attribution/model.py``, by the same arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable

from latscope.attribution.engine import (
    GPU_KEYS,
    GPU_PHASES,
    KV_RANK,
    MAX_ANCESTRY,
    MAX_SECONDS,
    MAX_TOKENS,
    NETWORK_RANK,
    OTHER_RANK,
    RANK,
)
from latscope.attribution.model import INTEGER, MAX_FLOAT, NUMBER
from latscope.attribution.sql.codes import (
    CODES,
    FACTS,
    FLAGS,
    GPU,
    MERGED,
    OUTPUT_COUNTS,
    _bucket,
    literal,
)
from latscope.attribution.table import BUCKET_COLUMNS
from latscope.semconv import (
    STREAM_PARAMETER,
    Phase,
)
from latscope.tokens import (
    FIRST_OFFSET_US,
    ITL_MAX_NS,
    ITL_P50_NS,
    ITL_P99_NS,
    STALLS,
    TOKENS,
    TPOT_NS,
)


def num(expr: str) -> str:
    """model.parse_float: a decimal number clamped to +-MAX_FLOAT, else NULL."""
    value = clamp(f"toFloat64OrNull({expr})", MAX_FLOAT)
    return f"if(match({expr}, {literal(NUMBER.pattern)}), {value}, NULL)"


def clamp(value: str, bound: float) -> str:
    """``value`` clamped to [-bound, bound]; NULL stays NULL (ClickHouse's least and greatest
    skip a NULL argument, so they would turn NULL into a bound)."""
    return f"if(abs({value}) > {bound}, sign({value}) * {bound}, {value})"


def parse_int(raw: str) -> str:
    """model.parse_int of ``raw``, a name bound once (a lambda's argument: the stages parse every
    integer of a row by one ``arrayMap(raw -> ...)`` over an array of raw values): an integer read
    exactly, else a number truncated toward zero, else NULL (also outside Int64, which
    accurateCastOrNull checks).

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


def int_list(valid: str, expr: str) -> str:
    """tokens.parse_int_list of the token offsets ``expr`` where ``valid`` (the span has the
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
    """tokens.linear_quantile over an already sorted array of ``n`` values (n >= 1), each
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


def _timeline_parts(
    client: str, c_lo: str, c_dur: str, hull_lo: str, hull_hi: str
) -> tuple[str, str, str, str, str]:
    """The pieces of engine.timeline: (half the client span, the hull's length, the client
    span's end, the hull fits in the client span, the misfit is within the network legs' room)."""
    hull = f"({hull_hi} - {hull_lo})"
    c_hi = f"({c_lo} + {c_dur})"
    fits = f"({client} = 0 OR ({hull_lo} >= {c_lo} AND {hull_hi} <= {c_hi}))"
    # A misfit within the room the network legs leave is not a skew (engine.timeline).
    misfit = f"greatest({c_lo} - {hull_lo}, {hull_hi} - {c_hi})"
    room = f"({hull} <= {c_dur} AND {misfit} <= {c_dur} - {hull})"
    return f"intDiv({c_dur}, 2)", hull, c_hi, fits, room


def timeline(
    client: str, c_lo: str, c_dur: str, hull_lo: str, hull_hi: str, whole: str, reach: str
) -> str:
    """engine.timeline, first part: ``offset`` (moves the server's clock onto the client's) and
    ``headers_only`` of a request whose windows span ``[hull_lo, hull_hi]`` and whose server
    record runs to ``reach`` (NULL: no phase or response record), with a client span starting at
    ``c_lo`` lasting ``c_dur`` (``client`` 0: none, the request is its one attempt) that covers
    the whole response when ``whole``. ``timeline_window`` reads them, a layer later."""
    half, hull, c_hi, fits, room = _timeline_parts(client, c_lo, c_dur, hull_lo, hull_hi)
    headers = f"(NOT {whole} AND {reach} IS NOT NULL AND {reach} - {hull_lo} > {c_dur})"
    # The server's start and its record of work fit as recorded: the rest is teardown, clipped.
    settled = f"({hull_lo} >= {c_lo} AND {reach} IS NOT NULL AND {reach} <= {c_hi})"
    return (
        f"multiIf({fits} OR {settled}, 0, "
        f"{room}, if({hull_lo} < {c_lo}, {c_lo} - {hull_lo}, {c_hi} - {hull_hi}), "
        f"{hull} <= {c_dur}, {c_lo} + intDiv({c_dur} - {hull}, 2) - {hull_lo}, "
        # headers-only: the server started half-way through the client span
        f"{headers}, {c_lo} + {half} - {hull_lo}, "
        f"greatest(0, {c_lo} - {hull_lo})) AS offset,\n"
        f"        {client} != 0 AND {hull} > {c_dur} AND {headers} AS headers_only"
    )


def timeline_window(client: str, c_lo: str, c_dur: str, hull_lo: str, hull_hi: str) -> str:
    """engine.timeline, second part, from ``offset`` and ``headers_only``: ``skew`` (reported),
    and ``lo`` and ``hi`` (the window on the client's clock)."""
    half, _, c_hi, fits, room = _timeline_parts(client, c_lo, c_dur, hull_lo, hull_hi)
    return (
        f"if({fits} OR {room}, 0, -offset) AS skew,\n"
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
    """tokens.token_figures of the token offsets ``offsets`` (us, an Array(Int64)) at the
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


#: The figures of ``tokens.token_figures`` by the names the single-call path's rows read them
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


def _gpu_values() -> str:
    """The general path's raw GPU figures, in the order ``_gpu_map`` reads them: each figure of
    the request's last prefill, then decode, phase span with GPU figures (``gpu_<phase>``)."""
    return ", ".join(
        f"payloads[gpu_{phase}][{CODES[name]}]" for phase in GPU_PHASES for name in GPU
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


def _gpu_map() -> str:
    """The Gpu column from a row's parsed numbers (``nums``: the client chain's three first-chunk
    figures, then the GPU figures of its last prefill and decode phases), on both paths:
    '<phase>.<figure>' -> value for the figures present."""
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
