-- The size of each audit log, for the metrics: PostgreSQL's count of live rows (its statistics,
-- updated within about a second of each commit) and the bytes of the table with its indexes and
-- TOAST. Reads the catalogue only, so it costs the same however large the logs grow; no lock.
SELECT relname::text, n_live_tup, pg_total_relation_size(relid)
FROM pg_stat_user_tables
WHERE relname IN ('rejections', 'recoveries') AND schemaname = current_schema()
