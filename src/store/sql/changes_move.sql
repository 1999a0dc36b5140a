-- The relay numbers up to $1 committed inbox rows, in the order they were noted, after the
-- highest id given so far (or after the pruned history, once all of it is gone), and moves them
-- into `changes`. Run by the holder of the relay role, in the transaction that changes_claim.sql
-- began by locking the role's row, so no other transaction numbers between its max(id) and its
-- commit: ids appear in `changes` in increasing order. Returns what the relay needs: the new ids, and the
-- grants' expiry times.
WITH moved AS (
    DELETE FROM change_inbox
    WHERE id IN (SELECT id FROM change_inbox ORDER BY id LIMIT $1)
    RETURNING *),
top AS (
    SELECT coalesce((SELECT max(id) FROM changes), h.pruned_through) AS id
    FROM change_horizon h)
INSERT INTO changes (id, kind, key, token, at, owner, expires_at, version, etag, reason,
    audit_id, operation, highest_token, record_token)
SELECT top.id + row_number() OVER (ORDER BY m.id), m.kind, m.key, m.token, m.at, m.owner,
    m.expires_at, m.version, m.etag, m.reason, m.audit_id, m.operation, m.highest_token,
    m.record_token
FROM moved m CROSS JOIN top
RETURNING id, kind, key, token, expires_at
