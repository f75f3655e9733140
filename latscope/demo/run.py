"""One demo run (``latscope demo``, ``latscope/cmd/demo.py``): the simulated server's replicas,
the load, the truth the simulators kept, and latscope's answers fetched and checked against it.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import httpx
from rich.console import Console

from latscope import sdk
from latscope.demo import processes, report
from latscope.demo.agent import AgentGenerator, AgentRun, agent_tracing, run_truth
from latscope.demo.check import (
    CheckResult,
    ColdCheck,
    RunCheck,
    check_cold,
    compare,
    compare_runs,
)
from latscope.demo.load import LoadGenerator, RequestResult
from latscope.demo.proxy import DelayProxy
from latscope.demo.scenarios import Scenario
from latscope.demo.truth import truth_buckets
from latscope.tokens import DEFAULT_STALL_NS

#: Service names of the two sides, as they appear in latscope.
SERVER_SERVICE = "llm-server"
CLIENT_SERVICE = "demo-client"


@dataclass
class DemoRun:
    """Everything one run produced; ``to_json`` is what ``--json`` writes."""

    scenario: Scenario
    duration_s: float
    clock_skew_s: float
    results: list[RequestResult] = field(default_factory=list)
    truth: dict[str, dict[str, Any]] = field(default_factory=dict)
    proxy_ns: dict[str, int] = field(default_factory=dict)
    attributions: dict[str, dict[str, Any]] = field(default_factory=dict)
    summary: dict[str, Any] | None = None
    tail: dict[str, Any] | None = None
    diagnosis: dict[str, Any] | None = None
    report_error: str | None = None
    check: CheckResult | None = None
    web_url: str = ""
    server_stats: dict[str, Any] = field(default_factory=dict)
    #: Scenarios with a scale-up: latscope's cold-start answer and its check against the truth.
    coldstart: dict[str, Any] | None = None
    cold_check: ColdCheck | None = None
    #: The agent scenario: the runs as the agents lived them, latscope's answer for each
    #: (``/v1/traces/{trace_id}/run``, by trace id) and the check of those against the truth.
    agent_runs: list[AgentRun] = field(default_factory=list)
    run_answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    run_check: RunCheck | None = None

    @property
    def ok_runs(self) -> list[AgentRun]:
        return [r for r in self.agent_runs if r.ok]

    @property
    def ok_results(self) -> list[RequestResult]:
        return [r for r in self.results if r.ok and r.trace_id]

    def expectation_met(self) -> bool | None:
        """Whether the diagnosis says what the scenario expects (None without a diagnosis)."""
        if self.diagnosis is None:
            return None
        ids = {v.get("id") for v in self.diagnosis.get("verdicts") or ()}
        expect = self.scenario.expect
        return (
            self.diagnosis.get("dominant") == expect.dominant
            and all(v in ids for v in expect.verdicts)
            and not any(v in ids for v in expect.absent)
        )

    def truth_stalls(self) -> dict[str, int]:
        """Streams the simulator itself saw stall (a gap between two tokens above serve's
        default stall threshold) out of those it served: a busy machine can stall a scenario
        designed not to."""
        gaps = [t.get("max_token_gap_ns", 0) for t in self.truth.values()]
        return {
            "requests": len(gaps),
            "stalled": sum(1 for gap in gaps if gap > DEFAULT_STALL_NS),
            "threshold_ms": DEFAULT_STALL_NS // 1_000_000,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario.to_json(),
            "duration_s": self.duration_s,
            "clock_skew_s": self.clock_skew_s,
            "requests": len(self.results),
            "errors": sum(1 for r in self.results if not r.ok),
            "server": self.server_stats,
            "summary": self.summary,
            "tail": self.tail,
            "diagnosis": self.diagnosis,
            "report_error": self.report_error,
            "expectation_met": self.expectation_met(),
            "truth_stalls": self.truth_stalls(),
            "check": None if self.check is None else self.check.to_json(),
            "coldstart": self.coldstart,
            "cold_check": None if self.cold_check is None else self.cold_check.to_json(),
            "agent_runs": len(self.agent_runs) if self.scenario.agent else None,
            "runs": report.runs_summary(self.run_answers) if self.run_answers else None,
            "run_check": None if self.run_check is None else self.run_check.to_json(),
            "web": self.web_url,
        }


class Replicas:
    """The simulated server's replicas: each its own process with its own service.instance.id;
    ``urls`` is what the load generator calls round-robin, and grows at a scale-up."""

    def __init__(self, scenario: Scenario, otlp: str, clock_skew_s: float) -> None:
        self.scenario = scenario
        self.otlp = otlp
        self.clock_skew_s = clock_skew_s
        self.children: list[processes.Child] = []
        self.urls: list[str] = []

    def start(self, count: int, *, warm: bool = False) -> list[processes.Child]:
        """Start ``count`` more replicas at once; each joins ``urls`` as soon as it answers.
        ``warm``: the fleet the run starts with, serving before it (no cold period)."""
        first = len(self.children) + 1
        # Only a scenario with replicas names them (the others run one, as before).
        names = [
            f"{SERVER_SERVICE}-{first + i}" if self.scenario.scale_to else "" for i in range(count)
        ]

        def one(name: str) -> processes.Child:
            child = processes.start_simulator(
                self.scenario.name, self.otlp, self.clock_skew_s, instance_id=name, warm=warm
            )
            self.children.append(child)
            self.urls.append(child.found["url"])
            return child

        with ThreadPoolExecutor(max(1, count)) as pool:
            return list(pool.map(one, names))

    def stop(self) -> None:
        for child in self.children:
            child.stop()


def execute(
    run: DemoRun,
    api: str,
    replicas: Replicas,
    otlp: str,
    *,
    seed: int = 0,
    console: Console | None = None,
    progress: bool = True,
    check: bool = False,
) -> None:
    """Run the load (scaling up on the way if the scenario says so), collect the truth, stop
    the simulators, wait for latscope, fill ``run``; with ``check``, also grade latscope's
    attribution of each request (and its cold starts) against the truth."""
    sdk.configure(service_name=CLIENT_SERVICE, endpoint=otlp, insecure=True, gpu=False)
    # The agent app's own spans (its runs' roots and tool calls) go through a tracer of its own.
    tracing = agent_tracing(otlp, CLIENT_SERVICE) if run.scenario.agent else None
    started = time.time()
    try:
        asyncio.run(_drive(run, replicas, seed, console, progress, tracing))
    finally:
        if tracing is not None:
            tracing.shutdown()  # flushes the roots and tool spans
        sdk.shutdown()  # flushes the client spans
    stats = {}
    for child in replicas.children:
        with httpx.Client(base_url=child.found["url"], timeout=30) as sim:
            truth = sim.get("/demo/truth").raise_for_status().json()
            stats[child.name] = sim.get("/demo/stats").raise_for_status().json()
        run.truth.update({t["request_id"]: t for t in truth["requests"]})
    run.server_stats = next(iter(stats.values())) if len(stats) == 1 else stats
    replicas.stop()  # their SDKs flush the server spans on the way out
    with httpx.Client(base_url=api, timeout=60) as client:
        # Requests are stamped with the client's start time, on this host's clock.
        window = {
            "since": _rfc3339(started),
            "until": _rfc3339(time.time() + 1),
            "service": SERVER_SERVICE,
        }
        # The page opens on the run's window (its address carries it, as an alert's link does).
        run.web_url += f"#since={window['since']}&until={window['until']}"
        # Once the attributor has settled every request, all their spans are in the store.
        fetch_report(client, run, window, expected=len(run.ok_results))
        if run.scenario.scale_to:
            r = client.get("/v1/attribution/coldstart", params=window)
            if r.status_code == 200:
                run.coldstart = r.json()
            else:
                run.report_error = f"GET /v1/attribution/coldstart answered {r.status_code}"
        if run.scenario.agent:
            run.run_answers = fetch_runs(client, run.ok_runs)
        if check:
            run.attributions = fetch_attributions(client, [r.latscope_id for r in run.ok_results])
    if check:
        run.check = build_check(run)
        if run.scenario.agent:
            run.run_check = build_run_check(run)
        if run.coldstart is not None:
            # The fleet the run started with was serving before it: only the scale-up's
            # replicas are new.
            started = len(replicas.children) - run.scenario.replicas
            run.cold_check = check_cold(run.coldstart, _cold_truth(run), started)


def _cold_truth(run: DemoRun) -> list[tuple[bool, dict[str, tuple[int, int]]]]:
    """(served cold, true buckets) of each finished request, from the simulators' records."""
    out = []
    for result in run.ok_results:
        server = run.truth.get(result.request_id)
        if server is None or server.get("server_ns") is None:
            continue
        out.append((bool(server.get("cold")), truth_buckets(result.e2e_ns, server)))
    return out


