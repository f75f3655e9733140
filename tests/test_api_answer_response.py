"""How an answer is sent (``latscope.api.routes.params.AnswerResponse``), through a real HTTP
server: a large answer that no asker shares is gzip-compressed as it goes, piece by piece."""

from __future__ import annotations

import gzip
import random

import httpx
from fastapi import FastAPI, Response

from latscope.api.routes.params import GZIP_PIECE, served
from latscope.api.schemas import Health
from tests.sdk_support import run_app


def test_a_large_answer_is_compressed_as_it_goes() -> None:
    """Compressed, the body is sent in pieces with no length (chunked), and inflates to the JSON
    the client without gzip gets whole, with its length."""
    words = [f"w{i}" for i in range(256)]
    text = " ".join(random.Random(1).choices(words, k=3 * GZIP_PIECE // 4))
    answer = Health(status=text)
    app = FastAPI()

    @app.get("/big")
    def big() -> Response:
        return served(answer)

    with run_app(app) as url:
        with httpx.stream("GET", f"{url}/big", headers={"Accept-Encoding": "identity"}) as r:
            plain = r.read()
            assert int(r.headers["content-length"]) == len(plain)
        assert plain == answer.model_dump_json().encode()
        for _ in range(2):  # not shared: compressed again for every asker
            with httpx.stream("GET", f"{url}/big", headers={"Accept-Encoding": "gzip"}) as r:
                assert r.headers["content-encoding"] == "gzip"
                assert "content-length" not in r.headers
                assert r.headers["transfer-encoding"] == "chunked"
                pieces = list(r.iter_raw())
            assert len(pieces) > 1
            packed = b"".join(pieces)
            assert gzip.decompress(packed) == plain and len(packed) < len(plain) / 2
