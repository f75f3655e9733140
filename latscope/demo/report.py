"""What ``latscope demo`` prints: latscope's report on the run, and the check against the truth."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from latscope.cmd._render import pct as _pct
from latscope.semconv import BUCKETS

#: A run's critical path: the LLM calls' buckets, then tool calls and the app's own time.
RUN_PARTS = (*(f"llm.{b}" for b in BUCKETS), "tool", "app")

if TYPE_CHECKING:
    from latscope.demo.run import DemoRun


def _ms(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.1f}" if abs(value) < 10_000 else f"{value:,.0f}"


def print_report(console: Console, run: DemoRun, *, web_page: bool = True) -> None:
    """The run's report; ``web_page``: the page stays up after it, so its address is printed."""
    results = run.results
    errors = sum(1 for r in results if not r.ok)
    rate = len(results) / run.duration_s if run.duration_s else 0.0
    console.print()
    line = f"{len(results)} requests in {run.duration_s:g} s ({rate:.1f}/s), {errors} errors"
    if run.clock_skew_s:
        line += f"; the server's clock runs {run.clock_skew_s:+.3f} s off the client's"
    console.print(line)
    if run.summary:
        print_summary(console, run.summary)
    if run.tail and run.tail.get("dominant"):
        print_tail(console, run.tail)
    if run.diagnosis:
        print_diagnosis(console, run.diagnosis)
    if run.report_error:
        console.print(f"[yellow]report incomplete:[/] {run.report_error}")
    met = run.expectation_met()
    if met is not None:
        expect = run.scenario.expect
        want = f"dominant bucket {expect.dominant}" + (
            f", verdict {', '.join(expect.verdicts)}" if expect.verdicts else ""
        )
        mark = "[green]as expected[/]" if met else "[red]NOT as expected[/]"
        console.print(f"Scenario {run.scenario.name} expects {want}: {mark}")
    if run.coldstart is not None:
        print_coldstart(console, run.coldstart)
    if run.run_answers:
        print_runs(console, run)
    if run.check is not None:
        print_check(console, run)
    if run.cold_check is not None:
        print_cold_check(console, run)
    if run.run_check is not None:
        print_run_check(console, run)
    if web_page:
        console.print(f"\nlatscope's web page: [bold]{run.web_url}[/]")


def print_summary(console: Console, summary: dict[str, Any]) -> None:
    e2e = summary.get("e2e_ms") or {}
    console.print(
        f"\n[bold]Where the time went[/] over {summary.get('count', 0)} requests — end to end "
        f"p50 {_ms(e2e.get('p50'))} ms · p95 {_ms(e2e.get('p95'))} ms · "
        f"p99 {_ms(e2e.get('p99'))} ms"
    )
    table = Table(box=None, pad_edge=False)
    for col in ("bucket", "mean ms", "p50 ms", "p95 ms", "p99 ms", "share"):
        table.add_column(col, justify="left" if col == "bucket" else "right")
    buckets = summary.get("buckets_ms") or {}
    for bucket in BUCKETS:
        b = buckets.get(bucket) or {}
        table.add_row(
            bucket,
            _ms(b.get("mean")),
            _ms(b.get("p50")),
            _ms(b.get("p95")),
            _ms(b.get("p99")),
            _pct(b.get("share")),
        )
    console.print(table)
    streaming = summary.get("streaming") or {}
    ttft = streaming.get("ttft_ms") or {}
    itl50 = streaming.get("itl_p50_ms") or {}
    itl99 = streaming.get("itl_p99_ms") or {}
    console.print(
        f"TTFT p50 {_ms(ttft.get('p50'))} ms · p95 {_ms(ttft.get('p95'))} ms. Inter-token "
        f"latency: a typical stream's median {_ms(itl50.get('p50'))} ms, its p99 "
        f"{_ms(itl99.get('p50'))} ms (p99 {_ms(itl99.get('p95'))} ms in the worst 5 % of "
        f"streams), longest gap {_ms(streaming.get('itl_max_ms'))} ms; "
        f"{streaming.get('stalled_requests', 0)} of {summary.get('count', 0)} streams stalled"
    )


