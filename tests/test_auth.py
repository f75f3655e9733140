"""The bearer-token rule every transport shares (latscope/auth.py), without a server."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from latscope.auth import TokenFileError, bearer_ok, metadata_authorization, read_token_file
from latscope.cmd._source import SourceError, _token
from latscope.config import ConfigError, Settings

TOKEN = "s3cret"


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        (f"Bearer {TOKEN}", True),
        (f"bearer {TOKEN}", True),  # the scheme is case-insensitive (RFC 9110 11.1)
        (f"Bearer  {TOKEN} ", True),
        (None, False),
        ("", False),
        ("Bearer", False),
        ("Bearer wrong", False),
        (f"Bearer {TOKEN}x", False),
        (f"Basic {TOKEN}", False),
        (TOKEN, False),
    ],
)
def test_bearer_ok(header: str | None, ok: bool) -> None:
    assert bearer_ok(header, TOKEN) is ok


def test_no_token_means_auth_off() -> None:
    assert bearer_ok(None, "") and bearer_ok("Bearer anything", "")


def test_metadata_authorization() -> None:
    assert metadata_authorization([("x-a", "1"), ("authorization", "Bearer t")]) == "Bearer t"
    assert metadata_authorization([("authorization", b"Bearer t")]) is None
    assert metadata_authorization(None) is None


def test_token_file_is_read_one_way_for_server_and_cli(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(f"  {TOKEN}\n")
    assert read_token_file(path) == TOKEN
    assert Settings.from_env({}, token_file=str(path)).token == TOKEN
    assert _token_of(str(path)) == TOKEN


@pytest.mark.parametrize(("content", "says"), [(None, "cannot read"), ("\n", "is empty")])
def test_token_file_errors_say_which_file(tmp_path: Path, content: str | None, says: str) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    for raises, call in (
        (TokenFileError, lambda: read_token_file(path)),
        (ConfigError, lambda: Settings.from_env({}, token_file=str(path))),
        (SourceError, lambda: _token_of(str(path))),
    ):
        where = re.escape(str(path))
        with pytest.raises(raises, match=f"^--token-file: ({where} {says}|{says} {where}: )"):
            call()


def _token_of(path: str) -> str:
    return _token(argparse.Namespace(token_file=path))
