"""The batch engine: the rules of ``engine.py``, vectorised with polars over many traces at once.

Input is a frame of spans (``SPAN_COLUMNS``: one row per span, the attributes the rules read
already lifted out of the attribute map, as ``BATCH_SPANS_SQL`` returns them); output is one row
per attributable trace in the attribution table's columns (``table.ATTRIBUTION_SCHEMA``). The
per-request engine is the oracle: tests check both agree on random layouts.

Traces are keyed by 64-bit hashes of their ids inside a batch, and the priority sweep is one sort
of all interval ends with a running count per rank (``_sweep_by_rank``), so a batch costs a
handful of sorts and joins whatever its size.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import polars as pl
import pyarrow as pa

from latscope.attribution.engine import (
    DEFAULT_STALL_NS,
    GPU_KEYS,
    GPU_PHASES,
    MAX_PHASE_DEPTH,
    MAX_TOKENS,
    OTHER_RANK,
    PHASE_PRIORITY,
)
from latscope.attribution.model import SpanRecord
from latscope.attribution.table import ATTRIBUTION_SCHEMA, BUCKET_COLUMNS
from latscope.semconv import (
    GenAIAttributes,
    HttpAttributes,
    LatscopeAttributes,
    Phase,
    SpanKind,
    VllmAttributes,
)
from latscope.storage import SPANS_TABLE

#: Frame column -> span attribute it holds ('' or null when absent).
ATTRIBUTE_COLUMNS: dict[str, str] = {
    "phase": LatscopeAttributes.PHASE,
    "token_offsets": LatscopeAttributes.TOKEN_OFFSETS_US,
    "token_count": LatscopeAttributes.TOKEN_COUNT,
    "first_token_ns": LatscopeAttributes.FIRST_TOKEN_NS,
    "model": GenAIAttributes.REQUEST_MODEL,
    "response_model": GenAIAttributes.RESPONSE_MODEL,
    "operation": GenAIAttributes.OPERATION_NAME,
    "route": HttpAttributes.ROUTE,
    "input_tokens": GenAIAttributes.USAGE_INPUT_TOKENS,
    "prompt_tokens": GenAIAttributes.USAGE_PROMPT_TOKENS,
    "output_tokens": GenAIAttributes.USAGE_OUTPUT_TOKENS,
    "completion_tokens": GenAIAttributes.USAGE_COMPLETION_TOKENS,
    "v_queue": VllmAttributes.TIME_IN_QUEUE,
    "v_ttft": VllmAttributes.TIME_TO_FIRST_TOKEN,
    "v_prefill": VllmAttributes.TIME_IN_MODEL_PREFILL,
    "v_decode": VllmAttributes.TIME_IN_MODEL_DECODE,
    "v_e2e": VllmAttributes.E2E,
    **{f"gpu_{name}": key for key, name in GPU_KEYS.items()},
}

_RES = pl.List(pl.Struct({"key": pl.String, "value": pl.String}))

#: The input frame's schema.
SPAN_COLUMNS: dict[str, pl.DataType] = {
    "trace_id": pl.String,
    "span_id": pl.String,
    "parent_id": pl.String,
    "kind": pl.String,
    "service": pl.String,
    "status": pl.String,
    "start": pl.Int64,
    "dur": pl.Int64,
    "first_token_event": pl.Int64,
    "ingested_us": pl.Int64,
    "resource": _RES,
    **dict.fromkeys(ATTRIBUTE_COLUMNS, pl.String),
}


def _attr_select() -> str:
    return ",\n    ".join(f"attrs['{key}'] AS {col}" for col, key in ATTRIBUTE_COLUMNS.items())


#: Every span of a batch of traces, in SPAN_COLUMNS (the keys are semconv constants, not input).
#: The time bounds let ClickHouse prune partitions and use the primary key instead of checking
#: the trace-id bloom filter of the whole table. The attribute map's keys are LowCardinality;
#: looking ~25 keys up in it costs 2.4x more than in the same map cast to plain strings once
#: (bench/attribution, store to store), so the lookups go through the cast.
BATCH_SPANS_SQL = f"""
WITH CAST(SpanAttributes, 'Map(String, String)') AS attrs
SELECT
    TraceId AS trace_id, SpanId AS span_id, ParentSpanId AS parent_id, SpanKind AS kind,
    ServiceName AS service, StatusCode AS status,
    toUnixTimestamp64Nano(Timestamp) AS start, toInt64(Duration) AS dur,
    arrayMin(arrayMap(t -> toUnixTimestamp64Nano(t),
        arrayFilter((t, n) -> n = '{LatscopeAttributes.FIRST_TOKEN_EVENT}',
                    Events.Timestamp, Events.Name))) AS first_token_event_raw,
    has(Events.Name, '{LatscopeAttributes.FIRST_TOKEN_EVENT}') AS has_first_token_event,
    toUnixTimestamp64Micro(LatscopeIngestedAt) AS ingested_us,
    ResourceAttributes AS resource,
    {_attr_select()}
