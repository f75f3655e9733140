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
``selection``             which requests are "inside" for ``why``, and the SQL of one such question
``coldstart``             replicas that just appeared and their warm-up requests
``groups``                the one ``group_by`` rule
``figures``               percentile levels, the stats SQL and its JSON shape
``window``                reading a window: rollup hours, raw ranges, with FINAL or not
``common``                the table, filters and parameters every answer shares; ns -> ms
``errors``                the answers' errors
``models``                the answers as typed models, one module per family
========================  ======================================================================

Every answer runs SQL in the store (nothing is pulled row by row into Python), binds every value
as a query parameter, renders SQL text only from named fragments (``latscope.sqltext``), and
returns its typed model (``models``), window included, with times in milliseconds: the model the
REST API serves, gRPC converts and the CLI renders. Count limits are held to their bounds here
(``MAX_*``), once. Callers import the public functions from
``latscope.attribution.aggregates``.
"""
