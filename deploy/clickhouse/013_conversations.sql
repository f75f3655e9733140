-- Conversations across traces. An agent's session often spans many traces (one per turn, or
-- split where the context was not propagated); the spans name it in an attribute:
-- gen_ai.conversation.id (the GenAI convention; traceloop-sdk's set_conversation_id), else
-- OpenInference's session.id (using_session), else traceloop's association property
-- traceloop.association.properties.session_id (latscope.semconv.CONVERSATION_KEYS, in this
-- order; a test holds the two equal).
--
-- ClickHouse computes the id once per span as it is stored (most spans have none: an empty
-- string, which costs next to nothing compressed), and a bloom filter lets "the traces of this
-- conversation" skip every granule without it, as idx_trace_id does for a trace id (009), over
-- the whole retention and without a time range. A conversation's turns are then
-- `SELECT TraceId ... WHERE LatscopeConversationId = {id} GROUP BY TraceId`, and the
-- conversations of a window one GROUP BY over that window's column
-- (latscope.attribution.conversations).
--
-- Parts stored before this file compute the column when they are read and get the filter from
-- MATERIALIZE INDEX, a mutation that runs in the background.
ALTER TABLE otel_traces
    ADD COLUMN IF NOT EXISTS LatscopeConversationId String MATERIALIZED multiIf(
        SpanAttributes['gen_ai.conversation.id'] != '', SpanAttributes['gen_ai.conversation.id'],
        SpanAttributes['session.id'] != '', SpanAttributes['session.id'],
        SpanAttributes['traceloop.association.properties.session_id']) CODEC(ZSTD(1));

ALTER TABLE otel_traces
    ADD INDEX IF NOT EXISTS idx_conversation LatscopeConversationId TYPE bloom_filter(0.001)
    GRANULARITY 1;

ALTER TABLE otel_traces MATERIALIZE INDEX idx_conversation;
