-- How many keys have an open recovery record now, for the metrics gauge: also one kept by a
-- reconciling lease that is still live (it blocks the next grant after that lease, v1.2). The
-- first predicate is implied by the second (see key_recovery_reason); it is spelled out so that
-- the planner reads only the rows of the partial index leases_recovery_candidates, and the clock
-- decides among those. No parameters; no lock.
SELECT count(*) FROM leases l
WHERE (l.end_reason = 'abandoned' OR l.recovery_required OR l.crash_recovery
        OR l.kept_reason IS NOT NULL)
  AND key_recovery_reason(l.kept_reason, l.end_reason, l.expires_at, l.crash_recovery,
                          l.recovery_required, now()) IS NOT NULL
