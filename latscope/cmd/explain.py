"""``latscope explain ID``: one request's buckets, span waterfall and token timeline; or, for a
trace with several inference calls (an agent run), the run: its critical path split into LLM
buckets, tool calls and the app's own time, its calls, and the waterfall with the calls marked."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from latscope.cmd import _render as r
from latscope.cmd._source import Source, SourceError, add_source_arguments, run_query
from latscope.semconv import BUCKETS

if TYPE_CHECKING:
    from latscope.api.schemas import Answer

HELP = "one request (buckets, waterfall, tokens), or a multi-call trace's run (critical path)"

#: Answers that mean "this id names a trace, not one request": show the trace as a run.
_TRACE_ERRORS = ("several_requests", "no_inference_call")
#: The run's budget beyond the LLM buckets, with their colours (the web page's hues).
TOOL, APP = "tool", "app"
RUN_COLOURS: dict[str, str] = {**r.COLOURS, TOOL: "dark_goldenrod", APP: "white"}
RUN_GLYPHS: dict[str, str] = {**r.GLYPHS, TOOL: "*", APP: "o"}
#: Calls and tools listed at most.
MAX_ROWS = 50
#: Spans of a run's waterfall drawn at most, oldest first: a long agent run holds tens of
#: thousands, which a terminal cannot show usefully (and which take minutes to lay out);
#: ``--json`` and the web page give them all.
MAX_SPAN_ROWS = 500
#: A request id: 32 hex digits, '-', 16 hex digits.
REQUEST_ID_WIDTH = 49


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "id",
        metavar="ID",
        help="a request id (TRACE_ID-SPAN_ID, as `top`, the API and the web page show it) or a "
        "trace id (32 hexadecimal characters): a trace with one call shows that request, one "
        "with several shows the run",
    )
    parser.add_argument(
        "--stall-ms",
        type=float,
        default=None,
        help="inter-token gaps longer than this are stalls (default: the attributor's, 250 ms)",
    )
    add_source_arguments(parser)


def render(body: dict[str, Any]) -> None:
    out = r.console()
    a, spans, tokens = body["attribution"], body["spans"], body["tokens"]
    e2e = a["e2e_ms"]
    header = Text(f"request {a.get('request_id') or a['trace_id']}", style="bold")
    header.append(f"  {a['service']}  {a['model'] or '(no model)'}  e2e {r.ms(e2e)}")
    out.print(header)
    out.print(r.stacked_bar(a["buckets_ms"]))
    out.print(r.legend())
    standing = body["standing"]
    out.print(r.attribution_table(a, standing["percentiles"]))
    out.print(standing_text(standing, a))
    if a["buckets_ms"].get("network") is None:
        out.print(Text("network unknown: no client span was seen", style="italic"))
    skew = a.get("clock_skew_ms")
    if skew:
        way = "ahead of" if skew > 0 else "behind"
        out.print(f"server clock runs {r.ms(abs(skew))} {way} the client's (adjusted)")
    if a.get("client_headers_only"):
        out.print(
            "the client span ended at the response headers: the request runs to the server's "
            "end plus the estimated return leg"
        )
    out.print()
    own = request_spans(spans, a.get("request_id"))
    out.print(Text("spans", style="bold"))
    if len(own) < len(spans):
        out.print(f"(the spans of this call; its trace holds {len(_marks(spans))} calls)")
    out.print(r.waterfall(own, e2e))
    out.print()
    out.print(Text("tokens", style="bold"))
    if not tokens["count"]:
        out.print("no token times recorded")
        return
    out.print(r.token_strip(tokens, e2e))
    itl = a["itl_ms"]
    out.print(
        f"{tokens['count']} tokens  TTFT {r.ms(a['ttft_ms'])}  TPOT {r.ms(a['tpot_ms'], 2)}\n"
        f"ITL p50 {r.ms(itl['p50'], 2)}  p99 {r.ms(itl['p99'], 2)}  max {r.ms(itl['max'], 2)}"
    )
    stalls = tokens["stalls"]
    threshold = r.ms(tokens["stall_threshold_ms"], 2)
    if stalls:
        out.print(Text(f"{len(stalls)} stall(s) over {threshold}:", style="bold red"))
        for s in stalls[:10]:
            out.print(f"  token {s['index']} at {r.ms(s['at_ms'])} after a {r.ms(s['gap_ms'])} gap")
        if len(stalls) > 10:
            out.print(f"  … and {len(stalls) - 10} more")
    else:
        out.print(f"no stalls (threshold {threshold})")


def standing_text(standing: Mapping[str, Any], a: Mapping[str, Any]) -> str:
    """What the percentile column ranks against, and where TTFT and TPOT stand."""
    if not standing["peers"]:
        return (
            f"no other request of {a['service']} / {a['model'] or '(no model)'} started in the "
            "hour before it: no percentiles"
        )
    p = standing["percentiles"]

    def rank(name: str) -> str:
        return "—" if p[name] is None else f"p{p[name]:.1f}"

    return (
        f"percentile among the {standing['peers']} requests of {a['service']} / "
        f"{a['model'] or '(no model)'} that started in the hour before it "
        f"({standing['since']} → {standing['until']}); TTFT {rank('ttft')}, TPOT {rank('tpot')}"
    )


# -- a run ----------------------------------------------------------------------------------------


def request_spans(
    spans: Sequence[Mapping[str, Any]], request_id: str | None
) -> list[Mapping[str, Any]]:
    """The spans of one call: in a trace with several calls, the span marked with its request
    id and everything under it (depths from there); else every span of the trace."""
    if request_id is None or len(_marks(spans)) <= 1:
        return list(spans)
    top = next((s for s in spans if s.get("request_id") == request_id), None)
    if top is None:
        return list(spans)
    children: dict[str, list[str]] = {}
    for s in spans:
        children.setdefault(s["parent_span_id"], []).append(s["span_id"])
    keep: set[str] = set()
    stack = [top["span_id"]]
    while stack:
        span_id = stack.pop()
        if span_id not in keep:
            keep.add(span_id)
            stack.extend(children.get(span_id, ()))
    base = top.get("depth", 0)
    return [{**s, "depth": s.get("depth", 0) - base} for s in spans if s["span_id"] in keep]


def _marks(spans: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """span id -> "call N" for each call's client span (else server span), in time order."""
    marks: dict[str, str] = {}
    for s in spans:
        if s.get("request_id"):
            marks[s["span_id"]] = f"call {len(marks) + 1}"
    return marks


