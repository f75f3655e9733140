"""The bearer token: read from a file one way, checked one way on every transport.

With a token set, the REST API (``/v1``), the gRPC query service and both OTLP ingest paths
(gRPC and HTTP) need ``authorization: Bearer <token>``; each transport answers a missing or wrong
token with its own status (HTTP 401 with ``WWW-Authenticate: Bearer``, gRPC ``UNAUTHENTICATED``)
and the same sentence, :data:`UNAUTHORIZED`::

    if not bearer_ok(request.headers.get("authorization"), settings.token):
        raise ApiError(401, "unauthorized", UNAUTHORIZED)
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "UNAUTHORIZED",
    "TokenFileError",
    "bearer_ok",
    "metadata_authorization",
    "read_token_file",
]

#: What every transport tells a caller without the right token. HTTP header names are
#: case-insensitive and gRPC metadata keys lower-case, so the lower-case spelling fits both.
UNAUTHORIZED = "send 'authorization: Bearer <token>'"


class TokenFileError(ValueError):
    """``--token-file`` names a file that cannot be read or holds no token."""


def read_token_file(path: str | Path) -> str:
    """The token in ``path``, without surrounding whitespace (an editor's trailing newline).

    >>> read_token_file("/run/secrets/latscope-token")  # doctest: +SKIP
    's3cret'
    """
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise TokenFileError(f"--token-file: cannot read {path}: {exc.strerror}") from None
    if not token:
        raise TokenFileError(f"--token-file: {path} is empty")
    return token


def bearer_ok(authorization: str | None, token: str) -> bool:
    """Whether an ``authorization`` header or metadata value carries ``token``; always true when
    ``token`` is empty (auth off). The comparison takes the same time whatever the value, so the
    token cannot be guessed byte by byte from response times."""
    if not token:
        return True
    scheme, _, given = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), token.encode()
    )


def metadata_authorization(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The ``authorization`` value of a gRPC call's metadata (``invocation_metadata()``); None
    when absent (or binary, which no bearer token is)."""
    value = dict(metadata or ()).get("authorization")
    return value if isinstance(value, str) else None
