"""What the REST API adds on top of the aggregate queries it serves.

    .venv/bin/python -m bench.api.run [--rows 1000000] [--repeat 7]

Loads ``--rows`` synthetic attributed requests over one day into a fresh embedded store, then
times, best of ``--repeat``:

* baseline: each aggregate function called in-process on the store (what direct mode does);
* API: the same question over HTTP from a running ``latscope serve`` on the same store
  (routing, validation, JSON, response-model checks and the loopback round trip).

Both run on this machine in this run; the ratio API / direct is the figure to compare.
An embedded store belongs to one process at a time, so the direct timings run in a child
process before the server starts.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

DAY_NS = 86_400 * 10**9
#: (name, REST path, REST params, aggregate function, its keyword arguments besides the window)
QUESTIONS = [
    ("summary", "/v1/attribution/summary", {}, "summary", {}),
    ("summary by model", "/v1/attribution/summary", {"group_by": "model"}, "summary",
     {"group_by": "model"}),
    ("tail p99", "/v1/attribution/tail", {}, "tail", {}),
    ("slowest 20", "/v1/requests", {"limit": 20}, "slowest", {"limit": 20}),
]  # fmt: skip

CHILD = """
import json, sys, time
from latscope.attribution import aggregates as ag
from latscope.storage import Store
from bench.query.generate import generate
dsn, rows, t0, repeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
questions = json.loads(sys.argv[5])
store = Store.open(dsn)
store.apply_schema()
generate(store, rows=rows, t0_ns=t0, span_s=86_400)
out = {}
for name, fn, kwargs in questions:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        getattr(ag, fn)(store, since_ns=t0, until_ns=t0 + 86_400 * 10**9, **kwargs)
        best = min(best, time.perf_counter() - t)
    out[name] = best
print(json.dumps(out))
store.close()
"""


def best_http(client: httpx.Client, path: str, params: dict, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        response = client.get(path, params=params)
        best = min(best, time.perf_counter() - t)
        response.raise_for_status()
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="latscope-bench-api-"))
    dsn = f"chdb://{root / 'store'}"
    t0 = time.time_ns() - 2 * DAY_NS  # a whole day, well in the past
    direct_questions = [(n, fn, kw) for n, _, _, fn, kw in QUESTIONS]
    try:
        start = time.perf_counter()
        child = subprocess.run(
            [sys.executable, "-c", CHILD, dsn, str(args.rows), str(t0), str(args.repeat),
             json.dumps(direct_questions)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        direct = json.loads(child.stdout.strip().splitlines()[-1])
        print(f"loaded {args.rows} requests and timed direct calls in "
              f"{time.perf_counter() - start:.1f} s")  # fmt: skip
        proc = subprocess.Popen(
            [sys.executable, "-m", "latscope.cli", "serve", "--store", dsn,
             "--http", "127.0.0.1:0", "--otlp-grpc", "127.0.0.1:0",
             "--max-span-age-s", "0", "--max-span-future-s", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        assert proc.stdout is not None
        url = None
        for line in proc.stdout:
            if m := re.search(r"HTTP\s+(http://\S+)", line):
                url = m.group(1)
                break
        assert url, "latscope serve did not start"
        window = {
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0 / 1e9)),
            "until": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0 / 1e9 + 86_400)),
        }
        with httpx.Client(base_url=url, timeout=120) as client:
            slowest = client.get("/v1/requests", params={**window, "limit": 1}).json()
            trace = slowest["requests"][0]["trace_id"]
            print(f"{'question':<18}{'direct ms':>12}{'API ms':>12}{'API/direct':>12}")
            for name, path, params, _, _ in QUESTIONS:
                api = best_http(client, path, {**window, **params}, args.repeat)
                print(f"{name:<18}{direct[name] * 1e3:>12.1f}{api * 1e3:>12.1f}"
                      f"{api / direct[name]:>12.2f}")  # fmt: skip
            # No direct twin: a request's attribution is computed from its spans on the fly;
            # the synthetic rows have none, so this times the 404 path (validation + lookup).
            miss = best_http_status(client, f"/v1/requests/{trace}/attribution", args.repeat)
            print(f"{'unknown trace 404':<18}{'':>12}{miss * 1e3:>12.1f}")
            # The floor: an answer that touches neither store nor validation.
            floor = best_http_status(client, "/healthz", args.repeat)
            print(f"{'/healthz':<18}{'':>12}{floor * 1e3:>12.1f}")
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def best_http_status(client: httpx.Client, path: str, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        client.get(path)
        best = min(best, time.perf_counter() - t)
    return best


if __name__ == "__main__":
    main()
