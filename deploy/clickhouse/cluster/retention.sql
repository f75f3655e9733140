-- GENERATED from ../NNN_*.sql by deploy/clickhouse/cluster/generate.py; do not edit.
-- Retention for a single ClickHouse server (the cluster tables carry it in their DDL).
ALTER TABLE otel_traces MODIFY TTL toDateTime(Timestamp) + INTERVAL 30 DAY;
ALTER TABLE latscope_attribution MODIFY TTL toDateTime(Timestamp) + INTERVAL 90 DAY;
ALTER TABLE latscope_metrics MODIFY TTL toDateTime(Timestamp) + INTERVAL 30 DAY;
ALTER TABLE latscope_attribution_hourly MODIFY TTL toDateTime(Timestamp) + INTERVAL 90 DAY;
ALTER TABLE latscope_metrics_histogram MODIFY TTL toDateTime(Timestamp) + INTERVAL 30 DAY;
ALTER TABLE latscope_metrics_exponential_histogram MODIFY TTL toDateTime(Timestamp) + INTERVAL 30 DAY;
ALTER TABLE latscope_resources MODIFY TTL toDateTime(Timestamp) + INTERVAL 30 DAY;
