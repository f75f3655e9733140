"""The commands that run latscope's processes (``serve``, ``collector``, ``api``): their flags,
one per ``Settings`` field, read as flags > ``LATSCOPE_*`` environment variables > defaults, and
how each starts its process (``process_main``)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from dataclasses import fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from latscope.config import Settings

#: The settings ``latscope api`` reads (it ingests nothing: no collector or attributor flags).
API_SETTINGS = (
    "otlp_grpc", "http", "store", "token_file", "token", "grpc_max_message_bytes",
    "shutdown_grace_s", "log_level", "stall_threshold_ms", "tls_cert", "tls_key", "grpc_workers",
    "slo_objectives", "slo_interval_s", "rules",
)  # fmt: skip

#: How a flag's value is written in --help, as the docs write it.
_METAVARS = {
    "otlp_grpc": "HOST:PORT",
    "http": "HOST:PORT",
    "store": "DSN",
    "token_file": "PATH",
    "token": "TOKEN",
    "tls_cert": "PATH",
    "tls_key": "PATH",
    "spool_dir": "PATH",
    "log_level": "LEVEL",
    "attributor": "on|off",
    "attribution_early_when_quiet": "on|off",
    "attribution_reference_process": "on|off",
}


def _metavar(name: str, default: object) -> str:
    if name in _METAVARS:
        return _METAVARS[name]
    if name.endswith("_ms"):
        return "MS"
    if name.endswith("_s"):
        return "SECONDS"
    if name.endswith("_bytes"):
        return "BYTES"
    return "N" if isinstance(default, int | float) else name.upper()


def add_settings_flags(parser: argparse.ArgumentParser, only: tuple[str, ...] = ()) -> None:
    """One flag per ``Settings`` field (or per field in ``only``); unset flags stay None so
    environment variables and defaults apply."""
    from latscope.config import Settings

    for f in fields(Settings):
        if only and f.name not in only:
            continue
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            type=type(f.default),
            default=None,
            metavar=_metavar(f.name, f.default),
            help=f"{f.metadata.get('help', '')} [env {Settings.env_name(f.name)}, "
            f"default {f.default!r}]",
        )


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from flags > ``LATSCOPE_*`` > defaults; raises ConfigError with a fix."""
    from latscope.config import Settings

    return Settings.from_env(**{f.name: getattr(args, f.name, None) for f in fields(Settings)})


def process_main(
    args: argparse.Namespace,
    run: Callable[[Settings], int],
    *,
    prefix: str = "latscope",
) -> int:
    """A process command's ``main``: the settings the flags give (their log level set), the
    ``--rules`` rulebook put in force, then ``run(settings)`` until it
    stops; a port or a store that fails becomes one line on stderr, after ``prefix``, and exit
    code 1."""
    from latscope.serve import install_rulebook
    from latscope.storage import StoreError

    settings = settings_from_args(args)
    logging.getLogger().setLevel(settings.log_level.upper())
    install_rulebook(settings)
    try:
        return run(settings)
    except (OSError, StoreError) as exc:
        print(f"{prefix}: {exc}", file=sys.stderr)
        return 1
