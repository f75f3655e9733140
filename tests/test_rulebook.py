"""The rulebook's format: reading, checking (problems named by line), units, expressions, and
the printed rulebook reading back as the one in force."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latscope.attribution import rules
from latscope.attribution.model import SpanRecord
from latscope.attribution.rules import RulebookError, figure_ns, load, parse_expr, read_file
from latscope.attribution.rules.expr import evaluate, events, expr_type, holds, parse_cond
from latscope.cli import main
from latscope.storage import Store
from tests.attribution_support import MS, T0, TraceBuilder, sql_check
from tests.engine_traces import parse_rust_duration, rust_duration
from tests.hypothesis_support import examples

FASTGEN = Path(__file__).parent / "rules" / "fastgen.toml"


def _problems(text: str) -> list[str]:
    with pytest.raises(RulebookError) as err:
        read_file("r.toml", text=text)
    return err.value.problems


def test_the_shipped_rulebook_reads_and_prints_back_as_itself(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    book = load()
    assert [e.name for e in book.engines] == [
        "dynamo", "trtllm", "trtllm-disagg", "triton", "tgi", "sglang", "vllm"
    ]  # fmt: skip
    assert main(["rules"]) == 0
    printed = tmp_path / "book.toml"
    printed.write_text(capsys.readouterr().out)
    again = read_file(printed)
    assert [dataclasses.replace(e, origin="") for e in again] == [
        dataclasses.replace(e, origin="") for e in book.engines
    ]


def test_a_user_file_adds_before_and_replaces_in_place(tmp_path: Path) -> None:
    tgi = tmp_path / "tgi.toml"
    tgi.write_text(
        'rulebook = 1\n[[engine]]\nname = "tgi"\n[engine.request]\nname = "my_handler"\n'
        '[engine.stages.names]\ninfer = "decode"\n'
    )
    book = load([FASTGEN, tgi])
    names = [e.name for e in book.engines]
    assert names == [
        "fastgen", "dynamo", "trtllm", "trtllm-disagg", "triton", "tgi", "sglang", "vllm"
    ]  # fmt: skip
    assert book.engines[names.index("tgi")].names == ("my_handler",)
    assert book.engines[0].origin == str(FASTGEN)


def test_a_span_is_matched_by_the_rulebook_that_asks(tmp_path: Path) -> None:
    mine = tmp_path / "tgi.toml"
    mine.write_text(
        'rulebook = 1\n[[engine]]\nname = "tgi"\n[engine.request]\nname = "my_handler"\n'
        '[engine.stages.names]\ninfer = "decode"\n'
    )
    shipped, replaced = load(), load([mine])
    handler = SpanRecord("a1" * 8, "", "my_handler", "Server", "llm", T0, MS)
    # Each book's answer is kept on the span: asked again, and by turns, each gives its own.
    for _ in range(2):
        assert shipped.engine_of(handler) is None
        engine = replaced.engine_of(handler)
        assert engine is not None and engine.name == "tgi"
        assert shipped.system_of(handler) is None and replaced.system_of(handler) is None


def test_every_problem_of_a_file_is_named_by_its_line() -> None:
    text = FASTGEN.read_text()
    text = text.replace('unit = "ms" }\ncompute', 'unit = "msec" }\ncompute')
    text = text.replace('bucket = "prefill"', 'bucket = "prefil"')
    text = text.replace('to = "start + queue + compute"', 'to = "start + queue + compte"')
    text = text.replace('from = "start"\n', 'from = "queue"\n')
    text = text.replace("[engine.first_token]", "[engine.first_token]\nwhen = 1")
    lines = text.splitlines()
    problems = _problems(text)
    assert len(problems) == 5, problems
    for problem, needle in zip(
        problems, ['unit = "msec"', 'from = "queue"', '"prefil"', "compte", "when = 1"], strict=True
    ):
        number = int(problem.split(":")[1])
        assert needle in lines[number - 1], (problem, lines[number - 1])
        assert problem.startswith(f"r.toml:{number}: engine 'fastgen': ")
    assert "did you mean 'prefill'" in problems[2]
    assert "a duration where an instant is needed" in problems[1]
    assert "unknown key 'when'" in problems[4]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("rulebook = 2\n", "this latscope reads rulebook 1"),
        ("rulebook = 1\n[[engine]]\nname = 'x'\n", "[engine.request] is missing"),
        (
            "rulebook = 1\n[[engine]]\nname = 'x'\n[engine.request]\nname_regex = '('\n",
            "not a regular",
        ),
        ("rulebook = 1\n[[engine]\n", "not TOML"),
        ("rulebook = 1\n[[engine]]\nname = 'X y'\n", "must match"),
    ],
)
def test_a_broken_file_is_refused(text: str, says: str) -> None:
    assert any(says in p for p in _problems(text)), _problems(text)


def test_a_stage_name_means_one_bucket_in_every_engine(tmp_path: Path) -> None:
    other = tmp_path / "other.toml"
    other.write_text(
        'rulebook = 1\n[[engine]]\nname = "other"\n[engine.request]\nname = "x"\n'
        '[engine.stages.names]\ninfer = "prefill"\n'
    )
    with pytest.raises(RulebookError, match="stage 'infer' is 'decode'"):
        load([other])


def test_a_bad_rules_flag_stops_the_command_with_the_problems(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(FASTGEN.read_text().replace('unit = "ms"', 'unit = "sec"'))
    assert main(["rules", "--check", "--rules", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:15: engine 'fastgen': figure 'queue': unit 'sec'" in err
    assert main(["rules", "--check", "--rules", str(FASTGEN)]) == 0
    assert "fastgen" in capsys.readouterr().out


def test_expressions_parse_and_refuse_what_they_cannot_read() -> None:
    e = parse_expr("max0(event(first token) - (start + queue)) + 5")
    assert e.kind == "add" and e.args[0].kind == "max0"
    assert events(e) == {("first token", "first")}
    for bad in ("start +", "start ++ end", "max0(start", "start $", "event(X, middle)"):
        with pytest.raises(ValueError):
            parse_expr(bad)
    for bad in ("grandparent.event(X)", "sibling.start"):
        with pytest.raises(ValueError):
            expr_type(parse_expr(bad), {})


def test_points_on_the_parent_and_the_request_span_evaluate_and_compare() -> None:
    """A part reads its own, its parent's and its request span's points; an event's first or
    last time; a point of a span that is not there is absent, and so is a condition on it."""
    tb = TraceBuilder()
    ms = MS
    root = tb.server(
        0,
        100,
        name="InferRequest",
        events=(("R", T0 + 40 * ms), ("R", T0 + 70 * ms), ("R", T0 + 90 * ms)),
    )
    model = tb.server(10, 95, parent=root, name="m", events=(("QUEUE_START", T0 + 12 * ms),))
    compute = tb.server(20, 80, parent=model, name="compute")
    spans = {s.span_id: s for s in tb.spans}
    on, near = spans[compute], {"parent": spans[model], "request": spans[root]}
    assert evaluate(parse_expr("parent.event(QUEUE_START)"), on, {}, near) == T0 + 12 * ms
    assert (
        evaluate(parse_expr("request.event(R, last) - request.event(R)"), on, {}, near) == 50 * ms
    )
    assert evaluate(parse_expr("request.end - parent.start"), on, {}, near) == 90 * ms
    assert evaluate(parse_expr("parent.start"), on, {}, {"request": spans[root]}) is None
    assert holds(parse_cond("end < request.event(R, last)"), on, {}, near)
    assert not holds(parse_cond("end < request.event(R)"), on, {}, near)
    assert not holds(parse_cond("end < parent.event(NONE)"), on, {}, near)


@given(st.integers(min_value=0, max_value=10**13))
def test_rust_durations_read_exactly(ns: int) -> None:
    assert (
        figure_ns(rust_duration(ns), "rust_duration")
        == ns
        == parse_rust_duration(rust_duration(ns))
    )


@pytest.mark.parametrize(
    ("raw", "unit", "ns"),
    [
        ("1.5", "s", 1_500_000_000),
        ("12.25", "ms", 12_250_000),
        ("7", "us", 7_000),
        ("42", "ns", 42),
        ("1e999", "ms", 10**15),
        ("-3", "ms", -3_000_000),
        ("250µs", "rust_duration", 250_000),
        ("2.5μs", "rust_duration", 2_500),
        ("1.000000001s", "rust_duration", 1_000_000_001),
        ("12 ms", "rust_duration", None),
        ("1ms\n", "rust_duration", None),
        ("abc", "s", None),
        ("", "ms", None),
    ],
)
def test_figures_become_ns_by_their_unit(raw: str, unit: str, ns: int | None) -> None:
    assert figure_ns(raw, unit) == ns


UNIT_VALUES = st.one_of(
    st.from_regex(r"-?[0-9]{1,6}(\.[0-9]{1,10})?(s|ms|µs|μs|us|ns)", fullmatch=True),
    st.from_regex(r"[-+ 0-9.eE]{0,14}", fullmatch=True),
    st.sampled_from(["1.5s", "0ns", "61.000000001s", "1e999", "9999999999999999ms"]),
)


@pytest.mark.slow
@settings(max_examples=examples(4), deadline=None)
@given(st.lists(st.tuples(UNIT_VALUES, UNIT_VALUES), min_size=1, max_size=8))
def test_figures_read_the_same_in_sql_and_the_reference(store: Store, values: list) -> None:
    """A user engine with a figure in every unit: the SQL attributor reads each value as the
    reference does (the rows, phases and first token agree)."""
    unit_file = Path(__file__).parent / "rules" / "units.toml"
    shipped = rules.active()
    rules.install(load([unit_file]))
    try:
        traces = {}
        for i, (a, b) in enumerate(values):
            tb = TraceBuilder()
            client = tb.add("Client", 0, 900)
            tb.add("Internal", 100, 800, parent=client, attrs={
                "u.s": a, "u.ms": b, "u.us": a, "u.ns": b, "u.rust": a, "u.rust2": b,
            }, name="units.request")  # fmt: skip
            traces[f"u{i}"] = tb.spans
        sql_check(store, traces)
    finally:
        rules.install(shipped)


def test_every_attribute_the_shipped_rulebook_reads_is_stored_by_code() -> None:
    """The shipped rules read their attributes by code (``LatscopeRuleAttributes``, the newest
    DDL's list), not by name from every span's whole attribute map: a key a shipped rule adds
    takes the next code in a new DDL file (docs/attribution.md, "Adding an engine")."""
    from latscope.attribution.sql import KEYS
    from latscope.attribution.sql.engines import EngineSql

    assert set(EngineSql(load()).attributes()) <= set(KEYS.values())


def test_a_bad_part_is_refused_naming_its_lines(tmp_path: Path) -> None:
    path = tmp_path / "parts.toml"
    path.write_text(
        "rulebook = 1\n"
        "[[engine]]\n"
        'name = "srv"\n'
        "[engine.request]\n"
        'name = "Root"\n'
        "[[engine.phase]]\n"
        'bucket = "queue"\n'
        'from = "parent.start"\n'
        'to = "end"\n'
        "[engine.parts]\n"
        "depth = 2\n"
        "[[engine.part]]\n"
        'name = "step"\n'
        'when = "end"\n'
        "phases = [\n"
        '  { bucket = "decode", from = "sibling.event(X)", to = "request.event(X, last)" },\n'
        "]\n"
    )
    with pytest.raises(RulebookError) as caught:
        read_file(path)
    problems = {int(p.split(":")[1]): p for p in caught.value.problems}
    assert len(problems) == len(caught.value.problems) == 3
    assert "parent. and request. only in a part" in problems[8]
    assert "a comparison" in problems[14]
    assert "'sibling' is not one of parent, request" in problems[15]