def print_tail(console: Console, tail: dict[str, Any]) -> None:
    dominant = tail["dominant"]
    extra = (tail.get("buckets_ms") or {}).get(dominant) or {}
    console.print(
        f"\n[bold]Tail[/]: the slowest {100 - tail.get('percentile', 99):g}% "
        f"({tail.get('tail_count', 0)} requests, ≥ {_ms(tail.get('threshold_ms'))} ms) take "
        f"{_ms(tail.get('extra_e2e_ms'))} ms more than the median request; "
        + (
            f"[bold]{dominant}[/] alone adds more than that (+{_ms(extra.get('extra'))} ms; "
            "other buckets were faster than the median's)"
            if (extra.get("extra_share") or 0) > 1
            else f"{_pct(extra.get('extra_share'))} of that is [bold]{dominant}[/] "
            f"(+{_ms(extra.get('extra'))} ms)"
        )
    )


def print_diagnosis(console: Console, diagnosis: dict[str, Any]) -> None:
    console.print(
        f"\n[bold]Diagnosis[/]: most time goes to [bold]{diagnosis.get('dominant')}[/]"
        + (
            f"; the tail's extra time to [bold]{diagnosis['tail_dominant']}[/]"
            if diagnosis.get("tail_dominant")
            else ""
        )
    )
    verdicts = diagnosis.get("verdicts") or []
    if not verdicts:
        console.print("  no known problem pattern found")
    for verdict in verdicts:
        console.print(f"  • [bold]{verdict.get('cause')}[/] ({verdict.get('id')})")
        for fix in verdict.get("fixes") or ():
            console.print(f"      – {fix}")


def print_check(console: Console, run: DemoRun) -> None:
    check = run.check
    assert check is not None
    console.print(
        f"\n[bold]Check against the ground truth[/]: {check.compared} requests, tolerance "
        f"max(1 ms, 2%) per bucket per request (err: how far latscope lies outside the truth's "
        f"bracket, the interval its own clock readings pin the true value to)"
    )
    table = Table(box=None, pad_edge=False)
    columns = ("bucket", "truth ms", "± bracket", "latscope ms", "mean err", "max err", "within")
    for col in columns:
        table.add_column(col, justify="left" if col == "bucket" else "right")
    for b in check.buckets:
        table.add_row(
            b.bucket,
            f"{b.truth_mean_ms:.3f}",
            f"{b.bracket_mean_ms / 2:.3f}",
            f"{b.latscope_mean_ms:.3f}",
            f"{b.mean_abs_error_ms:.3f}",
            f"{b.max_abs_error_ms:.3f}",
            f"{'[green]' if b.ok else '[red]'}{b.within}/{b.compared}[/]",
        )
    console.print(table)
    if check.proxy_added_ms is not None:
        console.print(f"The proxy added {check.proxy_added_ms:.1f} ms per request (true network).")
    if check.skew_applied_ms:
        console.print(
            f"Server clock skewed {check.skew_applied_ms:+.0f} ms; latscope estimated "
            f"{_ms(check.skew_estimate_ms)} ms"
        )
    if check.missing:
        console.print(f"[red]{len(check.missing)} requests have no attribution in latscope[/]")
    for trace_id, bucket, truth, got in check.worst if not check.ok else ():
        console.print(f"  {trace_id} {bucket}: truth {truth:.3f} ms, latscope {got:.3f} ms")
    console.print("check: " + ("[green]PASS[/]" if check.ok else "[red]FAIL[/]"))


def print_coldstart(console: Console, found: dict[str, Any]) -> None:
    warmup, warm = found["warmup"], found["warm"]
    console.print(
        f"\n[bold]Cold starts[/]: {found['appeared']} replicas appeared "
        f"({len(found['scale_ups'])} scale-ups); their {warmup['count']} warm-up requests took "
        f"{_ms(warmup['e2e_mean_ms'])} ms on average against {_ms(warm['e2e_mean_ms'])} ms warm "
        f"(+{_ms(found['extra_e2e_ms'])} ms, mostly [bold]{found['dominant']}[/])"
    )
    for event in found["scale_ups"]:
        console.print(
            f"  • {event['count']} replica(s) ({', '.join(event['replicas'])}), warm after "
            f"{event['warmup_s']:.1f} s"
        )


