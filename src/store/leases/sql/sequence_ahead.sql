-- Moves the token sequence past every stored token (after a restore or a reset). Runs after LOCK
-- TABLE leases IN SHARE ROW EXCLUSIVE MODE, which conflicts with every grant's ROW EXCLUSIVE lock,
-- so the maximum is final and setval cannot undo a concurrent grant's token.
SELECT setval('fencing_token_seq', t.m)
FROM (SELECT max(token) AS m FROM leases) t, fencing_token_seq s
WHERE t.m IS NOT NULL AND (t.m > s.last_value OR (t.m = s.last_value AND NOT s.is_called))
