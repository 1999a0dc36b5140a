-- The floor of a fenced write: the simplest correct one, hand-written, that a user could run
-- without snapfence (one table of key, token and body; a write lands only if its token is not
-- below the stored one). It has no audit row, no lease check, no versions, no Idempotency-Key:
-- what PostgreSQL does for the bare job, one statement and one commit per write.
-- bench/compare.sh runs it with pgbench beside the service's put; `run` (the run's start in µs)
-- makes every run's tokens higher than the last run's, so every write lands.
\set i :n % :per + :client_id * :per
\set n :n + 1
\set key :base_key + :i
\set token :run + :n
INSERT INTO floor_snapshots (key, token, body) VALUES (:key, :token, :body)
ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, body = EXCLUDED.body
WHERE floor_snapshots.token <= EXCLUDED.token;
