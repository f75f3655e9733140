"""The SDK never breaks the app: internal faults are caught, counted and logged once per site."""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("latscope.sdk")

_lock = threading.Lock()
_seen: set[str] = set()
#: Internal faults caught since start, by site. Bounded: one key per call site in this package.
faults: dict[str, int] = {}


def fault(site: str) -> None:
    """Record an internal fault at ``site``; logs the traceback the first time only.

    Call from an ``except Exception`` block. The app keeps running with a no-op in place of
    what failed (logfire's rule: instrumentation must never raise into the code it observes).
    """
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
                exc_info=True,
            )
    except Exception:  # logging itself failed (closed stream at exit, ...): stay silent
        pass


def reset() -> None:
    with _lock:
        faults.clear()
        _seen.clear()
