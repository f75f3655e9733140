-- Stage 0, read by both paths (the general stages and the single-call path): the batch's spans,
-- one row each, with their times, kind and status (older exporters' spellings read as the current
-- ones), and their attributes as codes and values.
--
-- Attributes are read by code ($K_*): LatscopeRuleAttributes (deploy/clickhouse/007) holds the
-- attributes the rules read, keyed by their codes, computed as each span was stored. So the
-- statement reads a handful of values per span instead of all of them, and every lookup compares
-- small integers instead of strings (~10x cheaper than looking each key up).
span_rows AS (
    SELECT
        TraceId AS trace_id,
        SpanId AS span_id,
        ParentSpanId AS parent_id,
        ServiceName AS service,
        toUnixTimestamp64Nano(Timestamp) AS start_ns,
        start_ns + toInt64(Duration) AS end_ns,
        $KIND_CODE AS kind,
        $STATUS AS status,
        ResourceAttributes AS resource,
        -- The resource's id where latscope's collector stored one, else 0
        -- (deploy/clickhouse/012_resource_ids.sql): the single-call path carries it instead of
        -- the attributes when the batch's slice has no span without one.
        LatscopeResourceId AS resource_id,
        SpanName AS name,
        LatscopeRuleAttributes.keys AS codes,
        LatscopeRuleAttributes.values AS vals,
        -- What the rules test on every span, computed as it was stored
        -- (deploy/clickhouse/010_span_facts.sql): its latscope.phase code, the facts of its
        -- attributes, latscope's first-token event on a CLIENT span (its time, as a payload value).
        LatscopePhase AS phase_code,
        LatscopeFacts AS facts,
        LatscopeFirstToken AS first_token_event,
        -- The figures of its token offsets, as latscope's collector stored them; empty from
        -- other writers (deploy/clickhouse/011_token_figures.sql). The single-call path reads
        -- them, the general path the offsets.
        LatscopeTokenFigures AS token_figures,
        -- What the rulebook's engine rules read that has no code (attribution/rules): those
        -- attributes' values by name, and the earliest time of each event the rules name.
        $RULE_VALUES AS rule_vals,
        $RULE_EVENTS AS rule_events,
        -- Its events' names, for a statement that tests which events a span has, not when.
        Events.Name AS event_names
    FROM $SPANS_TABLE
    WHERE TraceId IN (SELECT trace_id FROM batch) AND $SPAN_BOUNDS
)