def run_parts(budget: Mapping[str, Any]) -> dict[str, float]:
    """The run's critical path as one mapping: the seven LLM buckets, then tool and app (ms)."""
    parts = {b: budget["llm_buckets"][b] for b in BUCKETS}
    return {**parts, TOOL: budget["tool"], APP: budget["app"]}


def run_bar(parts: Mapping[str, float], width: int = r.BAR_WIDTH) -> Text:
    """A bar of ``width`` cells split among the run's parts in proportion."""
    return r.stacked_bar(parts, width, colours=RUN_COLOURS, glyphs=RUN_GLYPHS)


def dominant(buckets: Mapping[str, float | None]) -> str | None:
    known = {b: v for b, v in buckets.items() if v}
    return max(known, key=lambda b: known[b]) if known else None


def budget_table(run: Mapping[str, Any], total: str = "e2e (root)") -> Table:
    e2e = run["e2e_ms"] or 0.0
    budget = run["critical_path_ms"]
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("on the critical path")
    table.add_column("ms", justify="right")
    table.add_column("share", justify="right")

    def row(name: str, value: float, style: str) -> None:
        table.add_row(Text(name, style=style), r.ms(value), r.pct(value / e2e if e2e else None))

    for b in BUCKETS:
        row(f"  LLM {b}", budget["llm_buckets"][b], r.COLOURS[b])
    row("LLM calls", budget["llm"], "bold")
    row("tool calls", budget["tool"], RUN_COLOURS[TOOL])
    row("app (orchestration)", budget["app"], RUN_COLOURS[APP])
    table.add_row(Text(total, style="bold"), r.ms(e2e), "100.0%")
    return table


