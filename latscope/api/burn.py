"""SLO burn rates on ``/metrics``, for the alerting stack people already run.

``BurnRates`` (a background component of ``latscope serve`` and ``latscope api``) evaluates the
objectives of ``--slo-objectives`` every ``--slo-interval-s`` over the attribution table, as
``/v1/slo`` does, and ``/metrics`` serves the latest evaluation:

* ``latscope_slo_burn_rate{objective, metric, service, model, window}``: the window's bad fraction
  over the error budget (1 - target); no sample while the window holds no request;
* ``latscope_slo_requests{..., window, outcome}``: the window's requests that met (``good``) and
  missed (``bad``) the objective;
* ``latscope_slo_bad_extra_seconds{..., window, bucket}``: where the budget went: the requests
  that missed the objective against those that met it, mean extra time by bucket (they add up to
  the extra end-to-end time);
* ``latscope_slo_evaluation_timestamp_seconds`` and ``latscope_slo_evaluation_failures_total``.

``deploy/prometheus/latscope-slo.rules.yml`` holds the SRE workbook's multi-window,
multi-burn-rate alerts on these (``windows.ALERTS``); its annotations name the bucket with the most
``bad_extra_seconds``.

An objective is ``METRIC:THRESHOLD_MS:TARGET[:WINDOW_DAYS]`` (``/v1/slo``'s), optionally scoped
to a service and model: ``ttft:500:0.99:30@llm-server`` or ``...@llm-server/llama-3-8b`` (the
model after the first ``/``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from latscope.api.errors import InvalidParameter
from latscope.api.queries import DEFAULT_OBJECTIVES, parse_objective
from latscope.attribution import aggregates
from latscope.attribution.answers.slo import SLO_METRICS, Objective, burn_rate
from latscope.metrics import REGISTRY
from latscope.parts import Poller
from latscope.semconv import BUCKETS
from latscope.storage import Store
from latscope.windows import BURN_WINDOWS_S

log = logging.getLogger(__name__)

__all__ = ["BurnRates", "ScopedObjective", "parse_objectives"]

#: ``--slo-objectives`` value that turns the burn-rate metrics off.
OFF = "off"
_LABELS = ["objective", "metric", "service", "model"]

FAILURES = Counter(
    "latscope_slo_evaluation_failures",
    "Burn-rate evaluations that failed (the store down or a fault); the last good one is served",
    registry=REGISTRY,
)


@dataclass(frozen=True)
class ScopedObjective:
    """An objective and the service and model it is on ('': every one)."""

    text: str  #: as the ``objective`` label shows it, e.g. ``ttft:500:0.99:30@llm-server``
    objective: Objective
    service: str = ""
    model: str = ""

    @property
    def labels(self) -> list[str]:
        return [self.text, self.objective.metric, self.service, self.model]


def parse_objectives(text: str) -> list[ScopedObjective]:
    """``--slo-objectives``: comma-separated objectives, each optionally ``@SERVICE[/MODEL]``;
    '' means ``/v1/slo``'s defaults, ``off`` none. Raises ``InvalidParameter`` with a fix.

    >>> [o.text for o in parse_objectives("ttft:500:0.99@llm/llama-3")]
    ['ttft:500:0.99:30@llm/llama-3']
    """
    if text.strip() == OFF:
        return []
    out = []
    for item in [t.strip() for t in text.split(",") if t.strip()] or list(DEFAULT_OBJECTIVES):
        spec, at, scope = item.partition("@")
        service, _, model = scope.partition("/")
        if at and (not service or "@" in scope):
            raise InvalidParameter(
                "invalid_objective",
                f"objective {item!r}: scope it as METRIC:MS:TARGET[:DAYS]@SERVICE[/MODEL]",
            )
        o = parse_objective(spec)
        canonical = f"{o.metric}:{o.threshold_ms:g}:{o.target:g}:{o.window_days:g}"
        out.append(ScopedObjective(canonical + (f"@{scope}" if scope else ""), o, service, model))
    if len({o.text for o in out}) < len(out):
        raise InvalidParameter("invalid_objective", f"an objective is listed twice in {text!r}")
    return out


class BurnRates(Poller, Collector):
    """Evaluates the objectives every ``poll_s`` and serves the latest evaluation as metrics
    (registered with the process's registry while it runs)."""

    name = "slo-burn-rates"

    def __init__(
        self,
        store: Store,
        objectives: Sequence[ScopedObjective],
        *,
        poll_s: float = 60.0,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        super().__init__(poll_s)
        self.store = store
        self.objectives = list(objectives)
        self.clock = clock
        self._lock = threading.Lock()
        self._latest: list[Metric] = []

    def start(self) -> None:
        REGISTRY.register(self)
        super().start()

    def stop(self, deadline: float) -> None:
        super().stop(deadline)
        REGISTRY.unregister(self)

    def failed(self, exc: Exception) -> None:
        FAILURES.inc()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            yield from self._latest

    def run_until_idle(self) -> int:
        """One evaluation of every objective; the metrics serve it from now on."""
        now = self.clock()
        rate = GaugeMetricFamily(
            "latscope_slo_burn_rate",
            "The window's share of requests that missed the objective over its error budget "
            "(1 spends the budget exactly over the objective's window)",
            labels=[*_LABELS, "window"],
        )
        count = GaugeMetricFamily(
            "latscope_slo_requests",
            "Requests in the window that met (good) or missed (bad) the objective",
            labels=[*_LABELS, "window", "outcome"],
        )
        extra = GaugeMetricFamily(
            "latscope_slo_bad_extra_seconds",
            "Where the budget went: mean extra time by bucket of the requests that missed the "
            "objective over those that met it",
            labels=[*_LABELS, "window", "bucket"],
        )
        for scoped in self.objectives:
            self._evaluate(scoped, now, rate, count, extra)
        stamp = GaugeMetricFamily(
            "latscope_slo_evaluation_timestamp_seconds",
            "When the burn rates served were evaluated (Unix time)",
            value=now / 1e9,
        )
        with self._lock:
            self._latest = [rate, count, extra, stamp]
        return 0

    def _evaluate(
        self,
        scoped: ScopedObjective,
        now_ns: int,
        rate: GaugeMetricFamily,
        count: GaugeMetricFamily,
        extra: GaugeMetricFamily,
    ) -> None:
        o = scoped.objective
        spent = aggregates.slo_buckets(
            self.store,
            value_sql=SLO_METRICS[o.metric],
            threshold_ms=o.threshold_ms,
            windows={w: now_ns - s * 10**9 for w, s in BURN_WINDOWS_S.items()},
            until_ns=now_ns,
            service=scoped.service or None,
            model=scoped.model or None,
        )
        for window, figures in spent.items():
            labels = [*scoped.labels, window]
            bad, good = figures.bad, figures.good
            count.add_metric([*labels, "bad"], bad)
            count.add_metric([*labels, "good"], good)
            burn = burn_rate(bad, bad + good, o.target)
            if burn is not None:
                rate.add_metric(labels, burn)
            for bucket in BUCKETS:
                ms = getattr(figures.extra_buckets_ms, bucket)
                if ms is not None:
                    extra.add_metric([*labels, bucket], ms / 1e3)
