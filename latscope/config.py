"""Settings of the latscope processes, parsed in one place: flag > ``LATSCOPE_*`` > default."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

from latscope.auth import TokenFileError, read_token_file
from latscope.storage import DEFAULT_QUERY_TIMEOUT_S, DEFAULT_STORE, ENGINE_MEMORY_SHARE

#: ``--max-trace-spans``: the most spans of one trace the API answers (latscope.api.trace), and
#: of one too wide for the attributor's SQL that its reference engine attributes.
DEFAULT_MAX_TRACE_SPANS = 50_000

if TYPE_CHECKING:
    from latscope.attribution.rules import Rulebook

#: ``--attribution-reach-s``: how far from the spans that bring a trace to an attribution pass
#: its other spans may start. A pass reads the spans that start from this long before the first
#: start to this long after the last end of its slice's spans. Two hours cover hour-long streams
#: and any clock skew latscope corrects. Not more, because a pass reads the TraceId of every span
#: stored in that range, of its batch's traces or not (their random ids are spread over every
#: granule of the hours they fall in): with a day of reach that read grows with the day's
#: traffic and dominates each pass (docs/benchmarks.md, "Attribution with stored history").
DEFAULT_REACH_S = 2 * 3600.0
#: A batch's bounds: at most this many traces, and fewer than this many spans before its last
#: trace (the attributor's ``plan``). A statement's memory follows its spans, about 1 KB each
#: on the attribution benchmark's 7-span requests: 100,000 such requests are 700,000
#: spans, a statement of ~0.65 GB, and no batch passes ~1 GB whatever its traces' sizes (a
#: backlog of 200-span agent traces goes 5,000 traces a batch, where a bound on traces alone
#: would let 50,000 of them, 10 M spans, into one statement). Bigger batches spread the fixed
#: cost of a statement (its analysis and planning, the batch's set, the insert) over more
#: requests: the attributor alone over 200,000 requests costs about 0.9 of the CPU in 2 batches
#: that it costs in 4, 50,000 each.
DEFAULT_BATCH_TRACES = 100_000
DEFAULT_BATCH_SPANS = 1_000_000
#: ``--attribution-reference-spans``: a trace with at least this many spans (of those a pass
#: reads, within its reach) is attributed by the reference engine in Python instead of the
#: attributor's general SQL path, which holds a trace's arrays in lambdas that copy them per
#: element: its memory grows with the square of a trace's spans (a 4,801-span trace is refused
#: under the embedded engine's default limit), and about a thousand spans is where the two cost
#: alike (docs/attribution.md, "Wide traces").
DEFAULT_REFERENCE_SPANS = 1_000
#: Upper bounds of the two: the plan weighs traces in their product (UInt64).
MAX_BATCH_TRACES = 10_000_000
MAX_BATCH_SPANS = 1_000_000_000


#: What ``latscope serve`` holds beside what ``--memory-limit-bytes`` governs: Python and its
#: modules, the embedded ClickHouse's code (0.37 GiB of its library mapped in), the insert's
#: copies past the limit (a slice and a segment read back from the spool), the allocators' slack
#: (freed memory they keep, largest while senders press serve past its limit and it refuses
#: Exports; the collector has the engine's and the C heap's returned then, WriterConfig's
#: ``purge_after_insert``), and the Exports gRPC has received before they are counted or refused
#: (those its handler threads read: ``latscope.serve.grpc_options`` keeps it from receiving the
#: waiting ones whole). ``bench/memory`` has seen peaks of 1,488-1,955 MiB with the defaults,
#: Exports of up to 16 MB and 8-96 senders. ``memory_bound_bytes`` adds the rest.
PROCESS_MEMORY_BYTES = 1000 * 1024**2


def memory_bound_bytes(memory_limit_bytes: int) -> int:
    """The most ``latscope serve`` on an embedded store holds (its RSS), for a memory setting:
    the process's own, the limit itself (Exports), and the embedded ClickHouse's limit
    (``ENGINE_MEMORY_SHARE`` times it). docs/deploy.md states it; ``bench/memory`` and
    ``tests/test_serve_memory.py`` hold it.

    >>> memory_bound_bytes(256 * 1024**2) // 1024**2
    2024
    """
    return PROCESS_MEMORY_BYTES + (1 + ENGINE_MEMORY_SHARE) * memory_limit_bytes


class ConfigError(ValueError):
    """A setting has a value latscope cannot use; the message says which and what to write."""


def parse_hostport(value: str, *, name: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) -> (host, port); port 0 means pick a free one."""
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"{name}: expected HOST:PORT (e.g. 127.0.0.1:4317), got {value!r}")
    host = host.strip("[]")
    try:
        number = int(port)
    except ValueError:
        raise ConfigError(f"{name}: port must be a number, got {port!r}") from None
    if not 0 <= number <= 65535:
        raise ConfigError(f"{name}: port must be 0-65535, got {number}")
    return host, number


