"""ClickHouse DDL for latscope, applied in file order by latscope.storage."""
