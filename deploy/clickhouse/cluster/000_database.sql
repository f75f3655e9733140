-- GENERATED from nothing by deploy/clickhouse/cluster/generate.py; do not edit.
-- The database on every node of the cluster.
CREATE DATABASE IF NOT EXISTS latscope ON CLUSTER '{cluster}';