FROM {SPANS_TABLE}
WHERE TraceId IN {{trace_ids:Array(String)}}
  AND Timestamp >= fromUnixTimestamp64Nano({{from_ns:Int64}})
  AND Timestamp <= fromUnixTimestamp64Nano({{to_ns:Int64}})
"""


def frame_from_arrow(table: object) -> pl.DataFrame:
    """The Arrow answer of BATCH_SPANS_SQL -> a frame in SPAN_COLUMNS."""
    df = pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
    df = df.with_columns(
        pl.when(pl.col("has_first_token_event").cast(pl.Boolean))
        .then(pl.col("first_token_event_raw"))
        .otherwise(None)
        .cast(pl.Int64)
        .alias("first_token_event")
    ).drop("first_token_event_raw", "has_first_token_event")
    return _conform(df)


def _conform(df: pl.DataFrame) -> pl.DataFrame:
    cols = []
    for name, dtype in SPAN_COLUMNS.items():
        if name not in df.columns:
            cols.append(pl.lit(None, dtype=dtype).alias(name))
        elif name == "resource":
            cols.append(pl.col(name).cast(_RES))
        else:
            cols.append(pl.col(name).cast(dtype))
    return df.select(cols)


def frame_from_records(traces: Mapping[str, Sequence[SpanRecord]]) -> pl.DataFrame:
    """Per-trace SpanRecords -> the input frame (what the store would return for them)."""
    rows: dict[str, list] = {name: [] for name in SPAN_COLUMNS}
    for trace_id, spans in traces.items():
        for s in spans:
            rows["trace_id"].append(trace_id)
            rows["span_id"].append(s.span_id)
            rows["parent_id"].append(s.parent_span_id)
            rows["kind"].append(s.kind)
            rows["service"].append(s.service)
            rows["status"].append(s.status)
            rows["start"].append(s.start_ns)
            rows["dur"].append(s.duration_ns)
            events = [t for n, t in s.events if n == LatscopeAttributes.FIRST_TOKEN_EVENT]
            rows["first_token_event"].append(min(events) if events else None)
            rows["ingested_us"].append(None)
            rows["resource"].append([{"key": k, "value": v} for k, v in s.resource.items()])
            for col, key in ATTRIBUTE_COLUMNS.items():
                rows[col].append(s.attributes.get(key, ""))
    return pl.DataFrame(rows, schema=SPAN_COLUMNS)


def _num(col: str) -> pl.Expr:
    return pl.col(col).cast(pl.Float64, strict=False)


def _int(col: str) -> pl.Expr:
    """As SpanRecord.attr_int: an integer as written, else a float truncated."""
    return pl.coalesce(
        pl.col(col).cast(pl.Int64, strict=False), _num(col).cast(pl.Int64, strict=False)
    )


def _ns(expr: pl.Expr) -> pl.Expr:
    """Seconds -> ns rounded half up, as engine.seconds_to_ns."""
    return (expr * 1e9 + 0.5).floor().cast(pl.Int64)


_RANK = {p: i for i, p in enumerate(PHASE_PRIORITY)}
_VLLM = ["v_queue", "v_ttft", "v_prefill", "v_decode", "v_e2e"]
_OFFSETS_RE = r"^\s*\[\s*-?\d+(\s*,\s*-?\d+)*\s*\]\s*$"


def attribute_frame(
    spans: pl.DataFrame, *, stall_threshold_ns: int = DEFAULT_STALL_NS
) -> pl.DataFrame:
    """Attribute every trace in ``spans``; one row per trace with a server span.

    Columns are the attribution table's, except SpanCount / SpansIngestedAt / Version /
    IsDeleted, which ``finish_rows`` adds.
    """
    s = (
        _conform(spans)
        .with_columns(
            # Integer keys: joins and groupings on 64-bit hashes, not on hex strings (a collision
            # inside one batch is ~1e-9 likely at 1e5 spans).
            tk=pl.col("trace_id").hash(),
            sk=pl.struct("trace_id", "span_id").hash(),
            pk=pl.struct("trace_id", "parent_id").hash(),
        )
        .unique("sk", keep="first", maintain_order=True)
        .with_columns(
            end=pl.col("start") + pl.col("dur"),
            is_server=pl.col("kind") == SpanKind.SERVER,
            has_vllm=pl.any_horizontal(_num(c).is_not_null() for c in _VLLM),
        )
    )
    counts = s.group_by("tk").agg(
        span_count=pl.len().cast(pl.UInt32), ingested_us=pl.col("ingested_us").max()
    )

    # Phase spans and the SERVER span that owns each (nearest SERVER ancestor).
    phases = s.filter(pl.col("phase").is_in(Phase.ALL))
    nodes = s.select(node="sk", node_parent="pk", node_is_server="is_server")
    cur = phases.select("sk", cur="pk")
    found = []
    for _ in range(MAX_PHASE_DEPTH):
        if cur.height == 0:
            break
        j = cur.join(nodes, left_on="cur", right_on="node")
        found.append(j.filter(pl.col("node_is_server")).select("sk", owner="cur"))
        cur = j.filter(~pl.col("node_is_server")).select("sk", cur="node_parent")
    owners = (
        pl.concat(found) if found else pl.DataFrame(schema={"sk": pl.UInt64, "owner": pl.UInt64})
    )
    phases = phases.join(owners, on="sk")

    # Candidates, the request's first server span, its client, the attempts.
    owned = phases.select(sk="owner").unique().with_columns(owns=pl.lit(True))
    servers = (
        s.filter(pl.col("is_server"))
        .join(owned, on="sk", how="left")
        .with_columns(owns=pl.col("owns").fill_null(False))
        .with_columns(inference=pl.col("owns") | pl.col("has_vllm"))
        .with_columns(any_inference=pl.col("inference").any().over("tk"))
        .filter(pl.col("inference") | ~pl.col("any_inference"))
        .sort(["tk", "start", "span_id"])
    )
    firsts = servers.group_by("tk", maintain_order=True).agg(
        trace_id=pl.col("trace_id").first(),
        first_id=pl.col("sk").first(),
        first_parent=pl.col("pk").first(),
        first_start=pl.col("start").first(),
        first_end=pl.col("end").first(),
    )
    clients = s.filter(pl.col("kind") == SpanKind.CLIENT).select(
        first_parent="sk",
        c_start=pl.col("start"),
        c_end=pl.col("end"),
        c_first_token=pl.coalesce(_int("first_token_ns"), pl.col("first_token_event")),
        **{f"c_{col}": pl.col(col) for col in _MERGED},
    )
    req = firsts.join(clients, on="first_parent", how="left").with_columns(
        has_client=pl.col("c_start").is_not_null()
    )
    attempts = servers.join(
        req.select("tk", "first_id", "first_parent", "has_client"), on="tk"
    ).filter(
        pl.when(pl.col("has_client"))
        .then(pl.col("pk") == pl.col("first_parent"))
        .otherwise(pl.col("sk") == pl.col("first_id"))
    )
    last = attempts.group_by("tk", maintain_order=True).agg(
        hull_lo=pl.col("start").min(),
        hull_hi=pl.col("end").max(),
        n_attempts=pl.len().cast(pl.UInt16),
        **{
            f"l_{col}": pl.col(col).last()
            for col in (*_MERGED, "service", "status", "resource", "start", "span_id", *_VLLM)
        },
    )
    req = req.join(last, on="tk")
    c_dur = pl.col("c_end") - pl.col("c_start")
    hull = pl.col("hull_hi") - pl.col("hull_lo")
    fits = ~pl.col("has_client") | (
        (pl.col("hull_lo") >= pl.col("c_start")) & (pl.col("hull_hi") <= pl.col("c_end"))
    )
    req = req.with_columns(
        offset=pl.when(fits)
        .then(0)
        .when(hull > c_dur)
        .then(pl.col("c_start") - pl.col("hull_lo"))
        .otherwise(pl.col("c_start") + (c_dur - hull) // 2 - pl.col("hull_lo"))
        .cast(pl.Int64),
        lo=pl.when(pl.col("has_client")).then(pl.col("c_start")).otherwise(pl.col("first_start")),
        hi=pl.when(pl.col("has_client")).then(pl.col("c_end")).otherwise(pl.col("first_end")),
    )
    frame = req.select("tk", "offset", "lo", "hi")

    # Intervals: attempt windows (rank OTHER) clipped to the timeline, phases clipped to them.
    att = attempts.join(frame, on="tk").with_columns(
        a_lo=pl.max_horizontal(pl.col("start") + pl.col("offset"), pl.col("lo")),
        a_hi=pl.min_horizontal(pl.col("end") + pl.col("offset"), pl.col("hi")),
    )
    win = att.select(owner="sk", a_lo="a_lo", a_hi="a_hi", offset="offset")
    ph = phases.join(win, on="owner")
    vllm = _vllm_intervals(att.filter(~pl.col("owns") & pl.col("has_vllm")))
    raw = pl.concat(
        [
            ph.select(
                "tk",
                rank=pl.col("phase").replace_strict(_RANK, return_dtype=pl.Int32),
                s0="start",
                e0="end",
                a_lo="a_lo",
                a_hi="a_hi",
                offset="offset",
            ),
            vllm,
        ]
    ).select(
        "tk",
        "rank",
        s=pl.max_horizontal(pl.col("s0") + pl.col("offset"), pl.col("a_lo")),
        e=pl.min_horizontal(pl.col("e0") + pl.col("offset"), pl.col("a_hi")),
    )
    intervals = pl.concat(
        [raw, att.select("tk", rank=pl.lit(OTHER_RANK, pl.Int32), s="a_lo", e="a_hi")]
    ).filter(pl.col("e") > pl.col("s"))
    swept = _sweep_by_rank(intervals)

    # Buckets: what no attempt covers is network (client time outside the server).
    b = [pl.col(f"b{r}").fill_null(0) for r in range(OTHER_RANK + 1)]
    bucket_exprs = {BUCKET_COLUMNS[name]: b[r] for name, r in _RANK.items()}
    bucket_exprs["OtherNs"] = b[OTHER_RANK]
    e2e = pl.col("hi") - pl.col("lo")
    bucket_exprs["NetworkNs"] = (
        pl.when(pl.col("has_client")).then(e2e - pl.sum_horizontal(b)).otherwise(None)
    )

    merged = {col: pl.coalesce(_nz(f"l_{col}"), _nz(f"c_{col}")) for col in _MERGED}
    out = req.join(swept, on="tk", how="left").with_columns(
        **{k: v.cast(pl.UInt64) for k, v in bucket_exprs.items()},
        E2eNs=e2e.cast(pl.UInt64),
        Model=pl.coalesce(merged["model"], merged["response_model"], pl.lit("")),
        Operation=merged["operation"].fill_null(""),
        Route=merged["route"].fill_null(""),
        InputTokens=pl.coalesce(
            _tokens_from(merged["input_tokens"]), _tokens_from(merged["prompt_tokens"])
        ),
        OutputTokens=pl.coalesce(
            _tokens_from(merged["output_tokens"]), _tokens_from(merged["completion_tokens"])
        ),
    )
    out = _streaming(out, ph, att, stall_threshold_ns)
    out = out.join(_gpu(ph), on="tk", how="left")
    out = out.join(counts, on="tk", how="left")
    return out.select(
        Timestamp=pl.col("lo"),
        TraceId="trace_id",
        ServiceName="l_service",
        Model="Model",
        Operation="Operation",
        Route="Route",
        ResourceAttributes="l_resource",
        StatusCode="l_status",
        HasClient="has_client",
        Attempts="n_attempts",
        E2eNs="E2eNs",
        NetworkNs="NetworkNs",
        QueueNs="QueueNs",
        PreprocessNs="PreprocessNs",
        PrefillNs="PrefillNs",
        DecodeNs="DecodeNs",
        PostprocessNs="PostprocessNs",
        OtherNs="OtherNs",
        TtftClientNs="TtftClientNs",
        TtftServerNs="TtftServerNs",
        TpotNs="TpotNs",
        ItlP50Ns="ItlP50Ns",
        ItlP99Ns="ItlP99Ns",
        ItlMaxNs="ItlMaxNs",
        Stalls=pl.col("Stalls").fill_null(0).cast(pl.UInt32),
        InputTokens=pl.col("InputTokens").cast(pl.UInt32),
        OutputTokens=pl.col("OutputTokens").cast(pl.UInt32),
        ClockSkewNs=-pl.col("offset"),
        Gpu=pl.col("Gpu").fill_null([]),
        SpanCount="span_count",
        SpansIngestedAt="ingested_us",
    )


#: Attributes read from the last attempt, else from the client span.
_MERGED = (
    "model",
    "response_model",
    "operation",
    "route",
    "input_tokens",
    "prompt_tokens",
    "output_tokens",
    "completion_tokens",
)


def _nz(col: str) -> pl.Expr:
    return pl.when(pl.col(col) == "").then(None).otherwise(pl.col(col))


def _tokens_from(expr: pl.Expr) -> pl.Expr:
    value = expr.cast(pl.Float64, strict=False).cast(pl.Int64, strict=False)
    return pl.when(value.is_between(0, MAX_TOKENS)).then(value).otherwise(None)


def _vllm_intervals(att: pl.DataFrame) -> pl.DataFrame:
    q = _ns(_num("v_queue")).fill_null(0)
    ttft = _ns(_num("v_ttft"))
    prefill = (
        pl.when(_num("v_prefill").is_not_null())
        .then(_ns(_num("v_prefill")))
        .when(ttft.is_not_null())
        .then(pl.max_horizontal(ttft - q, pl.lit(0, pl.Int64)))
        .otherwise(0)
    )
    a = att.with_columns(q=q, prefill=prefill).with_columns(
        ttft=ttft.fill_null(pl.col("q") + pl.col("prefill")),
        decode=_ns(_num("v_decode")).fill_null(0),
    )
    keep = ("tk", "a_lo", "a_hi", "offset")
    st = pl.col("start")
    parts = [
        a.select(*keep, rank=pl.lit(_RANK[Phase.QUEUE], pl.Int32), s0=st, e0=st + pl.col("q")),
        a.select(
            *keep,
            rank=pl.lit(_RANK[Phase.PREFILL], pl.Int32),
            s0=st + pl.col("q"),
            e0=st + pl.col("q") + pl.col("prefill"),
        ),
        a.select(
            *keep,
            rank=pl.lit(_RANK[Phase.DECODE], pl.Int32),
            s0=st + pl.col("ttft"),
            e0=st + pl.col("ttft") + pl.col("decode"),
        ),
    ]
    return pl.concat(parts).select("tk", "rank", "s0", "e0", "a_lo", "a_hi", "offset")


def _sweep_by_rank(intervals: pl.DataFrame) -> pl.DataFrame:
    """tk, b0..b5: per trace, the time whose best (lowest) covering rank is r.

    One sort of the interval ends per batch: each start adds 1 and each end subtracts 1 from its
    rank's running count, so between two consecutive events the lowest rank with a positive count
    owns the time. Every trace's counts return to zero at its last event, so the running sums need
    no per-trace reset and the gap to the next trace's first event is never counted.
    """
    events = pl.concat(
        [
            intervals.select("tk", "rank", t="s", d=pl.lit(1, pl.Int32)),
            intervals.select("tk", "rank", t="e", d=pl.lit(-1, pl.Int32)),
        ]
    ).sort(["tk", "t"])
    ranks = range(OTHER_RANK + 1)
    counts = [
        pl.when(pl.col("rank") == r).then(pl.col("d")).otherwise(0).cum_sum().alias(f"c{r}")
        for r in ranks
    ]
    top = pl.when(pl.col("c0") > 0).then(0)
    for r in ranks[1:]:
        top = top.when(pl.col(f"c{r}") > 0).then(r)
    seg = pl.col("t").shift(-1) - pl.col("t")
    return (
        events.with_columns(counts)
        .with_columns(top=top.otherwise(None), seg=seg)
        .group_by("tk")
        .agg(
            pl.when(pl.col("top") == r).then(pl.col("seg")).otherwise(0).sum().alias(f"b{r}")
            for r in ranks
        )
    )


def _streaming(
    out: pl.DataFrame, ph: pl.DataFrame, att: pl.DataFrame, stall_ns: int
) -> pl.DataFrame:
    cand = ph.filter(pl.col("phase") == Phase.DECODE).select(
        "tk", "start", "span_id", "owner", "token_count", "token_offsets"
    )
    decodes = (
        cand.filter(pl.col("token_offsets").str.contains(_OFFSETS_RE))
        .sort(["tk", "start", "span_id"])
        .unique("tk", keep="last", maintain_order=True)
        .join(att.select(owner="sk", a_start="start"), on="owner")
    )
    # List arithmetic per decode span (no explode): token offsets in µs -> gaps in ns.
    # The collector writes compact JSON ("[0,15000]"); other writers may add spaces.
    spaced = pl.col("token_offsets").str.contains(" ", literal=True)
    decodes = pl.concat(
        [
            decodes.filter(~spaced),
            decodes.filter(spaced).with_columns(
                pl.col("token_offsets").str.replace_all(r"\s+", "")
            ),
        ]
    )
    offs = (
        pl.col("token_offsets")
        .str.strip_chars("[]")
        .str.split(",")
        .cast(pl.List(pl.Int64), strict=False)
    )
    gaps = pl.col("offs").list.diff().list.slice(1).list.eval(pl.element() * 1000)
    stats = (
        decodes.select("tk", "start", "a_start", "token_count", offs=offs)
        .with_columns(gaps=gaps)
        .select(
            "tk",
            "a_start",
            "token_count",
            n=pl.col("offs").list.len(),
            first=pl.col("start") + pl.col("offs").list.first() * 1000,
            last=pl.col("start") + pl.col("offs").list.last() * 1000,
            ItlP50Ns=pl.col("gaps").list.eval(pl.element().quantile(0.5, "linear")).list.first(),
            ItlP99Ns=pl.col("gaps").list.eval(pl.element().quantile(0.99, "linear")).list.first(),
            ItlMaxNs=pl.col("gaps").list.max().cast(pl.Float64),
            Stalls=pl.col("gaps").list.eval((pl.element() > stall_ns).sum()).list.first(),
        )
    )
    out = out.join(stats, on="tk", how="left")
    has_tokens = pl.col("n").is_not_null()
    count = _int("token_count")
    out_tokens = pl.coalesce(
        pl.col("OutputTokens"),
        pl.when(has_tokens).then(
            pl.when(count.is_not_null() & (count != 0)).then(count).otherwise(pl.col("n"))
        ),
    )
    v_ttft = _ns(_num("l_v_ttft"))
    v_decode = _ns(_num("l_v_decode"))
    return out.with_columns(
        OutputTokens=out_tokens,
        TtftServerNs=pl.when(has_tokens)
        .then(pl.col("first") - pl.col("a_start"))
        .otherwise(v_ttft),
        TpotNs=pl.when(has_tokens)
        .then(pl.when(pl.col("n") > 1).then((pl.col("last") - pl.col("first")) / (pl.col("n") - 1)))
        .when(v_ttft.is_not_null() & v_decode.is_not_null() & (pl.col("OutputTokens") > 1))
        .then(v_decode / (pl.col("OutputTokens") - 1))
        .cast(pl.Float64),
        ItlP50Ns=pl.when(pl.col("n") > 1).then(pl.col("ItlP50Ns")),
        ItlP99Ns=pl.when(pl.col("n") > 1).then(pl.col("ItlP99Ns")),
        ItlMaxNs=pl.when(pl.col("n") > 1).then(pl.col("ItlMaxNs")),
        Stalls=pl.when(pl.col("n") > 1).then(pl.col("Stalls")).otherwise(0),
        TtftClientNs=pl.col("c_first_token") - pl.col("c_start"),
    )


def _gpu(ph: pl.DataFrame) -> pl.DataFrame:
    gpu_cols = [f"gpu_{name}" for name in GPU_KEYS.values()]
    spans = (
        ph.filter(
            pl.col("phase").is_in(GPU_PHASES)
            & pl.any_horizontal(_num(c).is_not_null() for c in gpu_cols)
        )
        .sort(["tk", "phase", "start", "span_id"])
        .group_by(["tk", "phase"], maintain_order=True)
        .last()
    )
    long = (
        spans.select("tk", "phase", *(_num(c).alias(c) for c in gpu_cols))
        .unpivot(index=["tk", "phase"], variable_name="figure", value_name="value")
        .drop_nulls("value")
        .with_columns(
            key=pl.col("phase") + "." + pl.col("figure").str.strip_prefix("gpu_"),
        )
    )
    return long.group_by("tk").agg(Gpu=pl.struct(key="key", value="value"))


def finish_rows(frame: pl.DataFrame) -> pl.DataFrame:
    """Add Version (= distinct spans seen, so a re-run writes the same row) and IsDeleted."""
    return frame.with_columns(
        Version=pl.col("SpanCount").cast(pl.UInt64),
        IsDeleted=pl.lit(0, pl.UInt8),
        SpansIngestedAt=pl.col("SpansIngestedAt").fill_null(0),
    )


def to_arrow(frame: pl.DataFrame) -> pa.Table:
    """A finished frame -> an Arrow table in ATTRIBUTION_SCHEMA, ready for insert_arrow."""
    table = frame.select(ATTRIBUTION_SCHEMA.names).to_arrow()
    cols = []
    for field in ATTRIBUTION_SCHEMA:
        col = table.column(field.name).combine_chunks()
        if pa.types.is_map(field.type):
            # polars has no map type: list<struct<key, value>> -> map<key, value>.
            col = col.cast(pa.list_(col.type.value_type))
            values = col.flatten()
            col = pa.MapArray.from_arrays(
                col.offsets,
                values.field(0).cast(field.type.key_type),
                values.field(1).cast(field.type.item_type),
                type=field.type,
                mask=col.is_null(),
            )
        else:
            if pa.types.is_timestamp(field.type) and pa.types.is_integer(col.type):
                col = col.cast(pa.int64())
            col = col.cast(field.type)
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=ATTRIBUTION_SCHEMA)


def attribute_records(
    traces: Mapping[str, Sequence[SpanRecord]] | Iterable[tuple[str, Sequence[SpanRecord]]],
    *,
    stall_threshold_ns: int = DEFAULT_STALL_NS,
) -> pl.DataFrame:
    """Convenience: SpanRecords per trace -> attributed rows (tests, benchmarks)."""
    traces = dict(traces)
    return attribute_frame(frame_from_records(traces), stall_threshold_ns=stall_threshold_ns)
