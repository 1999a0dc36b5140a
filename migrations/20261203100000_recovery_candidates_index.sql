-- The keys whose newest lease can leave a recovery record: abandoned, marked by require-recovery,
-- or taken with crash_recovery. Whether one of them leaves a record now also depends on the
-- clock (a live lease leaves none yet), which no index can hold; this one keeps the metrics
-- gauge of open recovery records to these few rows instead of a scan of every key per scrape.
CREATE INDEX leases_recovery_candidates ON leases (key)
    WHERE end_reason = 'abandoned' OR recovery_required OR crash_recovery;
