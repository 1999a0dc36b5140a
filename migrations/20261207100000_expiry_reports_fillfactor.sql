-- expiry_reports is a row per key, updated in place by every expiry's report (the relay's, or
-- the grant's that replaces an unreported lease: watch/sql/expire.sql, leases/sql/acquire.sql).
-- Half of each page left free keeps those updates HOT (the new version on the same page, no
-- index entry): packed full, as the table was, each one moved its row to another page, with an
-- index insert and a lock record on the old version (4 WAL records instead of 1).
ALTER TABLE expiry_reports SET (fillfactor = 50);