async def _drive(
    run: DemoRun,
    replicas: Replicas,
    seed: int,
    console: Console | None,
    progress: bool,
    tracing: Any = None,
) -> None:
    url = replicas.urls[0]
    proxy = None
    if run.scenario.network_delay_ms > 0:
        parts = urlsplit(url)
        upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        proxy = DelayProxy(upstream, run.scenario.network_delay_ms / 1000)
        host, port = await proxy.start()
        url = f"http://{host}:{port}"
    gen: LoadGenerator
    if tracing is not None:
        tracer = tracing.get_tracer("latscope.demo.agent")
        gen = AgentGenerator(
            url, run.scenario, run.duration_s, seed=seed, console=console, progress=progress,
            tracer=tracer,
        )  # fmt: skip
    else:
        gen = LoadGenerator(
            url, run.scenario, run.duration_s, seed=seed, console=console, progress=progress
        )
    if run.scenario.scale_to and proxy is None:
        gen.urls = replicas.urls  # shared: replicas started later join the round-robin
    scaling = None
    if run.scenario.scale_to > run.scenario.replicas:
        scaling = asyncio.create_task(_scale_up(run, replicas))
    try:
        run.results = await gen.run()
        if isinstance(gen, AgentGenerator):
            run.agent_runs = gen.runs
    finally:
        if scaling is not None:
            await scaling
        if proxy is not None:
            await proxy.stop()
            run.proxy_ns = {rid: rec.added_ns for rid, rec in proxy.records.items()}


