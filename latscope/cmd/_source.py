"""Where a query command gets its answers: a running API (``--url``) or the store itself.

Both return the same answer, as its model (``latscope.api.schemas``, named in ``ANSWERS``):
direct mode calls the functions the API serves, which build it; over the API its JSON is
validated into it. A command renders the model (``--json`` prints the JSON the API serves).
Errors become :class:`SourceError` with a sentence the user can act on.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

import httpx

from latscope.auth import TokenFileError, read_token_file
from latscope.storage import Store, StoreError

if TYPE_CHECKING:
    from latscope.api.schemas import Answer

A = TypeVar("A", bound="Answer")

#: query name -> (REST path, "module:function" answering it over a store).
QUERIES: dict[str, tuple[str, str]] = {
    "attribution": (
        "/v1/requests/{request_id}/attribution",
        "latscope.api.trace:request_attribution",
    ),
    "explain": ("/v1/requests/{request_id}", "latscope.api.trace:explain"),
    "trace": ("/v1/traces/{trace_id}", "latscope.api.trace:trace_explain"),
    "trace_requests": ("/v1/traces/{trace_id}/requests", "latscope.api.trace:trace_requests"),
    "run": ("/v1/traces/{trace_id}/run", "latscope.api.trace:trace_run"),
    "spans": ("/v1/traces/{trace_id}/spans", "latscope.api.trace:trace_spans"),
    "span": ("/v1/traces/{trace_id}/spans/{span_id}", "latscope.api.trace:stored_span"),
    "summary": ("/v1/attribution/summary", "latscope.api.queries:summary"),
    "tail": ("/v1/attribution/tail", "latscope.api.queries:tail"),
    "compare": ("/v1/attribution/compare", "latscope.api.queries:compare"),
    "diagnose": ("/v1/attribution/diagnose", "latscope.api.queries:diagnose"),
    "slo": ("/v1/slo", "latscope.api.queries:slo"),
    "gpu": ("/v1/gpu", "latscope.api.queries:gpu"),
    "services": ("/v1/services", "latscope.api.queries:services"),
    "requests": ("/v1/requests", "latscope.api.queries:slowest"),
    "timeseries": ("/v1/attribution/timeseries", "latscope.api.queries:timeseries"),
    "heatmap": ("/v1/attribution/heatmap", "latscope.api.queries:heatmap"),
    "why": ("/v1/attribution/why", "latscope.api.queries:why"),
    "coldstart": ("/v1/attribution/coldstart", "latscope.api.queries:coldstart"),
    "conversation": (
        "/v1/conversations/{conversation_id}",
        "latscope.api.conversations:conversation",
    ),
    "conversations": ("/v1/conversations", "latscope.api.conversations:conversations"),
}

#: query name -> the model of its answer in ``latscope.api.schemas``.
ANSWERS: dict[str, str] = {
    "attribution": "Attribution",
    "explain": "Explain",
    "trace": "TraceExplain",
    "trace_requests": "TraceRequests",
    "run": "Run",
    "spans": "TraceSpans",
    "span": "StoredSpan",
    "summary": "Summary",
    "tail": "Tail",
    "compare": "Compare",
    "diagnose": "Diagnosis",
    "slo": "Slo",
    "gpu": "Gpu",
    "services": "Services",
    "requests": "Slowest",
    "timeseries": "Timeseries",
    "heatmap": "Heatmap",
    "why": "Why",
    "coldstart": "ColdStart",
    "conversation": "Conversation",
    "conversations": "Conversations",
}

DEFAULT_TIMEOUT_S = 60.0

# httpx logs every request at INFO; a command's output is its answer, not a request log.
logging.getLogger("httpx").setLevel(logging.WARNING)


class SourceError(Exception):
    """A query could not be answered; the message says why and what to do. ``error`` is the
    API's error code when it gave one (e.g. ``several_requests``)."""

    def __init__(self, message: str, *, exit_code: int = 1, error: str | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.error = error


def default_url() -> str:
    url = os.environ.get("LATSCOPE_URL")
    if url:
        return url.rstrip("/")
    host = os.environ.get("LATSCOPE_HTTP", "127.0.0.1:8080")
    host = host.replace("0.0.0.0", "127.0.0.1")
    return f"http://{host}"


def add_source_arguments(parser: argparse.ArgumentParser, *, json_flag: bool = True) -> None:
    """``--url``, ``--store``, ``--token-file`` and ``--json``."""
    group = parser.add_argument_group("where to ask")
    where = group.add_mutually_exclusive_group()
    where.add_argument(
        "--url",
        help="a running latscope API [env LATSCOPE_URL, default http://127.0.0.1:8080]",
    )
    where.add_argument(
        "--store",
        metavar="DSN",
        help="read the store directly instead (chdb:///dir or http(s)://...); an embedded "
        "store must not be open in a running `latscope serve`",
    )
    group.add_argument(
        "--token-file", metavar="PATH", help="bearer token for the API [env LATSCOPE_TOKEN]"
    )
    group.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds to wait for an answer"
    )
    if json_flag:
        parser.add_argument("--json", action="store_true", help="print JSON (for scripts)")


