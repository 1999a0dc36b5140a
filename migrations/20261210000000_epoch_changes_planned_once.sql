-- epoch_changes() in PL/pgSQL, so that a connection plans its body once and keeps the plan.
--
-- Why: PostgreSQL plans a SQL function's body (one that cannot be inlined, as this one cannot
-- with its own setting) once for every statement that calls it: 0.11-0.13 ms of each relay turn
-- (bench/README.md, seventh and ninth passes), at up to a hundred turns a second. PL/pgSQL
-- keeps a generic plan of its query for the session. The body, its index-only reads and
-- `enable_seqscan = off` (migrations/20261206000000_epoch_changes_by_index.sql) are unchanged;
-- CREATE OR REPLACE keeps the function, so the `changes` view that calls it stays as it is.
CREATE OR REPLACE FUNCTION epoch_changes(after_snap pg_snapshot, snap pg_snapshot)
RETURNS SETOF change_log LANGUAGE plpgsql STABLE SET enable_seqscan = off AS $$
BEGIN
    RETURN QUERY
    SELECT c.* FROM change_log c
    WHERE c.xid >= pg_snapshot_xmax(after_snap) AND c.xid < pg_snapshot_xmax(snap)
        AND pg_visible_in_snapshot(c.xid, snap)
    UNION ALL
    SELECT c.* FROM change_log c
    WHERE c.xid = ANY (ARRAY(SELECT pg_snapshot_xip(after_snap)))
        AND pg_visible_in_snapshot(c.xid, snap);
END
$$;