async def _scale_up(run: DemoRun, replicas: Replicas) -> None:
    """At ``scale_at`` of the run, start the new replicas (each joins as soon as it answers)."""
    await asyncio.sleep(run.duration_s * run.scenario.scale_at)
    count = run.scenario.scale_to - run.scenario.replicas
    await asyncio.to_thread(replicas.start, count)


def fetch_attributions(
    client: httpx.Client, trace_ids: list[str | None], *, timeout_s: float = 60.0
) -> dict[str, dict[str, Any]]:
    """latscope's attribution of each request (by request id, or trace id), asking again for
    those not complete yet (no server span, or no client span so no network figure) until
    ``timeout_s``."""
    ids = [t for t in trace_ids if t]
    found: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s

    def fetch(trace_id: str) -> tuple[str, dict[str, Any] | None]:
        try:
            r = client.get(f"/v1/requests/{trace_id}/attribution")
        except httpx.HTTPError:
            return trace_id, None
        if r.status_code != 200:
            return trace_id, None
        body = r.json()
        if (body.get("buckets_ms") or {}).get("network") is None:
            return trace_id, None
        return trace_id, body

    with ThreadPoolExecutor(8) as pool:
        while True:
            pending = [t for t in ids if t not in found]
            for trace_id, body in pool.map(fetch, pending):
                if body is not None:
                    found[trace_id] = body
            if len(found) == len(ids) or time.monotonic() >= deadline:
                return found
            time.sleep(0.5)


