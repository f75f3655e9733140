"""``latscope demo``: a simulated LLM server under load, and latscope finding where the time goes.

It starts ``latscope serve`` on an embedded store, the simulated OpenAI-compatible server (its
own process, its own SDK configuration and, with ``--clock-skew``, its own idea of the time), a
delaying proxy when the scenario has a slow network, and the load generator; then prints
latscope's report (summary, tail, diagnosis) and the web page's address. ``--check`` also
compares latscope's attribution of every request with the simulator's ground truth. The run
itself is ``latscope.demo.run``.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import signal
import tempfile
import threading
from pathlib import Path

import httpx
from rich.console import Console

from latscope.demo import processes, report, scenarios
from latscope.demo.run import DemoRun, Replicas, execute

HELP = "run a simulated LLM server under load and show where its time goes"
DEFAULT_SCENARIO = "overload"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scenario",
        default=DEFAULT_SCENARIO,
        choices=list(scenarios.SCENARIOS),
        help=f"what goes wrong (default {DEFAULT_SCENARIO}); --list describes each",
    )
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument(
        "--duration", type=float, default=30.0, metavar="S", help="seconds of load (default 30)"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="compare latscope's attribution of each request with the ground truth; exit 1 "
        "when a bucket is off by more than max(1 ms, 2%%)",
    )
    parser.add_argument(
        "--clock-skew",
        type=float,
        default=0.0,
        metavar="S",
        help="run the simulated server's clock S seconds ahead of the client's (negative: "
        "behind); latscope's attribution must not care",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the load (default 0)")
    parser.add_argument(
        "--store",
        metavar="DSN",
        help="keep the data in this store (default: a temporary embedded store, deleted at exit)",
    )
    parser.add_argument(
        "--http",
        default="127.0.0.1:0",
        metavar="HOST:PORT",
        help="latscope's HTTP address: REST API and web page (default: a free port)",
    )
    parser.add_argument(
        "--exit",
        action="store_true",
        help="stop once the report is printed (default: keep the web page up until Ctrl-C)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON to PATH")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    console = Console()
    # One line per HTTP call would drown the report.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.list:
        for s in scenarios.SCENARIOS.values():
            console.print(f"[bold]{s.name:<13}[/] {s.complaint}")
        return 0
    if args.duration <= 0:
        console.print("latscope demo: --duration must be > 0")
        return 2
    scenario = scenarios.get(args.scenario)
    tmp = None if args.store else tempfile.mkdtemp(prefix="latscope-demo-")
    store = args.store or f"chdb://{tmp}"
    children: list[processes.Child] = []
    replicas: Replicas | None = None
    try:
        console.print(
            f"[bold]latscope demo[/] · scenario [bold]{scenario.name}[/]: {scenario.complaint}"
        )
        console.print("starting latscope serve (embedded store) and the simulated LLM server…")
        # latscope's warm-up rule set to the simulator's cold period, so both count the same
        # requests as cold (the check compares them).
        cold = scenario.engine.cold_s
        rule = ("--warmup-requests", "0", "--warmup-s", repr(cold)) if cold else ()
        serve = processes.start_serve(store, args.http, "127.0.0.1:0", *rule)
        children.append(serve)
        otlp = f"http://{serve.found['grpc']}"
        replicas = Replicas(scenario, otlp, args.clock_skew)
        children.extend(replicas.start(scenario.replicas, warm=True))
        run = DemoRun(scenario, args.duration, args.clock_skew)
        run.web_url = serve.found["http"].rstrip("/") + "/"
        execute(
            run,
            serve.found["http"],
            replicas,
            otlp,
            seed=args.seed,
            console=console,
            progress=not args.no_progress,
            check=args.check,
        )
        for child in replicas.children:
            if child in children:
                children.remove(child)
        report.print_report(console, run, web_page=not args.exit)
        if args.json:
            Path(args.json).write_text(json.dumps(run.to_json(), indent=2))
        status = 0
        if args.check and (run.check is None or not run.check.ok):
            status = 1
        if args.check and run.cold_check is not None and not run.cold_check.ok:
            status = 1
        if args.check and run.scenario.agent and (run.run_check is None or not run.run_check.ok):
            status = 1
        if not args.exit:
            console.print("latscope keeps serving the page until Ctrl-C.")
            _wait_for_interrupt()
        return status
    except processes.ChildFailed as exc:
        console.print(f"latscope demo: {exc}")
        return 1
    except httpx.HTTPError as exc:
        # A child died or stopped answering mid-run: say which call failed, not a traceback.
        console.print(f"latscope demo: {type(exc).__name__}: {exc}")
        for child in children:
            if not child.alive():
                console.print(f"{child.name} exited with {child.proc.returncode}:\n{child.tail()}")
        return 1
    finally:
        if replicas is not None:
            replicas.stop()  # the ones a scale-up started too
        for child in reversed(children):
            child.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _wait_for_interrupt() -> None:
    done = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        while not done.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
