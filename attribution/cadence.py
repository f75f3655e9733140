"""When the continuous attributor passes (``latscope.attribution.attributor``): its scheduling
heuristics, apart from the pass itself.

A pass with work costs ClickHouse's analysis of its statements (~1 s of CPU whatever the slice's
size) on top of the work itself, so under load the attributor waits longer between passes and
each takes a bigger slice: after a pass that wrote rows it waits ``BUSY_PAUSE`` times that pass's
duration (at least ``poll_s``, at most ``settle_s``, and no longer than until the newest stored
span has settled); after an idle one, ``poll_s``. When ingest has paused (no span for
``poll_s``), it waits ``poll_s`` at most: the traces left settle one after another, and taking
them as they do leaves a small last pass when the newest settles instead of all of them. During a
long wait it looks (one small query) whether ingest has paused, and if so passes at once: a look
that finds the newest span younger than ``poll_s`` sets the next one for when it will be
``poll_s`` old (at most ``poll_s`` later), so a pause is seen as it reaches ``poll_s``.

A burst's end is seen sooner: while at least ``QUICK_PAUSE_SPANS`` spans wait that no pass has
taken, ingest has paused once the newest is ``QUICK_PAUSE_S`` old. So many spans pay a quiet
pass's fixed cost many times over, and a pass that takes them sooner ends the burst's tail
sooner; a trickle never has that many waiting, and keeps to ``poll_s`` (each pause it saw would
be a pass of a few requests for the same fixed cost).
"""

from __future__ import annotations

#: After a pass that wrote rows, the wait before the next one, in units of that pass's duration
#: (capped by the settle window): under load, passes and their fixed cost come at most every
#: 1 + BUSY_PAUSE pass durations, so most of the attributor's CPU goes to requests.
BUSY_PAUSE = 4.0
#: The shortest wait between passes when settled work is already waiting (traces that settled
#: while the pass ran).
MIN_POLL_S = 0.1
#: Between passes, the next look whether ingest has paused comes this long after the newest
#: span will have gone ``poll_s`` without a newer one (so the look finds it has).
LOOK_LATE_S = 0.01
#: With at least ``QUICK_PAUSE_SPANS`` spans stored that no pass has taken, ingest has paused
#: once the newest is ``QUICK_PAUSE_S`` old (longer than the collector's 0.2 s between inserts of
#: a steady stream). A quiet pass's fixed cost (about 0.3 CPU s) is what attributing 100,000
#: spans costs at 2-3 us a span (docs/benchmarks.md, "Attribution throughput").
QUICK_PAUSE_S = 0.5
QUICK_PAUSE_SPANS = 100_000


def pause_s(idle_poll_s: float, waiting: int) -> float:
    """How long ingest must go without a new span to have paused, with ``waiting`` spans stored
    that no pass has taken."""
    return min(idle_poll_s, QUICK_PAUSE_S) if waiting >= QUICK_PAUSE_SPANS else idle_poll_s


def next_look_s(idle_poll_s: float, quiet_s: float | None, waiting: int) -> float:
    """Seconds to the next look whether ingest has paused, after a look that found the newest
    span ``quiet_s`` old (None: no span after the watermark) and ``waiting`` spans no pass has
    taken: when it will have gone ``pause_s`` without a newer one (a look a poll apart would see
    it up to a poll late)."""
    return pause_s(idle_poll_s, waiting) - (quiet_s or 0.0) + LOOK_LATE_S


def busy_wait_s(
    pass_s: float,
    *,
    idle_poll_s: float,
    busy_poll_max_s: float,
    ready_s: float,
    quiet_s: float | None,
    paused: bool,
    early_next: bool,
) -> float:
    """The wait after a pass that wrote rows and took ``pass_s``: longer than after an idle one,
    so the next pass takes a bigger slice for the same fixed cost; but no longer than until the
    newest span can be taken (``ready_s``, the settle or complete window, after it was stored,
    ``quiet_s`` ago; None: no span after the watermark), since once traffic stops waiting longer
    would not make the slice bigger, only the last requests later. ``paused``: ingest has paused
    (``pause_s``). ``early_next``: a pass that finds ingest paused takes the early window up to
    the newest span (early attribution off, ``early_when_quiet`` on)."""
    busy_s = min(max(idle_poll_s, BUSY_PAUSE * pass_s), busy_poll_max_s)
    if quiet_s is None:
        return busy_s
    busy_s = min(busy_s, max(MIN_POLL_S, ready_s - quiet_s))
    if paused:
        # Ingest paused: what is left settles over the next settle window; a pass every poll
        # takes it as it settles (the CPU is idle meanwhile), so the pass when the newest span
        # settles is small.
        busy_s = min(busy_s, idle_poll_s)
        if early_next:
            # It paused during this pass (which took no early window, or one that ends before
            # the newest span): the next one takes the early window up to the newest span, and
            # waiting would only make it later.
            busy_s = MIN_POLL_S
    return busy_s