def _token(args: argparse.Namespace) -> str:
    path = getattr(args, "token_file", None)
    if path:
        try:
            return read_token_file(path)
        except TokenFileError as exc:
            raise SourceError(str(exc)) from None
    return os.environ.get("LATSCOPE_TOKEN", "")


def _answer(name: str, body: Any) -> Answer:
    """``body`` (an answer's model, or its JSON from the API) as the model of query ``name``."""
    from pydantic import ValidationError

    from latscope.api import schemas

    model = getattr(schemas, ANSWERS[name])
    if isinstance(body, model):
        return body
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise SourceError(
            f"the API answered {name} in a shape this latscope does not know (another "
            f"version?): {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}"
        ) from None


def _clean(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if v is not None and v != ""}


class Source:
    """Answers queries by name (see ``QUERIES``)."""

    description = ""

    def query(self, name: str, **params: Any) -> Answer:
        """The answer to query ``name``, as its model (``ANSWERS``)."""
        raise NotImplementedError

    def ask(self, model: type[A], name: str, /, **params: Any) -> A:
        """``query``, typed as the model of its answer (which ``ANSWERS[name]`` names); the
        query's parameters may have any name (``model`` is a filter).

        >>> source.ask(Tail, "tail", since="1h").dominant  # doctest: +SKIP
        'queue'
        """
        answer = self.query(name, **params)
        if not isinstance(answer, model):
            raise TypeError(f"query {name} answers {type(answer).__name__}, not {model.__name__}")
        return answer

    def close(self) -> None:
        return None


