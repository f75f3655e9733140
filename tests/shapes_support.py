"""Every trace shape the tests hold the attribution to, under each kind of rulebook: the upstream
clients' (``upstream_traces``), the serving engines' (``engine_traces``) and agent runs
(``agent_traces``), under the shipped rulebook and under a user's rule file (fastgen's, with its
own request)."""

from __future__ import annotations

from collections.abc import Iterator

from latscope.attribution import rules
from tests.agent_traces import agent_run
from tests.engine_traces import ENGINE_BUILDERS
from tests.test_engine_rules import FASTGEN_RULES, fastgen_request
from tests.upstream_traces import BUILDERS, Built


def every_shape() -> list[Built]:
    """Each upstream client's and serving engine's shape, and six agent runs."""
    shapes = [build(3) for _, build in BUILDERS] + [build(3) for _, build in ENGINE_BUILDERS]
    return shapes + [agent_run(seed).built for seed in range(6)]


def shapes_by_rulebook() -> Iterator[list[Built]]:
    """``every_shape()`` with the shipped rulebook installed, then with fastgen's rule file
    installed and fastgen's request added; the shipped rulebook installed again after, or when
    closed (``contextlib.closing``: a test that fails in between leaves the generator open)."""
    shipped = rules.active()
    try:
        for book in (shipped, rules.load([FASTGEN_RULES])):
            rules.install(book)
            yield [*every_shape(), fastgen_request(3)[0]]
    finally:
        rules.install(shipped)
