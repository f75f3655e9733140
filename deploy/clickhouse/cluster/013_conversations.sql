-- GENERATED from ../013_conversations.sql by deploy/clickhouse/cluster/generate.py; do not edit.
-- Replicated local table + Distributed table under the single-node name.

ALTER TABLE latscope.otel_traces_local ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS LatscopeConversationId String MATERIALIZED multiIf(
        SpanAttributes['gen_ai.conversation.id'] != '', SpanAttributes['gen_ai.conversation.id'],
        SpanAttributes['session.id'] != '', SpanAttributes['session.id'],
        SpanAttributes['traceloop.association.properties.session_id']) CODEC(ZSTD(1));

ALTER TABLE latscope.otel_traces ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS LatscopeConversationId String MATERIALIZED multiIf(
        SpanAttributes['gen_ai.conversation.id'] != '', SpanAttributes['gen_ai.conversation.id'],
        SpanAttributes['session.id'] != '', SpanAttributes['session.id'],
        SpanAttributes['traceloop.association.properties.session_id']);

ALTER TABLE latscope.otel_traces_local ON CLUSTER '{cluster}'
    ADD INDEX IF NOT EXISTS idx_conversation LatscopeConversationId TYPE bloom_filter(0.001)
    GRANULARITY 1;

ALTER TABLE latscope.otel_traces_local ON CLUSTER '{cluster}'
    MATERIALIZE INDEX idx_conversation;
