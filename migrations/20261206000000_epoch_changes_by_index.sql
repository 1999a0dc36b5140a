-- epoch_changes() reads an epoch's changes by the xid index, never by a scan of change_log.
--
-- Why: its second branch (`xid = ANY(in-progress xids of the epoch before)`) was planned once
-- per connection, while change_log was nearly empty and not yet analysed (a fresh database, the
-- first minute of every instance's life), as a sequential scan; the connection kept that plan,
-- so each relay turn and each reader's epoch read walked the whole table (measured: 1,000+
-- buffers and 7 ms a call after 40,000 changes, a quarter of the put throughput at 32
-- clients). With the setting the planner cannot choose that scan, whatever its statistics say;
-- the function is then planned on its own instead of inlined, which costs ~0.1 ms a call.
ALTER FUNCTION epoch_changes(pg_snapshot, pg_snapshot) SET enable_seqscan = off;
