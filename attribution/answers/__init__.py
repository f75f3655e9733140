"""The questions on-call asks about many requests, answered by ClickHouse over the attribution
table: one module per question, and the small modules they share.

========================  ======================================================================
``summary``               the latency budget: percentiles, means and shares per bucket, groups
``tail``                  where the slowest requests spend their extra time
``compare``               two windows bucket by bucket, and the bucket that moved
``diagnose``              the usual cause and first fixes (the rulebook: named thresholds)
``slo``                   objectives: error budget, burn rates, alerts, where the budget went
``listings``              the slowest requests, the services seen, GPU figures per phase
``standing``              one request's percentile rank among its peers of the last hour
``timeseries``            every figure per time step, and the latency heatmap
``dimensions``            what is different about a selection of requests (``why``)
``coldstart``             replicas that just appeared and their warm-up requests
``groups``                the one ``group_by`` rule
``figures``               percentile levels, the stats SQL and its JSON shape
``window``                reading a window: rollup hours, raw ranges, with FINAL or not
``common``                the table, filters and parameters every answer shares; ns -> ms
``errors``                the answers' errors
========================  ======================================================================

Every answer runs SQL in the store (nothing is pulled row by row into Python), binds every value
as a query parameter, renders SQL text only from named fragments (``latscope.sqltext``), and
returns a JSON-ready dict with times in milliseconds. Callers import the public functions from
``latscope.attribution.aggregates``.
"""
