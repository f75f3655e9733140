"""The answers' public face, the SQL text renderer, the one ``group_by`` rule (the domain, the REST
API's functions and the CLI's direct mode agree) and the diagnosis rulebook's table in
docs/attribution.md held to the code."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest

from latscope import sqltext
from latscope.api import queries
from latscope.api.errors import InvalidParameter
from latscope.attribution import aggregates as ag
from latscope.sqltext import SqlTextError, render
from latscope.storage import Store

DOCS = Path(__file__).resolve().parents[1] / "docs" / "attribution.md"
H = 3600 * 10**9
#: An hour of the shared store no other module writes to: the group_by checks need no rows.
T0 = 1_690_000_000 * 10**9 // H * H

EXPECTED = {
    "BUCKET_LEVELS",
    "CAUSES",
    "E2E_LEVELS",
    "GROUP_BY_COLUMNS",
    "MAX_EXAMPLES",
    "MAX_GROUPS",
    "MAX_SERIES",
    "MAX_SLOWEST",
    "MAX_VALUES",
    "STREAM_LEVELS",
    "AggregateError",
    "AnswerError",
    "ColdStartError",
    "DimensionError",
    "GroupByError",
    "Objective",
    "Selection",
    "TimeseriesError",
    "WarmupRule",
    "check_group_by",
    "choose_step",
    "coldstart",
    "compare",
    "concentration",
    "diagnose",
    "gpu_by_phase",
    "heatmap",
    "services",
    "slo",
    "slo_buckets",
    "slowest",
    "standing",
    "summary",
    "tail",
    "timeseries",
    "why",
}


def test_the_public_face_is_a_short_explicit_list() -> None:
    assert set(ag.__all__) == EXPECTED
    assert len(ag.__all__) == len(set(ag.__all__))
    for name in ag.__all__:
        assert getattr(ag, name) is not None
    # The face re-exports; the code lives in one module per question.
    assert ag.summary.__module__ == "latscope.attribution.answers.summary"
    assert ag.why.__module__ == "latscope.attribution.answers.dimensions"


# -- SQL text ---------------------------------------------------------------------------------


def test_render_fills_named_fragments_and_leaves_parameters_alone() -> None:
    sql = render(
        "SELECT $GROUP AS grp FROM ($SOURCES)\n-- a comment line\nWHERE Model = {model:String}\n",
        {"GROUP": "Route", "SOURCES": "SELECT 1", "UNUSED": "x"},
    )
    assert sql == "SELECT Route AS grp FROM (SELECT 1)\nWHERE Model = {model:String}\n"
    # A rendered fragment is not scanned again.
    assert render("$A", {"A": "$B"}) == "$B"
    assert sqltext.names("SELECT $A, $F($B) FROM ($SOURCES)") == {"A", "B", "F", "SOURCES"}


def test_render_refuses_unknown_names_and_values_that_are_not_text() -> None:
    with pytest.raises(SqlTextError, match=r"unknown SQL placeholder \$GROUP"):
        render("SELECT $GROUP", {"GRP": "Route"})
    with pytest.raises(SqlTextError, match=r"unknown SQL macro \$NUM"):
        render("SELECT $NUM(x)", {"NUM": "1"})
    with pytest.raises(SqlTextError, match="query parameter"):
        render("LIMIT $LIMIT", {"LIMIT": 10})  # type: ignore[dict-item]
    # ClickHouse's own parameters and lower-case dollars are not placeholders.
    assert render("x = {v:String} AND y = '$abc'", {}) == "x = {v:String} AND y = '$abc'"


def test_macros_apply_to_rendered_arguments() -> None:
    macros = {"TWICE": lambda x: f"2 * ({x})", "PAIR": lambda a, b: f"tuple({a}, {b})"}
    sql = render("$PAIR($TWICE($COL), f(a, [b, c]))", {"COL": "QueueNs"}, macros)
    assert sql == "tuple(2 * (QueueNs), f(a, [b, c]))"


def test_no_answer_fills_a_template_by_replace() -> None:
    """Every variable part of the answers' SQL goes through the renderer: no ``{name}`` template
    filled with ``str.replace`` is left (``{name:Type}`` parameters are ClickHouse's)."""
    root = Path(__file__).resolve().parents[1]
    files = [*sorted((root / "attribution" / "answers").glob("*.py")), root / "latscope" / "api"]
    found = []
    for path in files:
        for source in [path] if path.is_file() else sorted(path.glob("*.py")):
            for i, line in enumerate(source.read_text().splitlines(), 1):
                if re.search(r"\.replace\(\s*[\"']\{", line):
                    found.append(f"{source.name}:{i}: {line.strip()}")
    assert found == []


# -- group_by: one rule ----------------------------------------------------------------------

GROUP_BY_CASES = [
    ("model", True),
    ("status", True),
    ("resource.k8s.pod.name", True),
    ("resource.cloud/zone-1_a", True),
    ("k8s.pod.name", False),  # a resource attribute is named resource.<key>
    ("resource.", False),
    ("resource.a b", False),
    ("resource.key\n", False),
    ("resource." + "k" * 129, False),
    ("1;DROP TABLE x", False),
    ("colour", False),
]


def _outcome(fn: Any, *args: Any, **kwargs: Any) -> str:
    try:
        fn(*args, **kwargs)
    except (ag.GroupByError, InvalidParameter) as exc:
        return getattr(exc, "error", "invalid_group_by")
    return "ok"


@pytest.mark.parametrize(("group_by", "valid"), GROUP_BY_CASES)
def test_group_by_is_one_rule_for_the_domain_the_api_and_the_cli(
    store: Store, group_by: str, valid: bool
) -> None:
    want = "ok" if valid else "invalid_group_by"
    window = {"since_ns": T0, "until_ns": T0 + H}
    texts = {"since": "2023-07-22T04:00:00Z", "until": "2023-07-22T05:00:00Z"}
    assert _outcome(ag.check_group_by, group_by) == want
    assert _outcome(ag.summary, store, **window, group_by=group_by) == want
    assert _outcome(ag.summary, store, **window, group_by=group_by, exact=True) == want
    assert _outcome(ag.timeseries, store, **window, group_by=group_by) == want
    # REST, gRPC and the CLI's direct mode call these.
    assert _outcome(queries.summary, store, **texts, group_by=group_by) == want
    assert _outcome(queries.timeseries, store, **texts, group_by=group_by) == want
    if not valid:
        with pytest.raises(ag.GroupByError, match=re.escape(f"group_by {group_by!r}")):
            ag.check_group_by(group_by)


# -- the diagnosis rulebook -------------------------------------------------------------------

#: Every named threshold of the diagnosis, the cold-start rule, ``where`` and the SLO alerts.
RULEBOOK = [
    "tail.MEDIAN_BAND",
    "diagnose.TINY_PROMPT_TOKENS",
    "diagnose.TINY_OUTSIDE_SHARE_MIN",
    "diagnose.TINY_SLOW_FACTOR",
    "diagnose.PREFILL_CORR_MIN",
    "diagnose.PREFILL_TTFT_SHARE_MIN",
    "diagnose.DECODE_STALL_SHARE",
    "diagnose.PEAK_MIN_MINUTES",
    "diagnose.PEAK_LOAD_CORR_MIN",
    "diagnose.PEAK_P95_FACTOR",
    "diagnose.PEAK_SCORE_WEIGHT",
    "coldstart.VERDICT_MIN_REQUESTS",
    "coldstart.VERDICT_MIN_FACTOR",
    "coldstart.WarmupRule.warmup_requests",
    "coldstart.WarmupRule.warmup_s",
    "coldstart.WarmupRule.lookback_s",
    "coldstart.INITIAL_FLEET_FACTOR",
    "coldstart.LOOKBACK_GRACE_S",
    "coldstart.SCALE_UP_GAP_S",
    "dimensions.CONCENTRATION_PERCENTILE",
    "dimensions.CONCENTRATION_MIN",
    "dimensions.SINCE_FRACTION",
    "slo.FAST_BURN",
    "slo.SLOW_BURN",
    "slo.TICKET_BURN",
    "slo.BURN_WINDOWS_S",
]


def _value(dotted: str) -> Any:
    module, *attrs = dotted.split(".")
    value: Any = importlib.import_module(f"latscope.attribution.answers.{module}")
    for attr in attrs:
        value = getattr(value, attr)
    return value


def _shown(value: Any) -> str:
    """A value as the table writes it."""
    if isinstance(value, tuple):
        return ", ".join(map(_shown, value))
    if isinstance(value, dict):
        return ", ".join(f"{k} = {_shown(v)}" for k, v in value.items())
    return repr(value)


def _table() -> dict[str, str]:
    text = DOCS.read_text()
    section = text.split("## The diagnosis rulebook", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[1].startswith("`"):
            rows[cells[1].strip("`")] = cells[2]
    return rows


def test_the_rulebook_table_in_the_docs_is_the_code() -> None:
    table = _table()
    assert sorted(table) == sorted(RULEBOOK)
    for name in RULEBOOK:
        assert table[name] == _shown(_value(name)), name
    # Every threshold the diagnosis module names is in the table.
    diagnose = importlib.import_module("latscope.attribution.answers.diagnose")
    named = {f"diagnose.{n}" for n in diagnose.__all__ if n.isupper() and n != "CAUSES"}
    assert named <= set(RULEBOOK)