def print_cold_check(console: Console, run: DemoRun) -> None:
    c = run.cold_check
    assert c is not None
    console.print(
        f"Cold-start check: {c.replicas_found} of {c.replicas_started} replicas found; warm-up "
        f"requests {c.latscope_warmup} (truth: {c.truth_cold} served cold); extra "
        f"{_ms(c.latscope_extra_ms)} ms (truth {_ms(c.truth_extra_ms)} ms), mostly "
        f"{c.latscope_dominant} (truth {c.truth_dominant}): "
        + ("[green]PASS[/]" if c.ok else "[red]FAIL[/]")
    )


def runs_summary(answers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The mean run of latscope's answers (``/v1/traces/{trace_id}/run``): its e2e and where
    its critical path went (ms and shares), and how many calls a run made."""
    from latscope.demo.check import run_figures

    figures = [run_figures(a) for a in answers.values()]
    n = len(figures)
    e2e = sum(f["e2e"] for f in figures) / n
    means = {part: sum(f[part] for f in figures) / n for part in RUN_PARTS}
    llm = sum(means[f"llm.{b}"] for b in BUCKETS)
    return {
        "runs": n,
        "calls": sum(len(a["calls"]) for a in answers.values()),
        "e2e_mean_ms": e2e,
        "critical_path_mean_ms": {"llm": llm, **means},
        "shares": {"llm": llm / e2e if e2e else None,
                   **{p: means[p] / e2e if e2e else None for p in RUN_PARTS}},
    }  # fmt: skip


def print_runs(console: Console, run: DemoRun) -> None:
    summary = runs_summary(run.run_answers)
    means, shares = summary["critical_path_mean_ms"], summary["shares"]
    top = max(BUCKETS, key=lambda b: means[f"llm.{b}"])
    console.print(
        f"\n[bold]Agent runs[/]: {summary['runs']} runs, {summary['calls']} LLM calls; a run "
        f"takes {_ms(summary['e2e_mean_ms'])} ms on average, and along its critical path (what "
        f"the root waited on; parallel calls count once) LLM calls take {_ms(means['llm'])} ms "
        f"({_pct(shares['llm'])}, mostly [bold]{top}[/]), tool calls {_ms(means['tool'])} ms "
        f"({_pct(shares['tool'])}), the app's own code {_ms(means['app'])} ms "
        f"({_pct(shares['app'])})"
    )
    example = next(iter(run.run_answers))
    console.print(f"  one of them: latscope explain {example}")


def print_run_check(console: Console, run: DemoRun) -> None:
    check = run.run_check
    assert check is not None
    console.print(
        f"\n[bold]Check of the runs[/]: {check.compared} runs ({check.calls} calls, "
        f"{check.parallel_calls} of them in parallel groups); the critical path of each within "
        "max(1 ms, 2%) of the truth the agents measured, part by part"
    )
    table = Table(box=None, pad_edge=False)
    for col in ("critical path", "truth ms", "latscope ms", "mean err", "max err", "within"):
        table.add_column(col, justify="left" if col == "critical path" else "right")
    for p in check.parts:
        table.add_row(
            p.part,
            f"{p.truth_mean_ms:.3f}",
            f"{p.latscope_mean_ms:.3f}",
            f"{p.mean_abs_error_ms:.3f}",
            f"{p.max_abs_error_ms:.3f}",
            f"{'[green]' if p.ok else '[red]'}{p.within}/{p.compared}[/]",
        )
    console.print(table)
    console.print(
        f"Calls the root waited for whole: the same as the truth's in "
        f"{check.compared - len(check.path_mismatch)} of {check.compared} runs; the largest "
        f"piece of a parallel call cut off by a later sibling's start: "
        f"{check.partial_max_ms:.3f} ms"
    )
    if check.missing:
        console.print(f"[red]{len(check.missing)} runs have no complete run in latscope[/]")
    for trace_id, part, truth, got in check.worst if not check.ok else ():
        console.print(f"  {trace_id} {part}: truth {truth:.3f} ms, latscope {got:.3f} ms")
    console.print("run check: " + ("[green]PASS[/]" if check.ok else "[red]FAIL[/]"))
