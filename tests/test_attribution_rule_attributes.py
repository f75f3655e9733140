"""What ClickHouse computes for the rules as spans are stored: ``LatscopeRuleAttributes``
(deploy/clickhouse/007_rule_attributes.sql), the attributes the rules read, by code, and the span
facts (010_span_facts.sql), what the rules test on every span. Their codes are the rules' codes,
the facts are what the reference engine's parsers say, and spans stored before the columns
existed (parts without them) are attributed exactly as spans stored after them, before and after
the columns are materialized for them."""

from __future__ import annotations

import re

import pytest

from latscope.attribution.engine import first_chunk_event
from latscope.attribution.model import NUMBER, SpanRecord
from latscope.attribution.sql import CODES, FACTS, GPU, KEYS, LATENCY, PHASE_CODES
from latscope.attribution.statements import Statements
from latscope.semconv import GenAIEvents, LatscopeAttributes, Phase, SpanKind
from latscope.storage import SPANS_TABLE, Store, ddl_files
from latscope.tokens import parse_int_list
from tests.agent_traces import mixed_traces
from tests.attribution_support import check_stored, store_traces
from tests.serve_support import release_embedded_store

DDL = "007_rule_attributes.sql"
COLUMN = "LatscopeRuleAttributes"
FACTS_DDL = "010_span_facts.sql"
FACTS_COLUMNS = ("LatscopePhase", "LatscopeFacts", "LatscopeFirstToken")
FIGURES_DDL = "011_token_figures.sql"
CALLS_DDL = "014_calls_as_made.sql"
#: The latest list of codes (016 extends 014's with the shipped rulebook's keys).
ENGINES_DDL = "016_engine_rules.sql"
#: The columns 014 recomputes for the parts stored before it.
REWRITTEN = ("LatscopeRuleAttributes", "LatscopeFirstToken")


def _ddl(name: str = DDL) -> str:
    return next(f.sql for f in ddl_files() if f.name == name)


def _stored_codes(ddl: str) -> tuple[list[str], list[int]]:
    keys_list, codes_list = re.search(
        r"transform\(key, \[(.*?)\], \[(.*?)\], 0\)", ddl, re.S
    ).groups()  # type: ignore[union-attr]
    return re.findall(r"'([^']*)'", keys_list), [int(c) for c in re.findall(r"\d+", codes_list)]


def test_the_stored_codes_are_the_rules_codes() -> None:
    """The codes stored in every part are the latest DDL's (014 extends 007's list, 016 014's);
    the rules look values up by KEYS' codes. A change of KEYS' order would make every stored
    span read wrong, so it fails here; a code once stored keeps its key."""
    keys, codes = _stored_codes(_ddl(ENGINES_DDL))
    assert keys == list(KEYS.values())
    assert codes == [CODES[name] for name in KEYS]
    for earlier in (DDL, CALLS_DDL):
        first_keys, first_codes = _stored_codes(_ddl(earlier))
        assert (keys[: len(first_keys)], codes[: len(first_codes)]) == (first_keys, first_codes)


def _columns_of_parts(store: Store) -> set[str]:
    """The columns the spans table's active parts hold on disk."""
    rows = store.query_rows(
        "SELECT DISTINCT column FROM system.parts_columns WHERE database = currentDatabase() "
        "AND table = {t:String} AND active",
        {"t": SPANS_TABLE},
    )
    return {r[0] for r in rows}


def test_the_statements_that_look_for_calls_left_read_no_attribute_map() -> None:
    # SpanAttributes holds every attribute, prompts and completions included: the statement
    # that counts a batch's traces left with a possible call read it for every span, and with
    # 32 kB of attributes a span the embedded engine refused it at its limit for batches of
    # 12,000-46,000 traces (bench.memory.run --spans 470-500 --senders 96). With the shipped
    # rulebook every attribute the rules read has a code, so none reads it.
    for early, versioned in ((False, True), (True, False), (True, True)):
        sql = Statements(SPANS_TABLE, "latscope_attribution", (0, 1), early=early,
                         versioned=versioned)  # fmt: skip
        for statement in (sql.count_left, sql.count_left_superset, sql.insert):
            assert statement is None or "SpanAttributes" not in statement


