-- Keys with an open recovery record, for the metrics, including one kept by a live reconciling
-- lease. The first predicate is implied by the second but lets the planner use the partial index
-- leases_recovery_candidates.
SELECT count(*) FROM leases l
WHERE (l.end_reason = 'abandoned' OR l.recovery_required OR l.crash_recovery
        OR l.kept_reason IS NOT NULL)
  AND key_recovery_reason(l.kept_reason, l.end_reason, l.expires_at, l.crash_recovery,
                          l.recovery_required, now()) IS NOT NULL
