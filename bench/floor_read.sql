-- The floor of a read: the simplest one, a body by its primary key from bench/fenced_write.sql's
-- table. bench/compare.sh runs it with pgbench beside the service's get.
\set i :n % :per + :client_id * :per
\set n :n + 1
\set key :base_key + :i
SELECT body FROM floor_snapshots WHERE key = :key::text;