def test_the_stored_facts_are_the_rules_facts() -> None:
    """010's phase codes, attribute codes and fact bits are those the rules read
    (``PHASE_CODES``, ``CODES``, ``FACTS``): the stored values never change meaning."""
    ddl = _ddl(FACTS_DDL)
    phases, codes = re.search(
        r"LatscopeRuleAttributes\[(\d+)\],\s*\[(.*?)\], \[(.*?)\], 0\)", ddl, re.S
    ).groups()[1:]  # type: ignore[union-attr]
    assert re.search(rf"LatscopeRuleAttributes\[{CODES['PHASE']}\],\s*\[", ddl)
    names = re.findall(r"'([^']*)'", phases)
    assert dict(zip(names, map(int, codes.split(", ")), strict=True)) == PHASE_CODES
    assert list(PHASE_CODES) == list(Phase.ALL)
    latency = [CODES[n] for n in LATENCY]
    gpu = [CODES[n] for n in GPU]
    # Consecutive codes: the DDL tests them as ranges.
    assert latency == list(range(latency[0], latency[-1] + 1))
    assert gpu == list(range(gpu[0], gpu[-1] + 1))
    assert f"hasAny(mapKeys(LatscopeRuleAttributes), {latency})" in ddl
    assert f"2 * arrayExists((code, value) -> code BETWEEN {latency[0]} AND {latency[-1]}" in ddl
    assert f"4 * (match(LatscopeRuleAttributes[{CODES['OFFSETS']}]," in ddl
    assert f"8 * arrayExists((code, value) -> code BETWEEN {gpu[0]} AND {gpu[-1]}" in ddl
    assert FACTS == {"LATENCY_KEY": 1, "LATENCY_NUMBER": 2, "OFFSETS": 4, "GPU_NUMBER": 8}


#: Values a span's attributes may hold, valid and not, for the facts' checks.
_NUMBERS = ["0.25", "3", "-2", "1e3", "2.5E-3", "", ".5", "1.", "inf", "nan", "x", "0x10", " 1"]
_OFFSETS = [
    "[0, 1500, 3100]",
    "[7]",
    "[-5,0]",
    "[\n 1,\t2\r]",
    "[999999999999999]",
    "[1000000000000000]",  # 16 digits: beyond the parser's 15
    "[]",
    "[ ]",
    "[1.5]",
    "[01]",
    "[1,]",
    " [1]",
    "[1] ",
    "1, 2",
    "",
]


