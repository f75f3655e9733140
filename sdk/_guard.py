"""The SDK never breaks the app: one internal-error handler for every SDK-internal step.

An ``Exception`` raised by SDK work is counted under its site, logged once (with its traceback)
the first time that site fails, and swallowed, so the app goes on with a no-op in place of what
failed; spans are ended in ``finally`` blocks around such steps, so a fault never leaves one
open. It is logfire's ``HandleInternalErrors``, in two spellings that record alike:

- ``with handle_internal_errors("site"):`` for what runs once or now and then (configure,
  shutdown, flushes, GPU sampling, metric export);
- ``except Exception: fault("site")`` on the request path (spans, phases, tokens, client calls):
  a ``with`` block calls ``__enter__`` and ``__exit__`` each time, about 0.1 µs, and a request
  passes about thirty such steps, while a ``try`` costs nothing until something raises
  (``bench/sdk_overhead``).

``KeyboardInterrupt``, ``SystemExit`` and cancellation are not faults and pass through.
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType

logger = logging.getLogger("latscope.sdk")

_lock = threading.Lock()
_seen: set[str] = set()
#: Internal faults caught since start, by site. Bounded: one key per call site in this package.
faults: dict[str, int] = {}


class handle_internal_errors:
    """Context manager: count, log once and swallow an ``Exception`` raised by SDK internals.

    Instances hold only the site name, so hot paths build theirs once and reuse them (also from
    several threads at once).

    Example::

        _FLUSH = handle_internal_errors("decode.flush")
        with _FLUSH:
            flush_tokens(span)
    """

    __slots__ = ("site",)

    def __init__(self, site: str) -> None:
        self.site = site

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if exc_type is None or not issubclass(exc_type, Exception):
            return False
        _record(self.site, (exc_type, exc, tb))
        return True


def fault(site: str) -> None:
    """Record an internal fault at ``site`` from inside an ``except Exception`` block (logged
    once).

    Example::

        try:
            span.end(end_time=end)
        except Exception:
            fault("span.end")
    """
    _record(site, True)


def _record(site: str, exc_info: object) -> None:
    try:
        with _lock:
            faults[site] = faults.get(site, 0) + 1
            first = site not in _seen
            _seen.add(site)
        if first:
            logger.warning(
                "latscope SDK: internal error in %s; instrumentation skipped, app unaffected "
                "(further errors here are counted, not logged)",
                site,
                exc_info=exc_info,  # type: ignore[arg-type]
            )
    except Exception:  # logging itself failed (closed stream at exit, ...): stay silent
        pass


def reset() -> None:
    with _lock:
        faults.clear()
        _seen.clear()
