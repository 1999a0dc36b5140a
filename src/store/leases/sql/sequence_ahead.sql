-- Moves the token sequence past every token already stored (a database restored from an older
-- backup, a sequence reset by hand), returning the new position when it moved. Run after
-- `LOCK TABLE leases IN SHARE ROW EXCLUSIVE MODE` in the same transaction: that lock conflicts
-- with the ROW EXCLUSIVE lock every grant holds from before it draws its token until it commits,
-- so no grant is in flight, the maximum read here is final, and setval cannot move the sequence
-- back past a token a concurrent grant drew. No parameters.
SELECT setval('fencing_token_seq', t.m)
FROM (SELECT max(token) AS m FROM leases) t, fencing_token_seq s
WHERE t.m IS NOT NULL AND (t.m > s.last_value OR (t.m = s.last_value AND NOT s.is_called))