def _calls_table(run: Mapping[str, Any]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("call", "service", "model", "start ms", "e2e", "on path", "dominant"):
        right = col in ("start ms", "e2e", "on path")
        names = col in ("service", "model")  # these wrap; the figures never do
        table.add_column(col, justify="right" if right else "left", no_wrap=not names)
    for n, call in enumerate(run["calls"][:MAX_ROWS], 1):
        a = call["attribution"]
        top = dominant(a["buckets_ms"])
        table.add_row(
            f"call {n}",
            a["service"],
            a["model"] or "—",
            f"{call['start_ms']:.1f}",
            r.ms(call["e2e_ms"]),
            r.ms(call["on_critical_path_ms"]) if call["on_critical_path_ms"] else "—",
            Text(top, style=r.COLOURS[top]) if top else Text("—"),
        )
    return table


def _ids_table(run: Mapping[str, Any]) -> Table:
    """Each call's whole request id, on a line of its own: what ``explain`` takes."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("call", no_wrap=True)
    table.add_column("request id (latscope explain ID)", no_wrap=True, min_width=REQUEST_ID_WIDTH)
    for n, call in enumerate(run["calls"][:MAX_ROWS], 1):
        table.add_row(f"call {n}", call["request_id"])
    return table


def _tools_table(run: Mapping[str, Any]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("tool call", "start ms", "dur", "on path"):
        name = col == "tool call"
        table.add_column(col, justify="left" if name else "right", no_wrap=not name)
    for t in run["tools"][:MAX_ROWS]:
        table.add_row(
            t["name"],
            f"{t['start_ms']:.1f}",
            r.ms(t["duration_ms"]),
            r.ms(t["on_critical_path_ms"]) if t["on_critical_path_ms"] else "—",
        )
    return table


def render_run(body: dict[str, Any]) -> None:
    """A trace as a run (``GET /v1/traces/{trace_id}``)."""
    out = r.console()
    run, spans = body["run"], body["spans"]
    root = run["root"]
    header = Text(f"trace {run['trace_id']}", style="bold")
    header.append(f"  {root['name']} ({root['service']})  e2e {r.ms(run['e2e_ms'])}")
    out.print(header)
    calls, tools = run["calls"], run["tools"]
    out.print(
        f"{len(calls)} inference call(s), {len(tools)} tool call(s); along the critical path "
        "(what the root waited on), the time went to:"
    )
    out.print(run_bar(run_parts(run["critical_path_ms"])))
    out.print(r.legend(RUN_COLOURS, RUN_GLYPHS))
    out.print(budget_table(run))
    if calls:
        out.print()
        out.print(Text("calls", style="bold"))
        out.print(r.fit(_calls_table(run), drop=("dominant", "start ms")))
        out.print(_ids_table(run))
        if len(calls) > MAX_ROWS:
            out.print(f"  … and {len(calls) - MAX_ROWS} more")
    if tools:
        out.print()
        out.print(Text("tools", style="bold"))
        out.print(r.fit(_tools_table(run), drop=("start ms",)))
    out.print()
    out.print(Text("spans", style="bold"))
    marks = _marks(spans)
    out.print(r.waterfall(spans[:MAX_SPAN_ROWS], run["e2e_ms"], marks=marks))
    if len(spans) > MAX_SPAN_ROWS:
        out.print(
            f"  … and {len(spans) - MAX_SPAN_ROWS} more spans (--json or the web page shows all)"
        )


def main(args: argparse.Namespace) -> int:
    show = render

    def ask(source: Source) -> Answer:
        nonlocal show
        try:
            return source.query("explain", request_id=args.id, stall_ms=args.stall_ms)
        except SourceError as exc:
            if exc.error not in _TRACE_ERRORS:
                raise
        # A trace id of a trace with several calls (or none): the trace as a run.
        show = render_run
        return source.query("trace", trace_id=args.id)

    # A request's and a trace's answers are rendered from their JSON.
    return run_query(args, f"explaining {args.id}", ask, lambda answer: show(answer.json_dict()))