class HttpSource(Source):
    def __init__(self, url: str, token: str = "", timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.description = self.url
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def query(self, name: str, **params: Any) -> Answer:
        template, _ = QUERIES[name]
        path_keys = {k for k in params if "{" + k + "}" in template}
        path = template.format(**{k: quote(str(params[k]), safe="") for k in path_keys})
        return _answer(
            name, self.get(path, **{k: v for k, v in params.items() if k not in path_keys})
        )

    def get(self, path: str, **params: Any) -> dict[str, Any]:
        """``GET path`` with the non-empty ``params``; the JSON answer or SourceError."""
        return decode(self.fetch(path, **params), self.url)

    def fetch(self, path: str, **params: Any) -> httpx.Response:
        """``GET path`` with the non-empty ``params``; the response, whatever its status, or
        SourceError when there is none."""
        try:
            return self.client.get(path, params=_clean(params))
        except httpx.ConnectError:
            raise SourceError(
                f"no API at {self.url} — start it with `latscope serve` (or `latscope api`), "
                "pass --url, or read a store directly with --store DSN"
            ) from None
        except httpx.TimeoutException:
            raise SourceError(f"the API at {self.url} did not answer in time (--timeout)") from None
        except httpx.HTTPError as exc:
            raise SourceError(f"talking to {self.url} failed: {exc}") from None

    def close(self) -> None:
        self.client.close()


def decode(response: httpx.Response, url: str) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code == 200 and isinstance(body, dict):
        return body
    if response.status_code == 401:
        raise SourceError(
            f"the API at {url} needs a token: pass --token-file PATH or set LATSCOPE_TOKEN"
        )
    if isinstance(body, dict) and "error" in body:
        detail = body.get("detail")
        if isinstance(detail, list):  # validation errors: one line per parameter
            detail = "; ".join(
                f"{'.'.join(str(p) for p in d.get('loc', [])[1:])}: {d.get('msg')}" for d in detail
            )
        raise SourceError(
            f"{detail} ({body['error']})",
            exit_code=2 if response.is_client_error else 1,
            error=str(body["error"]),
        )
    if response.status_code == 404:
        raise SourceError(f"{url} is not a latscope API (404 for {response.request.url.path})")
    raise SourceError(f"the API at {url} answered {response.status_code}")


class StoreSource(Source):
    def __init__(self, store: Store) -> None:
        self.store = store
        self.description = store.dsn

    def query(self, name: str, **params: Any) -> Answer:
        from latscope.api.errors import QueryError

        _, target = QUERIES[name]
        module, _, attr = target.partition(":")
        fn: Callable[..., Any] = getattr(importlib.import_module(module), attr)
        try:
            return _answer(name, fn(self.store, **_clean(params)))
        except QueryError as exc:
            detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
            raise SourceError(f"{detail} ({exc.error})", exit_code=2, error=exc.error) from None
        except StoreError as exc:
            raise SourceError(f"the store {self.store.dsn} failed the query: {exc}") from None

    def close(self) -> None:
        self.store.close()


def open_store(dsn: str) -> Store:
    try:
        store = Store.open(dsn)
        store.apply_schema()
        return store
    except StoreError as exc:
        hint = ""
        if dsn.startswith("chdb:"):
            hint = (
                " — an embedded store belongs to one process: if `latscope serve` runs on it, "
                "ask that instead with --url"
            )
        raise SourceError(f"cannot open store: {exc}{hint}") from None


@contextmanager
def open_source(args: argparse.Namespace) -> Iterator[Source]:
    """The source the flags name: ``--store`` (direct) or ``--url`` / the default API."""
    if getattr(args, "store", None):
        source: Source = StoreSource(open_store(args.store))
    else:
        source = HttpSource(
            args.url or default_url(), _token(args), getattr(args, "timeout", DEFAULT_TIMEOUT_S)
        )
    try:
        yield source
    finally:
        source.close()


def run_command(args: argparse.Namespace, body: Callable[[Source], int]) -> int:
    """Open the source, run ``body``, turn SourceError into a message and an exit code."""
    try:
        with open_source(args) as source:
            return body(source)
    except SourceError as exc:
        print(f"latscope: {exc}", file=sys.stderr)
        return exc.exit_code


def run_query(
    args: argparse.Namespace,
    doing: str,
    ask: Callable[[Source], A],
    render: Callable[[A], None],
) -> int:
    """A query command's whole ``main``: open the source the flags name (``--store`` or the API),
    ``ask`` it under a spinner saying ``doing``, print the answer as JSON (``--json``) or
    ``render`` it; a SourceError becomes one line on stderr and its exit code (1, or 2 for a
    request the API refused as unusable).

    >>> run_query(args, "diagnosing", lambda s: s.ask(Diagnosis, "diagnose"), render)
    ... # doctest: +SKIP
    """
    from latscope.cmd import _render as r

    def body(source: Source) -> int:
        with r.progress(doing):
            answer = ask(source)
        if args.json:
            r.print_json(answer.json_dict())
        else:
            render(answer)
        return 0

    return run_command(args, body)


#: The flags ``add_filter_arguments`` adds, named as the query parameters they fill.
FILTER_FLAGS = ("since", "until", "service", "model")


def filters(args: argparse.Namespace) -> dict[str, Any]:
    """The values of the flags ``add_filter_arguments`` added, as query parameters."""
    return {name: getattr(args, name) for name in FILTER_FLAGS if hasattr(args, name)}


def add_filter_arguments(parser: argparse.ArgumentParser, *, window: bool = True) -> None:
    """``--since``/``--until`` (RFC 3339 or 15m, 2h, 7d) and ``--service``/``--model``."""
    if window:
        parser.add_argument(
            "--since", default="1h", help="start: RFC 3339 or a span before now (default 1h)"
        )
        parser.add_argument("--until", default=None, help="end (default now)")
    parser.add_argument("--service", default=None, help="only this service")
    parser.add_argument("--model", default=None, help="only this model")
