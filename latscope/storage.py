"""The one seam between latscope and ClickHouse.

A DSN picks where the data lives: ``chdb:///dir`` (embedded ClickHouse in this process, the
default) or ``http(s)://user:pass@host:8123/db`` (a ClickHouse server or cluster). Both go
through the same clickhouse-connect client, so every query runs the same on either.

The schema lives in ``deploy/clickhouse/NNN_*.sql`` (packaged as ``latscope.ddl``) and is applied
in file order; the highest applied number is recorded in ``latscope_schema_version``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import queue
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import clickhouse_connect
import pyarrow as pa
import pyarrow.compute as pc

log = logging.getLogger(__name__)

DEFAULT_STORE = "chdb:///./latscope-data"

#: Longest a query or command may run before ClickHouse stops it (``max_execution_time``): a
#: runaway query must not hold a server's threads, or an embedded store's, for ever.
DEFAULT_QUERY_TIMEOUT_S = 60.0
#: The HTTP client waits this much longer than the server-side limit, so the server's own
#: TIMEOUT_EXCEEDED error (which says what happened) arrives before the socket gives up.
_CLIENT_TIMEOUT_MARGIN_S = 10.0
#: Connection handles an embedded store opens for queries and commands, beside the one that
#: inserts: the API, the attributor and the rollup builder query at once; more would only
#: share the same cores.
QUERY_HANDLES = 4
#: The Linux nice value of background work (``Store.background``), and the capability the engine
#: needs to set it on its threads (and latscope to set them back).
BACKGROUND_NICE = 19
CAP_SYS_NICE = 23

SPANS_TABLE = "otel_traces"
ATTRIBUTION_TABLE = "latscope_attribution"
METRICS_TABLE = "latscope_metrics"
SCHEMA_VERSION_TABLE = "latscope_schema_version"
#: Resource attributes by id (deploy/clickhouse/012_resource_ids.sql).
RESOURCES_TABLE = "latscope_resources"
#: The collector writes a resource's row again at least this often while it stores its spans, so
#: a row's Timestamp is never older than this before the ingest time of a span that names it.
RESOURCE_REFRESH_S = 600

#: The embedded engine's share of latscope's one memory setting (``--memory-limit-bytes``, the
#: bytes Exports may hold): ClickHouse's server-wide limit (``max_server_memory_usage``) is this
#: many times it. Everything the engine allocates counts: inserts, merges, queries, caches. An
#: insert, merge or query that would pass it fails with MEMORY_LIMIT_EXCEEDED (the collector
#: spools and retries, merges are retried, the attributor cuts its batch), and sorts and
#: aggregations spill to disk at half of it (ClickHouse's ``max_bytes_ratio_before_external_*``).
ENGINE_MEMORY_SHARE = 3
#: Of the engine's limit, what its caches may keep: marks, skipping-index marks, the query
#: condition cache and compiled expressions (ClickHouse sizes each at 0.1-5 GiB by default, for a
#: server with the machine to itself). Data blocks are not cached (``uncompressed_cache_size`` 0).
_CACHE_SHARES = {
    "mark_cache_size": 16,
    "index_mark_cache_size": 32,
    "primary_index_cache_size": 32,
    "query_condition_cache_size": 32,
    "compiled_expression_cache_size": 32,
}
#: A query of the engine runs on a thread for each this share of its limit that is free (at most
#: ``max_threads``, a thread a core). ClickHouse's own minimum, 1 GiB of free memory a thread
#: (``max_threads_min_free_memory_per_thread``), would run every query on one thread under the
#: limit of 768 MiB the default memory setting gives (docs/benchmarks.md, "Query threads").
QUERY_THREAD_SHARE = 8
_FREE_PER_THREAD = "max_threads_min_free_memory_per_thread"


def engine_settings(memory_limit_bytes: int) -> dict[str, int]:
    """The embedded ClickHouse's server settings for latscope's memory setting.

    Merges: one at a time (a pool of one thread, and no second merge interleaved on it). Each
    merge holds read buffers for every part it takes for as long as it runs, and the spans table
    merges ten parts at a time (deploy/clickhouse/018_spans_merge_width.sql): two such merges of
    spans carrying prompts took the engine past its limit. Queries: a thread for each
    ``QUERY_THREAD_SHARE`` of the limit that is free, so they use the cores while the engine has
    memory to spare, and one thread as it fills.

    >>> settings = engine_settings(256 * 1024**2)
    >>> settings["max_server_memory_usage"] // 1024**2, settings[_FREE_PER_THREAD] // 1024**2
    (768, 96)
    """
    server = ENGINE_MEMORY_SHARE * memory_limit_bytes
    return {
        "max_server_memory_usage": server,
        "uncompressed_cache_size": 0,
        "index_uncompressed_cache_size": 0,
        **{name: server // share for name, share in _CACHE_SHARES.items()},
        "background_merges_mutations_concurrency_ratio": 1,
        "background_pool_size": 1,
        _FREE_PER_THREAD: server // QUERY_THREAD_SHARE,
    }


_DDL_FILE = re.compile(r"^(\d{3})_[a-z0-9_]+\.sql$")
#: Attribute column types latscope reads: a map of strings (keys may be LowCardinality).
_STRING_MAP = re.compile(r"^Map\((LowCardinality\()?String\)?, String\)$")


class StoreError(Exception):
    """The store could not be opened or a statement failed; the message says which and why."""


class StoreUnavailable(StoreError):
    """The store did not answer (server down, network error); the operation may be retried."""


class StoreOutOfMemory(StoreError):
    """ClickHouse refused the statement for its memory limit (MEMORY_LIMIT_EXCEEDED): the same
    statement may pass once inserts, merges or other statements free it; one that needs more
    than the limit (the attributor's SQL over a very wide trace) never does."""


class StoreResultTooLarge(StoreError):
    """ClickHouse refused a query whose rows passed the ``max_result_bytes`` it was sent with
    (TOO_MANY_ROWS_OR_BYTES, ``result_overflow_mode = 'throw'``)."""


@dataclass(frozen=True)
class DDLFile:
    version: int
    name: str
    sql: str

    def statements(self) -> list[str]:
        """The file's statements, split on ``;`` at line ends, comments dropped."""
        body = "\n".join(
            line for line in self.sql.splitlines() if not line.lstrip().startswith("--")
        )
        return [s.strip() for s in re.split(r";\s*(?:\n|$)", body) if s.strip()]


def ddl_files() -> list[DDLFile]:
    """The single-node schema, in the order it is applied."""
    files = []
    for entry in resources.files("latscope.ddl").iterdir():
        match = _DDL_FILE.match(entry.name)
        if match:
            files.append(DDLFile(int(match.group(1)), entry.name, entry.read_text()))
    return sorted(files, key=lambda f: f.version)


def _embedded_path(dsn: str) -> str:
    # chdb:///abs/dir and chdb:///./rel/dir (a relative path after the third slash) both work;
    # the directory is created by chDB on first use.
    rest = dsn[len("chdb://") :]
    path = rest[1:] if rest.startswith("/./") or rest == "/." else rest
    return str(Path(path or ".").expanduser().resolve())


class Store:
    """A ClickHouse database reached through clickhouse-connect.

    Writes are idempotent per deduplication token and return only once the rows are durable in
    ClickHouse (the insert has been acknowledged), so a caller may retry a failed write with the
    same token and apply backpressure while it waits. Every query and command runs under
    ``max_execution_time`` (``query_timeout_s``); inserts do not (a part half-written is worse
    than a slow one, and the journal bounds their size).

    The client is shared between threads, and calls run concurrently: the embedded client is
    safe to share, and clickhouse-connect's HTTP client is thread-safe without a session (each
    call takes a connection from its pool), so a slow rollup build or query never holds up a span
    insert. Only a client pinned to a ClickHouse session (a ``session_id`` in the DSN), which
    the server refuses to use from two requests at once, gets a lock.

    >>> store = Store.open("chdb:///tmp/latscope-doc")  # doctest: +SKIP
    >>> store.apply_schema()  # doctest: +SKIP
    """

    def __init__(
        self,
        client: Any,
        dsn: str,
        *,
        query_timeout_s: float = DEFAULT_QUERY_TIMEOUT_S,
        connect: Callable[[], Any] | None = None,
    ) -> None:
        self.client = client
        self.dsn = dsn
        self.embedded = dsn.startswith("chdb:")
        self.query_timeout_s = query_timeout_s
        # Whole seconds, at least 1: ClickHouse reads 0 as "no limit".
        self._limits = {"max_execution_time": max(1, round(query_timeout_s))}
        self._lock: threading.RLock | None = threading.RLock() if _has_session(client) else None
        # The embedded engine: clickhouse-connect serialises the calls of one chDB client (one
        # lock per connection handle), so a slow query there held up every insert behind it.
        # Inserts keep ``client``; queries and commands take one of a few handles of their own
        # (``connect`` opens one on the same engine), each with the time limit SET once (chDB
        # applies per-call settings as three extra statements around every call).
        self._connect = connect
        # Inserts into the embedded engine: chDB's own handle, which reads an Arrow table in
        # place (``_EmbeddedInserts``); a server's go through ``client``.
        self._inserts = _EmbeddedInserts(_embedded_path(dsn)) if self.embedded else None
        self._idle: queue.LifoQueue[Any] = queue.LifoQueue()
        self._handles: list[Any] = []
        self._pool_lock = threading.Lock()
        #: Background work at low priority (``background``): only in an embedded engine, and
        #: only with CAP_SYS_NICE, which ClickHouse needs to apply ``os_thread_priority`` and
        #: this process to set its threads' priorities back.
        self.background_priority = self.embedded and connect is not None and has_cap_sys_nice()
        self._local = threading.local()
        self._background_idle: queue.LifoQueue[Any] = queue.LifoQueue()
        self._background_handles: list[Any] = []

    @property
    def locked(self) -> bool:
        """Whether calls are serialised (only a client bound to a ClickHouse session is)."""
        return self._lock is not None

    @property
    def safe_dsn(self) -> str:
        """The DSN as it may be shown: in logs, answers and metrics (password redacted)."""
        return redact_dsn(self.dsn)

    def __repr__(self) -> str:
        return f"Store({self.safe_dsn!r})"

    @classmethod
    def open(
        cls,
        dsn: str = DEFAULT_STORE,
        *,
        query_timeout_s: float = DEFAULT_QUERY_TIMEOUT_S,
        memory_limit_bytes: int | None = None,
        **kwargs: Any,
    ) -> Store:
        """Open a store from a DSN: ``chdb:///dir`` or ``http(s)://user:pass@host:port/db``.

        ``memory_limit_bytes``: latscope's memory setting; an embedded engine started here takes
        its own limits from it (``engine_settings``). A server's limits are its own.
        """
        scheme = urlsplit(dsn).scheme
        connect = None
        try:
            if scheme == "chdb":
                path = _embedded_path(dsn)
                Path(path).mkdir(parents=True, exist_ok=True)
                dsn = f"chdb://{path}"
                if memory_limit_bytes is not None:
                    # Server settings reach the engine as options of the connection that starts
                    # it; a later handle passing the same ones changes nothing.
                    kwargs["chdb_options"] = engine_settings(memory_limit_bytes)
                client = clickhouse_connect.get_client(dsn=dsn, **kwargs)
                # More handles on the same engine (chDB allows any number in one process).
                connect = functools.partial(clickhouse_connect.get_client, dsn=dsn, **kwargs)
            elif scheme in ("http", "https"):
                target, named = _named_parameters(dsn)
                kwargs = {**named, **kwargs}
                kwargs.setdefault("connect_timeout", 5)
                timeout = query_timeout_s + _CLIENT_TIMEOUT_MARGIN_S
                kwargs.setdefault("send_receive_timeout", timeout)
                # No session: a session pins every query to it, and ClickHouse refuses two
                # concurrent requests in one session, which would serialise all the traffic.
                kwargs.setdefault("autogenerate_session_id", False)
                client = clickhouse_connect.get_client(dsn=target, **kwargs)
            else:
                raise StoreError(
                    f"unsupported store DSN {redact_dsn(dsn)!r}: use chdb:///path/to/dir for the "
                    "embedded store or http(s)://user:pass@host:8123/db for a ClickHouse server"
                )
        except StoreError:
            raise
        except Exception as exc:
            message = _scrub(f"cannot open store {redact_dsn(dsn)}: {exc}", dsn)
            raise StoreUnavailable(message) from None
        return cls(client, dsn, query_timeout_s=query_timeout_s, connect=connect)

    @contextlib.contextmanager
    def background(self) -> Iterator[None]:
        """The queries and commands this thread makes inside run as background work: in an
        embedded engine, on handles that ask for ``os_thread_priority = BACKGROUND_NICE``, so each
        engine thread working on one, the caller's included, runs at Linux nice 19 while it does
        and ingest's inserts and the API's queries take the cores first. A thread the engine
        starts meanwhile (its pools grow on demand) inherits nice 19 from the thread that starts
        it and would keep it, to run later inserts at low priority: after each call every thread
        of the process left at nice 19 is set back (``_restore_priorities``). Elsewhere (a
        server, or a process without CAP_SYS_NICE) it changes nothing: a server's threads are
        its own to set back."""
        was = getattr(self._local, "background", False)
        self._local.background = True
        try:
            yield
        finally:
            self._local.background = was

    # -- schema --------------------------------------------------------------------------------

    def schema_version(self) -> int:
        self.command(
            f"CREATE TABLE IF NOT EXISTS {SCHEMA_VERSION_TABLE} "
            "(Version UInt32, Name String, AppliedAt DateTime DEFAULT now()) "
            "ENGINE = MergeTree ORDER BY Version"
        )
        rows = self.query_rows(f"SELECT max(Version) FROM {SCHEMA_VERSION_TABLE}")
        return int(rows[0][0] or 0)

    def apply_schema(self, upto: int | None = None) -> int:
        """Apply every DDL file newer than the recorded version (up to version ``upto``, when
        given: a store as that version left it); returns the version now in force.

        Every statement is ``IF NOT EXISTS``, so running this twice, or from two processes at
        once, is harmless. A spans table that exists with another attribute layout is refused
        (``check_spans_layout``) before anything is changed.
        """
        self.check_spans_layout()
        current = self.schema_version()
        for ddl in ddl_files():
            if ddl.version <= current or (upto is not None and ddl.version > upto):
                continue
            for statement in ddl.statements():
                self.command(statement)
            self.command(
                f"INSERT INTO {SCHEMA_VERSION_TABLE} (Version, Name) VALUES "
                f"({ddl.version}, '{ddl.name}')"
            )
            log.info("applied schema %s", ddl.name)
            current = ddl.version
        return current

    def check_spans_layout(self) -> None:
        """Refuse a spans table whose attribute columns are not string maps.

        The OpenTelemetry Collector's ClickHouse exporter can also write attributes as
        ClickHouse ``JSON`` columns (its ``json`` option); latscope reads attributes as
        ``Map(String, String)`` values, and on such a table every lookup would find nothing and
        every request would be attributed wrongly, so it stops with the reason instead.
        """
        rows = self.query_rows(
            "SELECT name, type FROM system.columns WHERE database = currentDatabase() "
            "AND table = {table:String} AND name IN ('SpanAttributes', 'ResourceAttributes')",
            {"table": SPANS_TABLE},
        )
        wrong = [
            f"{name} is {type_}" for name, type_ in sorted(rows) if not _STRING_MAP.match(type_)
        ]
        if wrong:
            raise StoreError(
                f"table {SPANS_TABLE}: {', '.join(wrong)}, but latscope reads span and resource "
                "attributes as Map(String, String) (the OpenTelemetry Collector ClickHouse "
                "exporter's default layout; its json option writes JSON columns instead). Point "
                "latscope at a database without this table, or have the exporter write the map "
                "layout."
            )

    # -- reads and writes ----------------------------------------------------------------------

    def command(self, sql: str, parameters: dict[str, Any] | None = None) -> Any:
        with self._querying() as (client, settings):
            return self._call(client.command, sql, parameters=parameters, settings=settings)

    def query_rows(self, sql: str, parameters: dict[str, Any] | None = None) -> list[tuple]:
        with self._querying() as (client, settings):
            return self._call(
                client.query, sql, parameters=parameters, settings=settings
            ).result_rows

    def query_arrow(self, sql: str, parameters: dict[str, Any] | None = None) -> pa.Table:
        with self._querying() as (client, settings):
            return self._call(client.query_arrow, sql, parameters=parameters, settings=settings)

    def insert_arrow(self, table: str, data: pa.Table, *, dedup_token: str | None = None) -> None:
        """Insert columnar rows; with ``dedup_token`` a repeat of the same insert stores nothing."""
        if self._inserts is not None:
            self._call(self._inserts.insert, table, data, dedup_token)
            return
        settings = {"insert_deduplication_token": dedup_token} if dedup_token else None
        with self._serialised():
            self._call(self.client.insert_arrow, table, data, settings=settings)

    @contextlib.contextmanager
    def _querying(self) -> Iterator[tuple[Any, dict[str, Any] | None]]:
        """A client for one query, and the settings to send with it."""
        if self._connect is None:
            with self._serialised():
                yield self.client, self._limits
            return
        if self.background_priority and getattr(self._local, "background", False):
            handle = self._take_background_handle()
            try:
                yield handle, None
            finally:
                _restore_priorities()
                self._background_idle.put(handle)
            return
        handle = self._take_handle()
        try:
            yield handle, None
        finally:
            self._idle.put(handle)

    def _take_background_handle(self) -> Any:
        """A handle whose queries run at background priority: one per thread working in
        ``background`` at once (the attributor's and the rollup builder's)."""
        try:
            return self._background_idle.get_nowait()
        except queue.Empty:
            pass
        handle = self._open_handle(f"SET os_thread_priority = {BACKGROUND_NICE}")
        with self._pool_lock:
            self._background_handles.append(handle)
        return handle

    def _open_handle(self, *commands: str) -> Any:
        """A new handle on the embedded engine, with the time limit SET, then ``commands``."""
        assert self._connect is not None
        try:
            handle = self._connect()
            handle.command(f"SET max_execution_time = {self._limits['max_execution_time']}")
            for command in commands:
                handle.command(command)
        except Exception as exc:
            raise StoreUnavailable(_scrub(f"cannot open a query handle: {exc}", self.dsn)) from exc
        return handle

    def _take_handle(self) -> Any:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        with self._pool_lock:
            grow = len(self._handles) < QUERY_HANDLES
            if grow:
                self._handles.append(None)  # the slot is taken while the handle opens
        if not grow:
            return self._idle.get()
        try:
            handle = self._open_handle()
        except StoreUnavailable:
            with self._pool_lock:
                self._handles.remove(None)
            raise
        with self._pool_lock:
            self._handles[self._handles.index(None)] = handle
        return handle

    def ping(self) -> bool:
        try:
            return self.query_rows("SELECT 1")[0][0] == 1
        except StoreError:
            return False

    def close(self) -> None:
        with self._pool_lock:
            handles, self._handles = [h for h in self._handles if h is not None], []
            handles += self._background_handles
            self._background_handles = []
        if self._inserts is not None:
            handles.append(self._inserts)
        for client in [*handles, self.client]:
            try:
                if client is not None:
                    client.close()
            except Exception:  # closing a client that already failed is not worth an error
                log.debug("store close failed", exc_info=True)

    @contextlib.contextmanager
    def _serialised(self) -> Iterator[None]:
        if self._lock is None:
            yield
            return
        with self._lock:
            yield

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            # A driver's message may quote the URL it used; the password never leaves here.
            message = _scrub(str(exc), self.dsn)
            if _is_unavailable(exc):
                raise StoreUnavailable(message) from exc
            if "MEMORY_LIMIT_EXCEEDED" in message:
                raise StoreOutOfMemory(message) from exc
            if "TOO_MANY_ROWS_OR_BYTES" in message:
                raise StoreResultTooLarge(message) from exc
            raise StoreError(message) from exc


class _EmbeddedInserts:
    """Inserts into the embedded engine through a chDB handle of their own, one at a time.

    The engine reads the Arrow table where it lies (chDB's ``Python()`` table function): no
    Arrow IPC stream is written, copied into Python bytes, written to a temporary file and
    parsed back, which is what clickhouse-connect's embedded ``insert_arrow`` does (and a
    process killed during such an insert left its file in the system's temporary directory).
    ``bench.ingest.run --compare`` measures both (variant ``via-file``); the rows stored are the
    same (tests/test_store_inserts.py). Columns are matched by name, as in clickhouse-connect's
    insert; a dictionary column of maps, which ``Python()`` cannot read, is expanded first.
    """

    def __init__(self, path: str) -> None:
        #: Settings of every insert. One thread: on the engine's default of a thread a core, an
        #: insert of 500 spans costs about 20 ms more CPU (53 against 31 ms), one of 20,000
        #: about the same (``bench.ingest.inserts``).
        self.settings = {"max_threads": "1"}
        self._path = path
        self._conn: Any = None
        self._lock = threading.Lock()

    def insert(self, table: str, data: pa.Table, dedup_token: str | None) -> None:
        columns = ", ".join(_quote_identifier(name) for name in data.column_names)
        chosen = dict(self.settings)
        if dedup_token:
            chosen["insert_deduplication_token"] = _quote_string(dedup_token)
        settings = (
            " SETTINGS " + ", ".join(f"{k} = {v}" for k, v in chosen.items()) if chosen else ""
        )
        latscope_insert_rows = _readable(data)  # noqa: F841 (read by name by Python() below)
        sql = (
            f"INSERT INTO {table} ({columns}){settings} SELECT * FROM Python(latscope_insert_rows)"
        )
        with self._lock:
            if self._conn is None:
                import chdb

                # Another handle on the engine the store's client started (same path).
                self._conn = chdb.connect(self._path)
            self._conn.query(sql)

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def _readable(data: pa.Table) -> pa.Table:
    """``data`` with each dictionary column of non-string values expanded (``Python()`` reads
    dictionaries of strings, not of maps)."""
    for i, field in enumerate(data.schema):
        if pa.types.is_dictionary(field.type) and not pa.types.is_string(field.type.value_type):
            column = data.column(i)
            values = pa.chunked_array(
                [pc.take(chunk.dictionary, chunk.indices) for chunk in column.chunks],
                field.type.value_type,
            )
            data = data.set_column(i, field.name, values)
    return data


def _quote_identifier(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def _quote_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


#: Query parameters of a server DSN that clickhouse-connect takes as arguments of its own: left in
#: the query, it passes them a second time (a TypeError, "got multiple values for argument").
_CLIENT_ARGUMENTS = ("password", "username", "database", "secure")


def _named_parameters(dsn: str) -> tuple[str, dict[str, str]]:
    """The DSN without the query parameters clickhouse-connect takes as arguments, and those
    parameters; raises ``StoreError`` when one contradicts the DSN's own user info or path.

    >>> _named_parameters("http://latscope@ch:8123/db?password=s3cret&async_insert=1")
    ('http://latscope@ch:8123/db?async_insert=1', {'password': 's3cret'})
    """
    parts = urlsplit(dsn)
    kept, named = [], {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key.lower() in _CLIENT_ARGUMENTS:
            named[key.lower()] = value
        else:
            kept.append((key, value))
    stated = {
        "password": parts.password,
        "username": parts.username,
        "database": parts.path.strip("/").split("/")[0] or None,
    }
    for key, value in named.items():
        if stated.get(key) not in (None, value):
            raise StoreError(
                f"store DSN {redact_dsn(dsn)!r} gives the {key} twice, with two values: keep one "
                f"(http(s)://user:pass@host:8123/db, or ?{key}=...)"
            )
    return urlunsplit(parts._replace(query=urlencode(kept))), named


def _has_session(client: Any) -> bool:
    # clickhouse-connect's HTTP client keeps its session id among the parameters it sends.
    params = getattr(client, "params", None)
    return bool(isinstance(params, dict) and params.get("session_id"))


def _is_unavailable(exc: BaseException) -> bool:
    from clickhouse_connect.driver.exceptions import OperationalError

    return isinstance(exc, (OperationalError, ConnectionError, TimeoutError, OSError))


_SECRET_PARAMS = ("password", "secret", "token", "access_token", "key")
#: Shorter secrets are replaced only where they sit in a URL: replacing every "ab" in a message
#: would make it unreadable and hide nothing a DSN-shaped search would not.
_MIN_BARE_SECRET = 4


def _secrets(dsn: str) -> list[str]:
    """The secret values a DSN carries: its password, and any password-like query parameter."""
    try:
        parts = urlsplit(dsn)
        password = parts.password
        query = parts.query
    except ValueError:  # an unparsable DSN (a bad port) may still carry a password
        password = next((m.group(1) for m in re.finditer(r"://[^:/@]*:([^@/]+)@", dsn)), None)
        query = dsn.partition("?")[2]
    found = [password] if password else []
    found += [v for k, v in parse_qsl(query) if k.lower() in _SECRET_PARAMS and v]
    return found


def _scrub(text: str, dsn: str) -> str:
    """``text`` with every secret of ``dsn`` shown as ``***``."""
    for secret in _secrets(dsn):
        text = text.replace(f":{secret}@", ":***@").replace(f"={secret}", "=***")
        if len(secret) >= _MIN_BARE_SECRET:
            text = text.replace(secret, "***")
    return text


def redact_dsn(dsn: str) -> str:
    """The DSN with its password (and password-like parameters) shown as ``***``.

    >>> redact_dsn("http://latscope:s3cret@ch:8123/latscope")
    'http://latscope:***@ch:8123/latscope'
    """
    return _scrub(dsn, dsn)


def has_cap_sys_nice(pid: int | str = "self") -> bool:
    """Whether process ``pid`` has CAP_SYS_NICE in its effective set (Linux; False elsewhere)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            caps = next((line for line in f if line.startswith("CapEff:")), "CapEff: 0")
    except OSError:
        return False
    return bool(int(caps.split()[1], 16) >> CAP_SYS_NICE & 1)


def _restore_priorities() -> None:
    """Every thread of this process at ``BACKGROUND_NICE`` back to the process's own priority:
    those the engine started during a background call inherited it (a thread working on another
    background call at that moment only loses its low priority for the rest of that call)."""
    own = os.getpriority(os.PRIO_PROCESS, os.getpid())
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                nice = int(f.read().rsplit(")", 1)[1].split()[16])
            if nice == BACKGROUND_NICE != own:
                os.setpriority(os.PRIO_PROCESS, int(tid), own)
        except (OSError, ValueError, IndexError):  # the thread ended meanwhile
            continue