def fetch_report(
    client: httpx.Client,
    run: DemoRun,
    window: dict[str, str],
    *,
    expected: int,
    timeout_s: float = 90.0,
) -> None:
    """Summary, tail and diagnosis over the run, once latscope has attributed every request."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = client.get("/v1/attribution/summary", params=window)
        if r.status_code != 200:
            run.report_error = f"GET /v1/attribution/summary answered {r.status_code}: {r.text}"
            return
        run.summary = r.json()
        if run.summary.get("count", 0) >= expected or time.monotonic() >= deadline:
            break
        time.sleep(1.0)
    if run.summary.get("count", 0) < expected:
        run.report_error = (
            f"latscope attributed {run.summary.get('count', 0)} of {expected} requests "
            f"within {timeout_s:.0f} s"
        )
    for name in ("tail", "diagnose"):
        r = client.get(f"/v1/attribution/{name}", params=window)
        if r.status_code == 200:
            setattr(run, "diagnosis" if name == "diagnose" else name, r.json())
        else:
            run.report_error = f"GET /v1/attribution/{name} answered {r.status_code}: {r.text}"


def fetch_runs(
    client: httpx.Client, runs: list[AgentRun], *, timeout_s: float = 60.0
) -> dict[str, dict[str, Any]]:
    """latscope's answer for each agent run (``/v1/traces/{trace_id}/run``), asking again until
    it has the run's root, all of its calls and their client spans, or ``timeout_s``."""
    found: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s

    def complete(run: AgentRun, body: dict[str, Any]) -> bool:
        calls = body.get("calls") or []
        return (
            body.get("root", {}).get("span_id") == run.root_span_id
            and len(calls) == len(run.calls)
            and all(c["attribution"]["buckets_ms"]["network"] is not None for c in calls)
        )

    def fetch(run: AgentRun) -> tuple[str, dict[str, Any] | None]:
        try:
            r = client.get(f"/v1/traces/{run.trace_id}/run")
        except httpx.HTTPError:
            return run.trace_id, None
        if r.status_code != 200 or not complete(run, r.json()):
            return run.trace_id, None
        return run.trace_id, r.json()

    with ThreadPoolExecutor(8) as pool:
        while True:
            pending = [r for r in runs if r.trace_id not in found]
            for trace_id, body in pool.map(fetch, pending):
                if body is not None:
                    found[trace_id] = body
            if len(found) == len(runs) or time.monotonic() >= deadline:
                return found
            time.sleep(0.5)


def build_run_check(run: DemoRun) -> RunCheck:
    """Each finished agent run's true critical path against latscope's run answer."""
    pairs, missing = [], []
    parallel, partial_max = 0, 0
    for agent_run in run.ok_runs:
        answer = run.run_answers.get(agent_run.trace_id)
        buckets = {}
        for result in agent_run.calls:
            server = run.truth.get(result.request_id)
            if server is None or server.get("server_ns") is None:
                break
            buckets[result.latscope_id or ""] = truth_buckets(result.e2e_ns, server)
        if answer is None or len(buckets) < len(agent_run.calls):
            missing.append(agent_run.trace_id)
            continue
        truth = run_truth(agent_run, buckets)
        parallel += len(agent_run.calls) - 2  # all but the plan and the final call
        partial_max = max(partial_max, truth.partial_max_ns)
        pairs.append((agent_run.trace_id, truth.parts(), answer, truth.calls_on_path))
    return compare_runs(pairs, missing=missing, parallel_calls=parallel, partial_max_ns=partial_max)


def build_check(run: DemoRun) -> CheckResult:
    """Pair each finished request's truth with latscope's attribution of it."""
    pairs, missing, proxy = [], [], []
    for result in run.ok_results:
        server = run.truth.get(result.request_id)
        attributed = run.attributions.get(result.latscope_id or "")
        if server is None or server.get("server_ns") is None or attributed is None:
            missing.append(result.latscope_id or result.request_id)
            continue
        pairs.append((result.latscope_id or "", truth_buckets(result.e2e_ns, server), attributed))
        if result.request_id in run.proxy_ns:
            proxy.append(run.proxy_ns[result.request_id])
    return compare(pairs, missing=missing, skew_applied_s=run.clock_skew_s, proxy_added_ns=proxy)


def _rfc3339(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
