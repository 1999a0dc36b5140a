-- Each audit log's size for the metrics, from the statistics and the catalogue: constant cost, no
-- lock.
SELECT relname::text, n_live_tup, pg_total_relation_size(relid)
FROM pg_stat_user_tables
WHERE relname IN ('rejections', 'recoveries') AND schemaname = current_schema()