@dataclass
class Settings:
    """Every setting of ``latscope serve`` / ``collector`` / ``api``.

    Each field has a flag (``--otlp-grpc``) and an environment variable (``LATSCOPE_OTLP_GRPC``);
    the field's metadata names them.
    """

    otlp_grpc: str = field(default="127.0.0.1:4317", metadata={"help": "OTLP/gRPC listen address"})
    http: str = field(
        default="127.0.0.1:8080", metadata={"help": "HTTP listen address (REST API, OTLP/HTTP)"}
    )
    store: str = field(
        default=DEFAULT_STORE, metadata={"help": "chdb:///dir (embedded) or http(s)://... server"}
    )
    token_file: str = field(
        default="", metadata={"help": "file holding the bearer token (LATSCOPE_TOKEN sets it too)"}
    )
    token: str = field(default="", metadata={"help": "bearer token; prefer --token-file"})
    grpc_max_message_bytes: int = field(
        default=16 * 1024 * 1024, metadata={"help": "largest OTLP/gRPC message accepted"}
    )
    shutdown_grace_s: float = field(
        default=10.0, metadata={"help": "seconds to finish in-flight work on SIGTERM"}
    )
    log_level: str = field(default="info", metadata={"help": "debug, info, warning or error"})
    attributor: str = field(
        default="on",
        metadata={
            "help": "run the continuous attributor in this process: on or off "
            "(with several collectors on one ClickHouse, keep it on in one)"
        },
    )
    attribution_settle_s: float = field(
        default=5.0,
        metadata={"help": "seconds a trace must go without new spans before it is attributed"},
    )
    attribution_complete_s: float = field(
        default=0.0,
        metadata={
            "help": "early attribution: a trace whose span tree is complete (a root, every "
            "parent stored, every client span with a child) is attributed once it has gone this "
            "long without new spans, before its settle window ends (0: off; costs CPU, see "
            "docs/attribution.md)"
        },
    )
    attribution_early_when_quiet: str = field(
        default="on",
        metadata={
            "help": "on or off: when ingest has paused (no span for --attribution-poll-s, or "
            "for 0.5 s after a burst of 100,000 spans or more), a pass "
            "attributes the complete traces at once instead of a settle window after their last "
            "span, as early attribution does (its CPU cost falls on idle time then)"
        },
    )
    attribution_poll_s: float = field(
        default=1.0, metadata={"help": "seconds between the attributor's passes"}
    )
    attribution_reach_s: float = field(
        default=DEFAULT_REACH_S,
        metadata={
            "help": "how far (seconds) the spans of a trace may start from the first start and "
            "last end of the spans that bring it to a pass; longer costs every pass a read of "
            "the spans stored in that range (docs/attribution.md)"
        },
    )
    attribution_batch_traces: int = field(
        default=DEFAULT_BATCH_TRACES,
        metadata={"help": "most traces one attribution statement takes"},
    )
    attribution_batch_spans: int = field(
        default=DEFAULT_BATCH_SPANS,
        metadata={
            "help": "most spans one attribution statement takes before its last trace (its "
            "memory follows them: about 1 KB a span)"
        },
    )
    attribution_reference_spans: int = field(
        default=DEFAULT_REFERENCE_SPANS,
        metadata={
            "help": "a trace with this many spans or more is attributed by the reference "
            "engine in Python, not the SQL, whose memory grows with the square of a trace's "
            "spans (up to --max-trace-spans; docs/attribution.md)"
        },
    )
    attribution_reference_process: str = field(
        default="on",
        metadata={
            "help": "on or off: the reference engine works in a process of its own (started at "
            "the first trace it takes, ended after 60 s without one), so its Python work does "
            "not hold this process's GIL against ingest; off: in the attributor's thread"
        },
    )
    attributor_shard: str = field(
        default="0/1",
        metadata={
            "help": "I/N: attribute only the traces with cityHash64(TraceId) %% N = I, so N "
            "attributors split one store (on a cluster: one per shard, see docs/deploy.md)"
        },
    )
    attributor_tables: str = field(
        default="shared",
        metadata={
            "help": "shared, or local: read and write the *_local tables of this cluster node's "
            "shard (with --attributor-shard I/N on shard I's node)"
        },
    )
    stall_threshold_ms: float = field(
        default=250.0, metadata={"help": "a gap between two streamed tokens above this is a stall"}
    )
    warmup_requests: int = field(
        default=10,
        metadata={"help": "a new replica is warming up for its first N requests (0: off)"},
    )
    warmup_s: float = field(
        default=60.0,
        metadata={"help": "...and for its first S seconds (0: off); see docs/attribution.md"},
    )
    tls_cert: str = field(
        default="", metadata={"help": "PEM certificate: serve OTLP/gRPC and HTTP over TLS"}
    )
    tls_key: str = field(default="", metadata={"help": "PEM private key for --tls-cert"})
    grpc_workers: int = field(
        default=32, metadata={"help": "OTLP/gRPC handler threads (Exports waiting on a batch)"}
    )
    queue_max_spans: int = field(
        default=200_000, metadata={"help": "spans queued in memory before RESOURCE_EXHAUSTED"}
    )
    batch_max_spans: int = field(
        default=40_000, metadata={"help": "flush a batch to ClickHouse at this many spans ..."}
    )
    batch_timeout_s: float = field(
        default=0.2, metadata={"help": "... or when its oldest span has waited this long"}
    )
    spool_dir: str = field(
        default="",
        metadata={
            "help": "write-ahead spool for when ClickHouse is down "
            "(default: <store dir>-spool for chdb, ./latscope-spool otherwise)"
        },
    )
    spool_max_bytes: int = field(
        default=1024**3, metadata={"help": "spool size limit; when full, Exports are refused"}
    )
    store_retry_s: float = field(
        default=1.0, metadata={"help": "after a failed insert, spool for this long, then retry"}
    )
    max_span_attributes: int = field(
        default=1024, metadata={"help": "a span with more attributes is rejected"}
    )
    max_attribute_value_bytes: int = field(
        default=64 * 1024, metadata={"help": "a span with a longer attribute value is rejected"}
    )
    memory_limit_bytes: int = field(
        default=256 * 1024**2,
        metadata={
            "help": "memory Exports may hold (received, decoded, waiting for ClickHouse) before "
            "the collector answers RESOURCE_EXHAUSTED / 429; an embedded store's ClickHouse "
            f"may use {ENGINE_MEMORY_SHARE} times this (docs/deploy.md gives the process's bound)"
        },
    )
    slo_objectives: str = field(
        default="",
        metadata={
            "help": "objectives whose burn rates /metrics serves (latscope_slo_burn_rate, for "
            "deploy/prometheus/latscope-slo.rules.yml): comma-separated "
            "METRIC:THRESHOLD_MS:TARGET[:WINDOW_DAYS], each optionally @SERVICE[/MODEL]; "
            "empty: those /v1/slo uses by default; off: none"
        },
    )
    slo_interval_s: float = field(
        default=60.0,
        metadata={"help": "seconds between two evaluations of the burn rates on /metrics"},
    )
    rules: str = field(
        default="",
        metadata={
            "help": "rule files that add or override engine entries of the rulebook (TOML, "
            'docs/attribution.md "Engines"), separated by commas; checked at start; '
            "`latscope rules` prints the rulebook in force"
        },
    )
    query_timeout_s: float = field(
        default=DEFAULT_QUERY_TIMEOUT_S,
        metadata={
            "help": "ClickHouse stops any query or command running longer (seconds); an answer "
            "about one trace worked out in this process stops at it too"
        },
    )
    max_trace_spans: int = field(
        default=DEFAULT_MAX_TRACE_SPANS,
        metadata={
            "help": "a trace with more spans is not answered (422 trace_too_large), nor "
            "attributed when too wide for the attributor's SQL: each is Python work linear in "
            "its spans (0.04-0.15 CPU s per 1,000)"
        },
    )
    http_body_timeout_s: float = field(
        default=30.0,
        metadata={
            "help": "an OTLP/HTTP body must arrive within this many seconds of its headers "
            "(408 otherwise), so a slow sender cannot hold the memory it was granted"
        },
    )
    max_span_age_s: float = field(
        default=7 * 86400.0,
        metadata={
            "help": "a span that started longer ago than this (seconds) is rejected at the "
            "door (OTLP partial success); 0: no limit"
        },
    )
    max_span_future_s: float = field(
        default=3600.0,
        metadata={
            "help": "a span that starts or ends further than this (seconds) past the collector's "
            "clock is rejected at the door (OTLP partial success); 0: no limit"
        },
    )

    @staticmethod
    def env_name(name: str) -> str:
        return "LATSCOPE_" + name.upper()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Defaults, then ``LATSCOPE_*`` from ``env``, then non-None ``overrides`` (flags)."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for f in fields(cls):
            raw = env.get(cls.env_name(f.name))
            if raw is not None and raw != "":
                values[f.name] = _coerce(f.name, raw, type(f.default))
        values.update({k: v for k, v in overrides.items() if v is not None})
        settings = cls(**values)  # type: ignore[arg-type]
        settings.validate()
        return settings

    def rule_files(self) -> list[str]:
        """The ``--rules`` files, in order."""
        return [p.strip() for p in self.rules.split(",") if p.strip()]

    def rulebook(self) -> Rulebook:
        """The shipped rulebook with the ``--rules`` files on top; ConfigError naming each
        problem's file and line."""
        from latscope.attribution.rules import RulebookError, load

        try:
            return load(self.rule_files())
        except RulebookError as exc:
            raise ConfigError("--rules: the rule files are not usable:\n" + str(exc)) from None

    def validate(self) -> None:
        parse_hostport(self.otlp_grpc, name="--otlp-grpc")
        parse_hostport(self.http, name="--http")
        if self.token_file:
            try:
                self.token = read_token_file(self.token_file)
            except TokenFileError as exc:
                raise ConfigError(str(exc)) from None
        if self.grpc_max_message_bytes < 1024:
            raise ConfigError("--grpc-max-message-bytes must be at least 1024")
        if (
            self.attribution_settle_s < 0
            or self.attribution_complete_s < 0
            or self.attribution_poll_s <= 0
        ):
            raise ConfigError(
                "--attribution-settle-s and --attribution-complete-s must be >= 0 and "
                "--attribution-poll-s > 0 (seconds)"
            )
        if self.attribution_complete_s and (
            self.attribution_complete_s >= self.attribution_settle_s
        ):
            raise ConfigError(
                "--attribution-complete-s must be shorter than --attribution-settle-s "
                "(or 0: early attribution off)"
            )
        if not self.attribution_reach_s > 0:
            raise ConfigError("--attribution-reach-s must be positive (seconds)")
        if not 0 < self.attribution_batch_traces <= MAX_BATCH_TRACES:
            raise ConfigError(f"--attribution-batch-traces must be 1-{MAX_BATCH_TRACES:,}")
        if not 0 < self.attribution_batch_spans <= MAX_BATCH_SPANS:
            raise ConfigError(f"--attribution-batch-spans must be 1-{MAX_BATCH_SPANS:,}")
        if self.stall_threshold_ms <= 0:
            raise ConfigError("--stall-threshold-ms must be positive (milliseconds)")
        if (
            self.warmup_requests < 0
            or self.warmup_s < 0
            or not (self.warmup_requests or self.warmup_s)
        ):
            raise ConfigError(
                "--warmup-requests and --warmup-s must be >= 0, and not both 0 (a new replica "
                "warms up for its first N requests or S seconds)"
            )
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("--tls-cert and --tls-key go together: give both or neither")
        for name in ("tls_cert", "tls_key"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise ConfigError(f"--{name.replace('_', '-')}: no such file {path}")
        for name in ("grpc_workers", "queue_max_spans", "batch_max_spans", "spool_max_bytes",
                     "max_span_attributes", "max_attribute_value_bytes",
                     "memory_limit_bytes", "max_trace_spans",
                     "attribution_reference_spans"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
        if self.slo_interval_s < 1:
            raise ConfigError("--slo-interval-s must be at least 1 (seconds)")
        from latscope.api.burn import parse_objectives
        from latscope.api.errors import InvalidParameter

        try:
            parse_objectives(self.slo_objectives)
        except InvalidParameter as exc:
            raise ConfigError(f"--slo-objectives: {exc.detail}") from None
        if self.query_timeout_s < 1:
            raise ConfigError("--query-timeout-s must be at least 1 (seconds)")
        if self.http_body_timeout_s <= 0:
            raise ConfigError("--http-body-timeout-s must be greater than 0 (seconds)")
        if self.max_span_age_s < 0 or self.max_span_future_s < 0:
            raise ConfigError(
                "--max-span-age-s and --max-span-future-s must be >= 0 (seconds; 0: no limit)"
            )
        if self.batch_timeout_s <= 0 or self.store_retry_s <= 0:
            raise ConfigError("--batch-timeout-s and --store-retry-s must be greater than 0")
        parse_shard(self.attributor_shard)
        self.rulebook()
        if self.attributor_tables not in ("shared", "local"):
            raise ConfigError(
                f"--attributor-tables: expected shared or local, got {self.attributor_tables!r}"
            )
        for name in ("attribution_early_when_quiet", "attribution_reference_process", "attributor"):
            if (value := getattr(self, name)) not in ("on", "off"):
                raise ConfigError(f"--{name.replace('_', '-')}: expected on or off, got {value!r}")
        if self.log_level.lower() not in ("debug", "info", "warning", "error"):
            raise ConfigError(
                f"--log-level: expected debug|info|warning|error, got {self.log_level!r}"
            )


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/4"`` -> (2, 4), for ``--attributor-shard``."""
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise ConfigError(f"--attributor-shard: expected I/N such as 0/4, got {text!r}") from None
    if not (count >= 1 and 0 <= index < count):
        raise ConfigError(f"--attributor-shard: expected 0 <= I < N, got {text!r}")
    return index, count


def _coerce(name: str, raw: str, kind: type) -> object:
    try:
        if kind is bool:
            return raw.lower() in ("1", "true", "yes", "on")
        return kind(raw)
    except ValueError:
        raise ConfigError(
            f"{Settings.env_name(name)}: expected a {kind.__name__}, got {raw!r}"
        ) from None
