"""Token offsets as the rules read them (``tokens.parse_int_list``): exactly what the pattern the
SQL attributor and the collector's stored figures use (``tokens.INT_ARRAY``) accepts, read the same,
whatever a client wrote."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from latscope.tokens import INT_ARRAY, parse_int_list
from tests.hypothesis_support import examples


def _by_pattern(raw: str) -> list[int]:
    """The reference: the pattern, then JSON."""
    if not raw or not INT_ARRAY.fullmatch(raw):
        return []
    return [int(v) for v in json.loads(raw)]


_JSON_WS = st.sampled_from(["", " ", "\t", "\n", "\r", "  \n"])
_OTHER_WS = st.sampled_from(["\x0b", "\x0c", "\xa0", "\u2003"])
_INTEGER = st.one_of(
    st.integers(-(10**15) + 1, 10**15 - 1),
    st.sampled_from([10**15, -(10**15), 10**15 - 1, 0, -0, 2**63, -(2**64)]),
).map(str)
# fmt: off
_ODD = ["01", "+1", "1.0", "1.", "1e3", "1E-2", "-", "true", "null", '"1"', "[1]",
        "[]", "NaN", "Infinity", "-Infinity", "0x10", "１"]
# fmt: on
_ELEMENT = st.one_of(
    _INTEGER,
    _INTEGER.map(lambda s: "-0" if s == "0" else s),
    st.sampled_from(_ODD),
)


@st.composite
def _arrays(draw: st.DrawFn) -> str:
    ws = draw(st.one_of(_JSON_WS, _OTHER_WS) if draw(st.booleans()) else _JSON_WS)
    items = draw(st.lists(_ELEMENT, max_size=8))
    sep = draw(st.sampled_from([",", " ,", ", ", ",,", ";"]))
    body = "[" + ws + sep.join(items) + ws + "]"
    return (
        draw(st.sampled_from(["", " ", "\n", "x"]))
        + body
        + draw(st.sampled_from(["", "", " ", "\n", "]", "[2]"]))
    )


@settings(max_examples=examples(400))
@given(st.one_of(_arrays(), st.text(max_size=40)))
def test_offsets_are_read_as_the_pattern_reads_them(raw: str) -> None:
    assert parse_int_list(raw) == _by_pattern(raw)


def test_offsets_the_pattern_refuses_are_refused() -> None:
    for raw in ("[1,2", "[1 2]", "[01]", "[1.5]", "[1e3]", "[true]", "[[1]]", "[1000000000000000]",
                " [1]", "[1]\n", "[\x0b1]", "[" * 5000 + "]" * 5000, "[NaN]", '["1"]'):  # fmt: skip
        assert parse_int_list(raw) == [] == _by_pattern(raw), raw
    assert parse_int_list("[ -0 ,\t999999999999999\r\n]") == [0, 999_999_999_999_999]
    assert parse_int_list("[]") == []