def _fact_spans() -> list[SpanRecord]:
    """Spans whose attributes cross the values above with the keys the facts test."""
    latency_keys = list(LATENCY.values())
    gpu_keys = list(GPU.values())
    phases = [*Phase.ALL, "Decode", "other", ""]
    spans = []
    for i in range(max(len(_NUMBERS) * 2, len(_OFFSETS) * 2, len(phases))):
        attributes = {
            LatscopeAttributes.PHASE: phases[i % len(phases)],
            LatscopeAttributes.TOKEN_OFFSETS_US: _OFFSETS[i % len(_OFFSETS)],
        }
        if i % 3 != 2:  # some spans without a latency or GPU key
            attributes[latency_keys[i % len(latency_keys)]] = _NUMBERS[i % len(_NUMBERS)]
        if i % 4 != 3:
            attributes[gpu_keys[i % len(gpu_keys)]] = _NUMBERS[(i * 5) % len(_NUMBERS)]
        if i % 5 == 4:
            attributes.pop(LatscopeAttributes.PHASE)
            attributes.pop(LatscopeAttributes.TOKEN_OFFSETS_US)
        kind = (SpanKind.CLIENT, SpanKind.SERVER, "SPAN_KIND_CLIENT", SpanKind.INTERNAL)[i % 4]
        names = GenAIEvents.FIRST_CHUNK
        events = (
            (
                (names[i % len(names)], 9_000 + i),
                ("other", 10),
                (names[(i // 3) % len(names)], 5_000 + i),
            )
            if i % 3 == 0
            else ()
        )
        spans.append(
            SpanRecord(f"{i:016x}", "", "s", kind, "svc", 1_000_000 + i, 10, attributes, events)
        )
    return spans


def _facts(span: SpanRecord) -> tuple[int, int, str]:
    """What 010 stores for ``span``, by the reference engine's parsers."""
    attrs = span.attributes
    latency = [attrs[k] for k in LATENCY.values() if k in attrs]
    gpu = [attrs[k] for k in GPU.values() if k in attrs]
    facts = (
        FACTS["LATENCY_KEY"] * bool(latency)
        + FACTS["LATENCY_NUMBER"] * any(NUMBER.fullmatch(v) for v in latency)
        + FACTS["OFFSETS"] * bool(parse_int_list(attrs.get(LatscopeAttributes.TOKEN_OFFSETS_US)))
        + FACTS["GPU_NUMBER"] * any(NUMBER.fullmatch(v) for v in gpu)
    )
    first = first_chunk_event(span)
    return (
        PHASE_CODES.get(attrs.get(LatscopeAttributes.PHASE, ""), 0),
        facts,
        "" if first is None else str(first),
    )


def test_stored_facts_are_what_the_reference_parsers_say(store: Store) -> None:
    """Each span's phase code, facts and first-token time, as ClickHouse stored them, are what
    the reference engine reads from the same attributes and events."""
    spans = _fact_spans()
    stored = store_traces(store, {"facts": spans})
    (trace_id,) = stored
    rows = store.query_rows(
        f"SELECT SpanId, {', '.join(FACTS_COLUMNS)} FROM {SPANS_TABLE} "
        "WHERE TraceId = {t:String} ORDER BY SpanId",
        {"t": trace_id},
    )
    assert [r[0] for r in rows] == [s.span_id for s in spans]
    got = {r[0]: (int(r[1]), int(r[2]), r[3]) for r in rows}
    assert got == {s.span_id: _facts(s) for s in spans}
    # Every fact and every phase code occurs, set and not set.
    for bit in FACTS.values():
        assert {bool(f & bit) for _, f, _ in got.values()} == {True, False}
    assert {p for p, _, _ in got.values()} == {0, *PHASE_CODES.values()}
    assert any(t for _, _, t in got.values()) and not all(t for _, _, t in got.values())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("ddl", "columns"),
    [
        (DDL, (COLUMN,)),
        (FACTS_DDL, FACTS_COLUMNS),
        (FIGURES_DDL, ("LatscopeTokenFigures",)),
        (CALLS_DDL, REWRITTEN),
    ],
)
def test_spans_stored_before_the_column_are_attributed_as_after(
    tmp_path_factory: pytest.TempPathFactory, ddl: str, columns: tuple[str, ...]
) -> None:
    release_embedded_store()  # chDB opens one data directory per process
    store = Store.open(f"chdb://{tmp_path_factory.mktemp('rule-attributes') / 'store'}")
    version = int(ddl[:3])
    try:
        store.apply_schema(upto=version - 1)  # the schema as it was before the column
        traces = mixed_traces([0], runs=3)
        # As written then: without the token figures, which no schema before 011 holds.
        before = store_traces(store, traces, figures=False)
        assert store.apply_schema() >= version
        # 014 rewrites two of the columns in the parts stored before it (its MATERIALIZE
        # statements, here waited for); the others are read by computing them from the columns
        # they are made of.
        for column in REWRITTEN:
            store.command(
                f"ALTER TABLE {SPANS_TABLE} MATERIALIZE COLUMN {column} SETTINGS mutations_sync = 2"
            )
        assert not (set(columns) - set(REWRITTEN)) & _columns_of_parts(store)
        after = store_traces(store, traces)
        check_stored(store, before)
        check_stored(store, after)

        for column in columns:
            store.command(
                f"ALTER TABLE {SPANS_TABLE} MATERIALIZE COLUMN {column} SETTINGS mutations_sync = 2"
            )
        assert set(columns) <= _columns_of_parts(store)
        check_stored(store, before)
    finally:
        store.close()
